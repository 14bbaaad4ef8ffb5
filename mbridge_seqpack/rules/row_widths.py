"""The token widths a training micro batch can take, as Megatron-Bridge's collates make them.

Rules whose failure depends on a token count (a kernel's block size, a router's quantile, a quantizer's block) ask
one question: is every count that can occur a multiple of some ``d``? Every width a collate emits is an integer
combination of a few *generators* (the padding multiple and the cap it is clipped to), so the answer is whether
every generator is. The collates, by dataset kind:

- GPT SFT, offline packs (``data/packing/gpt_sft.py`` collate_fn): one row, ``packed_sequence_size`` wide with
  ``pad_to_max_length``, else min(packed_sequence_size, ceil(row, pad_seq_length_to_mult));
- GPT SFT, unpacked (``data/datasets/gpt_sft.py`` collate_fn): micro-batch rows, all as wide as the longest rounded up
  to pad_seq_length_to_mult (chat: at least 16), at most seq_length; seq_length with ``pad_to_max_length``;
- collate-time in-batch packing (``data/packing/in_batch.py``): one THD row, the sum of the sequences each padded to
  the CP/SP collate multiple (``ConfigContainer.validate`` sets ``in_batch_packing_pad_to_multiple_of`` to it);
- Hugging Face / VLM datasets unpacked (``data/collators/sequence_padding.py``): micro-batch rows min(seq_length,
  ceil(longest, lcm(pad_to_multiple_of, CP/SP multiple))), seq_length with ``pad_to_max_length`` (which validate turns
  on under PP>1 / EP>1);
- pretraining ``GPTDataset``: micro-batch rows of seq_length.

Energon online packing (its task encoder's widths) is not modelled: ``None``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mbridge_seqpack.analysis.topology import round_up
from mbridge_seqpack.errors import Violation
from mbridge_seqpack.rules.context import SPECS, RuleContext

__all__ = ["RowWidths", "row_widths", "width_fix", "row_width_violations"]

GPT_SFT_ROW_MULTIPLE = 16  # GPTSFTDataset(pad_seq_length_to_mult=16)


ROW_MULT = "dataset.dataset_kwargs.pad_seq_length_to_mult"


@dataclass(frozen=True)
class RowWidths:
    """A micro batch holds ``rows`` rows of one width; every width is an integer combination of ``generators``
    (each of which occurs); ``fields`` are the settings that decide them, for a violation to name."""

    rows: int
    generators: tuple[int, ...]
    fields: dict[str, object]
    fixed: bool = False

    def tokens_divisible(self, d: int) -> bool:
        """Whether every micro batch's token count (rows x width) is a multiple of ``d``."""
        return all(self.rows * g % d == 0 for g in self.generators)

    def widths_divisible(self, d: int) -> bool:
        """Whether every row width is a multiple of ``d``."""
        return all(g % d == 0 for g in self.generators)


def _gpt_sft_multiple(ctx: RuleContext) -> int:
    kwargs = getattr(ctx.dataset, "dataset_kwargs", None) or {}
    mult = int(kwargs.get("pad_seq_length_to_mult", GPT_SFT_ROW_MULTIPLE))
    return max(GPT_SFT_ROW_MULTIPLE, mult) if kwargs.get("chat") else mult


def _pad_field(ctx: RuleContext) -> dict[str, object]:
    return {ctx.pad_to_max_length_path: True}


