"""``derive(cfg)``: recompute every field that follows from topology, sequence length and packing mode.

Idempotent, and run by ``apply()`` after the mixins' facts are written, so the result does not depend on mixin
order. ``dataset.seq_length`` owns the length (as Megatron-Bridge's recipe runner syncs ``model.seq_length``
from it); multiples are combined by lcm, so a user's stricter value is kept.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from mbridge_seqpack.config_paths import set_path

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["derive", "ensure_specs", "DERIVED_PATHS"]

#: every field ``derive`` may set (the NeMo-Run plugin passes those that change as overrides)
DERIVED_PATHS = (
    "model.seq_length",
    "dataset.seq_length",
    "train.micro_batch_size",
    "dataset.pad_to_max_length",
    "dataset.offline_packing_specs.packed_sequence_size",
    "dataset.offline_packing_specs.pad_seq_to_mult",
    "dataset.offline_packing_specs.pad_cu_seqlens",
    "dataset.dataset_kwargs.pad_to_max_length",
    "dataset.dataset_kwargs.pad_seq_length_to_mult",
    "model.calculate_per_token_loss",
    "ddp.average_in_collective",
)


def ensure_specs(cfg: ConfigContainer) -> Any:
    if getattr(cfg.dataset, "offline_packing_specs", None) is None:
        from megatron.bridge.data.packing.config import PackedSequenceSpecs

        cfg.dataset.offline_packing_specs = PackedSequenceSpecs(packed_sequence_size=cfg.model.seq_length)
    return cfg.dataset.offline_packing_specs


def _set_fixed_width(ctx: Any) -> None:
    """Turn fixed-width rows on exactly as the rules' fix says (attribute or ``dataset_kwargs`` key)."""
    for path, value in ctx.pad_to_max_length_fix().items():
        set_path(ctx.cfg, path, value)


def _align_variable_rows(ctx: Any) -> None:
    """Variable-width GPT SFT rows are rounded up to ``dataset_kwargs['pad_seq_length_to_mult']``: keep it
    a multiple of the row alignment (CP shards, SP splits) and of what FP8 GEMMs need per shard."""
    from mbridge_seqpack.rules.fp8 import fp8_row_multiple
    from mbridge_seqpack.rules.row_widths import GPT_SFT_ROW_MULTIPLE

    need = math.lcm(ctx.topology.row_alignment, fp8_row_multiple(ctx))
    if ctx.pad_to_max_length or need == 1 or not ctx.dataset_is("gpt_sft"):
        return

    if ctx.cfg.dataset.dataset_kwargs is None:
        ctx.cfg.dataset.dataset_kwargs = {}
    kwargs = ctx.cfg.dataset.dataset_kwargs
    kwargs["pad_seq_length_to_mult"] = math.lcm(kwargs.get("pad_seq_length_to_mult", GPT_SFT_ROW_MULTIPLE), need)


def derive(cfg: ConfigContainer) -> ConfigContainer:
    """Recompute every field that follows from topology, sequence length and packing mode. Idempotent."""
    from mbridge_seqpack.rules.context import RuleContext

    ctx = RuleContext(cfg=cfg, world_size=1)  # world size plays no part in derived fields
    topo = ctx.topology
    if hasattr(cfg.dataset, "seq_length"):  # the owner, as in Megatron-Bridge's recipe runner
        cfg.model.seq_length = cfg.dataset.seq_length
    seq = cfg.model.seq_length

    if ctx.offline_packing:
        specs = ensure_specs(cfg)
        specs.packed_sequence_size = seq
        # keep a user's stricter multiple: lcm(existing, needed), as Megatron-Bridge does for collate padding
        specs.pad_seq_to_mult = math.lcm(specs.pad_seq_to_mult or 1, topo.sequence_alignment)
        cfg.train.micro_batch_size = 1  # global_batch_size then counts packed rows
        if ctx.training_cuda_graphs:
            _set_fixed_width(ctx)
        if ctx.full_iteration_graph:
            specs.pad_cu_seqlens = True  # fixed cu_seqlens length for the static buffers
        if specs.pad_cu_seqlens:
            _set_fixed_width(ctx)
        _align_variable_rows(ctx)

    if topo.cp > 1 and ctx.is_finetuning:
        cfg.model.calculate_per_token_loss = True
        if hasattr(cfg.ddp, "average_in_collective"):
            cfg.ddp.average_in_collective = False

    if ctx.dataset_is("gpt_sft") and (topo.pp > 1 or topo.ep > 1):
        _set_fixed_width(ctx)
    return cfg
