"""Parallel layout arithmetic shared by the rules, the mixins and the planner (no Megatron import)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Topology", "alignment_multiple", "sequence_alignment", "round_up"]


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple


def sequence_alignment(cp_sizes: tuple[int, ...] | list[int]) -> int:
    """Per-sequence multiple THD context parallelism needs: lcm over the CP sizes of (2*CP if CP>1).

    Each packed sequence is split into 2*CP zigzag chunks (TE ``thd_get_partitioned_indices``, used by
    Megatron-Core's ``get_thd_cp_partition_indices``); at CP=1 nothing is split, so any length works.
    """
    return math.lcm(1, *(2 * cp for cp in cp_sizes if cp > 1))


def alignment_multiple(tp: int, cp_sizes: tuple[int, ...] | list[int], sequence_parallel: bool) -> int:
    """Row multiple: lcm over each CP size of (2*CP if CP>1) and (CP*TP if SP and TP>1).

    This is the multiple Megatron-Bridge derives for its collate-time paths (``config.py`` validate); a
    row is split into CP shards, and sequence parallelism splits each shard across TP ranks.
    """
    parts = [1]
    for cp in cp_sizes:
        parts.append(2 * cp if cp > 1 else 1)
        parts.append(cp * tp if sequence_parallel and tp > 1 else 1)
    return math.lcm(*parts)


@dataclass(frozen=True)
class Topology:
    """Model-parallel sizes plus the world size they run on."""

    world_size: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    eval_cp: int | None = None
    sequence_parallel: bool = False

    @property
    def model_parallel(self) -> int:
        """Ranks one model replica spans for dense layers (TP*PP*CP)."""
        return self.tp * self.pp * self.cp

    @property
    def expert_tensor_parallel(self) -> int:
        """Expert TP as it will run: explicit, else 1 with EP>1 (Megatron-Bridge's
        ``_set_moe_expert_tensor_parallel_default``), else TP (Megatron-Core's default)."""
        if self.etp is not None:
            return self.etp
        return 1 if self.ep > 1 else self.tp

    @property
    def expert_model_parallel(self) -> int:
        """Ranks one expert replica spans (ETP*EP*PP); MCore needs the world size divisible by it."""
        return self.expert_tensor_parallel * self.ep * self.pp

    @property
    def smallest_world(self) -> int:
        """The fewest GPUs the layout runs on: divisible by one model replica and by one expert replica."""
        return math.lcm(self.model_parallel, self.expert_model_parallel)

    @property
    def data_parallel(self) -> int | None:
        """DP size as Megatron computes it, or None when the world size does not divide."""
        if self.world_size % self.model_parallel:
            return None
        return self.world_size // self.model_parallel

    @property
    def cp_sizes(self) -> tuple[int, ...]:
        """The train CP size and, when set, the eval CP size (Megatron-Bridge's collate-multiple formula)."""
        return (self.cp,) if self.eval_cp is None else (self.cp, self.eval_cp)

    @property
    def sequence_alignment(self) -> int:
        """Per-sequence multiple for THD under CP; 1 at CP=1. Training CP only: Megatron-Bridge 0.6.2 never
        builds evaluation-time CP groups (``GlobalState._eval_pgs`` stays None), so evaluation runs at it too."""
        return sequence_alignment((self.cp,))

    @property
    def row_alignment(self) -> int:
        """Multiple the whole packed row width needs (CP shards, then SP splits across TP), training CP only."""
        return alignment_multiple(self.tp, (self.cp,), self.sequence_parallel)

    @property
    def alignment(self) -> int:
        """The collate-time padding multiple Megatron-Bridge checks for HF/VLM datasets: its formula takes the
        eval CP too (training/config.py ConfigContainer.validate raises on it)."""
        return alignment_multiple(self.tp, self.cp_sizes, self.sequence_parallel)