def row_widths(ctx: RuleContext) -> RowWidths | None:
    """The widths of this config's training micro batches, or None where they are not modelled."""
    seq = getattr(ctx.dataset, "seq_length", None) or ctx.model.seq_length
    mbs = ctx.train.micro_batch_size
    if not isinstance(mbs, int) or not isinstance(seq, int):
        return None
    fixed = ctx.fixed_width_rows  # pad_to_max_length as validate() leaves it (on under PP>1 / EP>1)
    if ctx.offline_packing and ctx.specs is not None:
        size = ctx.specs.packed_sequence_size
        if fixed:
            return RowWidths(1, (size,), {f"{SPECS}.packed_sequence_size": size, **_pad_field(ctx)}, fixed=True)
        mult = _gpt_sft_multiple(ctx)
        return RowWidths(1, (mult, size), {f"{SPECS}.packed_sequence_size": size, ROW_MULT: mult})
    if ctx.energon_packing:
        return None
    if ctx.in_batch_packing and getattr(ctx.dataset, "defer_in_batch_packing_to_step", False):
        return None  # the step packs (qwen3_vl_step pads each micro batch itself)
    if ctx.in_batch_packing:
        return RowWidths(1, (ctx.topology.alignment,), {"dataset.enable_in_batch_packing": True})
    if ctx.dataset_is("gpt_sft"):
        if fixed:
            return RowWidths(mbs, (seq,), {"dataset.seq_length": seq, **_pad_field(ctx)}, fixed=True)
        mult = _gpt_sft_multiple(ctx)
        return RowWidths(mbs, (mult, seq), {"dataset.seq_length": seq, ROW_MULT: mult})
    if ctx.has_collate_padding:
        if fixed:
            return RowWidths(mbs, (seq,), {"dataset.seq_length": seq, **_pad_field(ctx)}, fixed=True)
        mult = math.lcm(int(getattr(ctx.dataset, "pad_to_multiple_of", 1) or 1), ctx.topology.alignment)
        return RowWidths(mbs, (mult, seq), {"dataset.seq_length": seq, "dataset.pad_to_multiple_of": mult})
    if ctx.pretraining_dataset:
        return RowWidths(mbs, (seq,), {"dataset.seq_length": seq}, fixed=True)
    return None


def width_fix(ctx: RuleContext, fields: dict[str, object], need: int) -> dict[str, object]:
    """Assignments that make every width in ``fields`` a multiple of ``need``: padding multiples to an lcm, sizes
    rounded up (keeping the power-of-two alignment they had, which the CP / TP / FP8 multiples ask for)."""
    fix: dict[str, object] = {}
    for path, value in fields.items():
        if not isinstance(value, int) or isinstance(value, bool) or value % need == 0:
            continue
        if path in (ROW_MULT, "dataset.pad_to_multiple_of"):
            fix[path] = math.lcm(value, need)
        elif path in (f"{SPECS}.packed_sequence_size", "dataset.seq_length"):
            size = round_up(value, math.lcm(need, math.gcd(value, 128)))
            fix.update({path: size, "model.seq_length": size})
            if path != "dataset.seq_length" and hasattr(ctx.dataset, "seq_length"):
                fix["dataset.seq_length"] = size
    return fix


def _alignment_fields(ctx: RuleContext, *, with_tp: bool = True) -> dict[str, object]:
    topo = ctx.topology
    fields: dict[str, object] = {"model.context_parallel_size": topo.cp}
    if with_tp:
        fields["model.tensor_model_parallel_size"] = topo.tp
        fields["model.sequence_parallel"] = topo.sequence_parallel
    return fields


def _pad_seq_length_to_mult(ctx: RuleContext) -> int:
    """The variable-width row multiple of GPT SFT's packed collate (``dataset_kwargs``, default 16)."""
    kwargs = getattr(ctx.dataset, "dataset_kwargs", None) or {}
    return int(kwargs.get("pad_seq_length_to_mult", GPT_SFT_ROW_MULTIPLE))


def row_width_violations(ctx: RuleContext, need: int, why: str) -> list[Violation]:
    """Packed rows whose width is not a multiple of ``need``: fixed-width rows are packed_sequence_size wide,
    variable-width rows min(packed_sequence_size, the longest row rounded up to pad_seq_length_to_mult)."""
    size = ctx.specs.packed_sequence_size
    fix: dict[str, object] = {}
    fields: dict[str, object] = {f"{SPECS}.packed_sequence_size": size}
    if size % need:
        new = round_up(size, need)
        fix.update({f"{SPECS}.packed_sequence_size": new, "model.seq_length": new})
        if hasattr(ctx.dataset, "seq_length"):
            fix["dataset.seq_length"] = new
    if not ctx.pad_to_max_length:
        mult = _pad_seq_length_to_mult(ctx)
        if mult % need:
            fields[ROW_MULT] = mult
            fix[ROW_MULT] = math.lcm(mult, need)
    if not fix:
        return []
    width = (
        "packed_sequence_size"
        if ctx.pad_to_max_length
        else ("min(packed_sequence_size, longest row rounded up to pad_seq_length_to_mult)")
    )
    return [
        Violation(
            {**fields, ctx.pad_to_max_length_path: ctx.pad_to_max_length, **_alignment_fields(ctx)},
            f"each packed row ({width} tokens wide) {why}, so its width must be a multiple of {need}",
            assignments=fix,
        )
    ]
