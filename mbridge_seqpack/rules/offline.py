"""Offline (pre-packed, micro batch 1) packing rules: flags, pack size, alignment, sequence lengths."""

from __future__ import annotations

import math

from mbridge_seqpack.errors import Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.topology import round_up

SPECS = "dataset.offline_packing_specs"


@rule("packing.modes_exclusive", "Offline packing and in-batch packing are mutually exclusive.")
def modes_exclusive(ctx: RuleContext) -> list[Violation] | None:
    if not (ctx.offline_packing or ctx.in_batch_packing):
        return None
    if not (ctx.offline_packing and ctx.in_batch_packing):
        return []
    fix = (
        {"dataset.enable_in_batch_packing": False}
        if ctx.train.micro_batch_size == 1
        else {"dataset.enable_offline_packing": False, SPECS: None}
    )
    return [
        Violation(
            "packing.modes_exclusive",
            {"dataset.enable_offline_packing": True, "dataset.enable_in_batch_packing": True},
            "offline packing (micro batch 1, pre-packed rows) and in-batch packing (micro batch > 1, packed at "
            "collate) cannot both be on",
            assignments=fix,
        )
    ]


@rule("offline.specs_required", "enable_offline_packing=True needs dataset.offline_packing_specs.")
def specs_required(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.offline_packing:
        return None
    if ctx.specs is not None:
        return []
    seq = getattr(ctx.dataset, "seq_length", ctx.model.seq_length)
    align = ctx.topology.alignment
    return [
        Violation(
            "offline.specs_required",
            {"dataset.enable_offline_packing": True, SPECS: None},
            "offline packing needs its specs (pack size, alignment, artifact paths)",
            fix=f"cfg.{SPECS} = PackedSequenceSpecs(packed_sequence_size={seq}, pad_seq_to_mult={align})",
        )
    ]


@rule("offline.flag_required", "dataset.offline_packing_specs set needs enable_offline_packing=True.")
def flag_required(ctx: RuleContext) -> list[Violation] | None:
    if ctx.specs is None:
        return None
    if ctx.offline_packing:
        return []
    return [
        Violation(
            "offline.flag_required",
            {"dataset.enable_offline_packing": False, SPECS: type(ctx.specs).__name__},
            "offline packing specs are set but the packing flag is off; the specs would be ignored",
            fix=f"cfg.dataset.enable_offline_packing = True (or cfg.{SPECS} = None to train unpacked)",
        )
    ]


@rule("offline.micro_batch_one", "Offline packing needs train.micro_batch_size == 1.")
def micro_batch_one(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.offline_packing:
        return None
    mbs = ctx.train.micro_batch_size
    if mbs == 1:
        return []
    gbs = ctx.train.global_batch_size
    pack = ctx.specs.packed_sequence_size if ctx.specs is not None else ctx.model.seq_length
    return [
        Violation(
            "offline.micro_batch_one",
            {"train.micro_batch_size": mbs, "train.global_batch_size": gbs},
            "a packed row already holds several sequences; THD layout and CP slicing expect one row per micro "
            "batch",
            fix=(
                f"cfg.train.micro_batch_size = 1 (global_batch_size then counts {gbs} packed rows of {pack}); "
                f"to keep the row count and tokens of one micro batch instead, also set "
                f"cfg.train.global_batch_size = {gbs // mbs} and pack to {pack * mbs} "
                f"(model/dataset seq_length and packed_sequence_size = {pack * mbs})"
            ),
            assignments={"train.micro_batch_size": 1},
        )
    ]


@rule("offline.pack_size_positive", "offline_packing_specs.packed_sequence_size must be > 0.")
def pack_size_positive(ctx: RuleContext) -> list[Violation] | None:
    if ctx.specs is None:
        return None
    size = ctx.specs.packed_sequence_size
    if size > 0:
        return []
    return [
        Violation(
            "offline.pack_size_positive",
            {f"{SPECS}.packed_sequence_size": size},
            "the pack length must be a positive token count (it is the row width)",
            assignments={f"{SPECS}.packed_sequence_size": ctx.model.seq_length},
        )
    ]


@rule(
    "offline.pack_size_matches_seq_length",
    "packed_sequence_size == model.seq_length == dataset.seq_length.",
)
def pack_size_matches_seq_length(ctx: RuleContext) -> list[Violation] | None:
    if ctx.specs is None or ctx.specs.packed_sequence_size <= 0:
        return None
    size = ctx.specs.packed_sequence_size
    model_seq = ctx.model.seq_length
    data_seq = getattr(ctx.dataset, "seq_length", model_seq)
    if size == model_seq == data_seq:
        return []
    return [
        Violation(
            "offline.pack_size_matches_seq_length",
            {f"{SPECS}.packed_sequence_size": size, "model.seq_length": model_seq, "dataset.seq_length": data_seq},
            "rows are packed to packed_sequence_size tokens and the model is built for seq_length; a shorter pack "
            "wastes the window, a longer one overflows it",
            assignments={f"{SPECS}.packed_sequence_size": model_seq, "dataset.seq_length": model_seq},
        )
    ]


@rule("seq_length.model_matches_dataset", "model.seq_length == dataset.seq_length.")
def model_matches_dataset(ctx: RuleContext) -> list[Violation] | None:
    data_seq = getattr(ctx.dataset, "seq_length", None)
    if data_seq is None:
        return None
    if data_seq == ctx.model.seq_length:
        return []
    return [
        Violation(
            "seq_length.model_matches_dataset",
            {"model.seq_length": ctx.model.seq_length, "dataset.seq_length": data_seq},
            "the dataset emits rows of dataset.seq_length tokens; the model (RoPE, CP chunks) is sized for "
            "model.seq_length",
            assignments={"dataset.seq_length": ctx.model.seq_length},
        )
    ]


@rule("offline.max_single_within_pack", "max_single_sequence_length <= packed_sequence_size.")
def max_single_within_pack(ctx: RuleContext) -> list[Violation] | None:
    if ctx.specs is None or ctx.specs.max_single_sequence_length is None:
        return None
    single, size = ctx.specs.max_single_sequence_length, ctx.specs.packed_sequence_size
    if size <= 0 or single <= size:
        return []
    return [
        Violation(
            "offline.max_single_within_pack",
            {f"{SPECS}.max_single_sequence_length": single, f"{SPECS}.packed_sequence_size": size},
            "a single sequence longer than the pack can never be placed in a row",
            assignments={f"{SPECS}.max_single_sequence_length": size},
        )
    ]


def _alignment_fields(ctx: RuleContext) -> dict[str, object]:
    topo = ctx.topology
    fields: dict[str, object] = {
        "model.context_parallel_size": topo.cp,
        "model.tensor_model_parallel_size": topo.tp,
        "model.sequence_parallel": topo.sequence_parallel,
    }
    if topo.eval_cp is not None:
        fields["dist.eval_context_parallel_size"] = topo.eval_cp
    return fields


@rule(
    "offline.alignment_multiple",
    "pad_seq_to_mult must be a multiple of lcm(2*CP if CP>1, CP*TP if SP and TP>1), for train and eval CP.",
)
def alignment_multiple(ctx: RuleContext) -> list[Violation] | None:
    if ctx.specs is None:
        return None
    need = ctx.topology.alignment
    have = ctx.specs.pad_seq_to_mult or 1
    if have % need == 0:
        return []
    return [
        Violation(
            "offline.alignment_multiple",
            {f"{SPECS}.pad_seq_to_mult": ctx.specs.pad_seq_to_mult, **_alignment_fields(ctx)},
            f"each packed sequence must be padded to a multiple of {need} so THD context-parallel partitioning "
            f"(2*CP chunks) and sequence-parallel splits see whole tokens; otherwise tokens are silently dropped",
            assignments={f"{SPECS}.pad_seq_to_mult": math.lcm(have, need)},
        )
    ]


@rule("offline.pack_size_alignment", "packed_sequence_size must be divisible by the THD alignment multiple.")
def pack_size_alignment(ctx: RuleContext) -> list[Violation] | None:
    if ctx.specs is None or ctx.specs.packed_sequence_size <= 0:
        return None
    need = ctx.topology.alignment
    size = ctx.specs.packed_sequence_size
    if size % need == 0:
        return []
    new = round_up(size, need)
    fix = {f"{SPECS}.packed_sequence_size": new, "model.seq_length": new}
    if hasattr(ctx.dataset, "seq_length"):
        fix["dataset.seq_length"] = new
    return [
        Violation(
            "offline.pack_size_alignment",
            {f"{SPECS}.packed_sequence_size": size, **_alignment_fields(ctx)},
            f"a row is a sequence of aligned segments, so its width must be a multiple of {need}",
            assignments=fix,
        )
    ]
