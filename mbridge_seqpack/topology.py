"""Parallel layout arithmetic shared by the rules, the mixins and the planner (no Megatron import)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Topology", "alignment_multiple", "round_up"]


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple


def alignment_multiple(tp: int, cp_sizes: tuple[int, ...] | list[int], sequence_parallel: bool) -> int:
    """Per-sequence alignment THD needs: lcm over each CP size of (2*CP if CP>1) and (CP*TP if SP and TP>1).

    This is the multiple Megatron-Bridge derives for its collate-time paths (``config.py:1213-1231``);
    offline packs must be built with it baked in, or THD+CP silently drops tokens.
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
    def expert_model_parallel(self) -> int:
        """Ranks one expert replica spans (ETP*EP*PP); MCore needs the world size divisible by it."""
        return (self.etp if self.etp is not None else self.tp) * self.ep * self.pp

    @property
    def data_parallel(self) -> int | None:
        """DP size as Megatron computes it, or None when the world size does not divide."""
        if self.world_size % self.model_parallel:
            return None
        return self.world_size // self.model_parallel

    @property
    def cp_sizes(self) -> tuple[int, ...]:
        """The train CP size and, when set, the eval CP size."""
        return (self.cp,) if self.eval_cp is None else (self.cp, self.eval_cp)

    @property
    def alignment(self) -> int:
        """Required per-sequence alignment for THD under this layout (train and eval CP)."""
        return alignment_multiple(self.tp, self.cp_sizes, self.sequence_parallel)
