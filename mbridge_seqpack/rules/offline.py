"""Offline (pre-packed, micro batch 1) packing rules: flags, pack size, alignment, sequence lengths."""

from __future__ import annotations

import difflib
import math

from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import SPECS, RuleContext
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.topology import round_up

ROW_MULT = "dataset.dataset_kwargs.pad_seq_length_to_mult"
GPT_SFT_ROW_MULTIPLE = 16  # GPTSFTDataset(pad_seq_length_to_mult=16), data/datasets/gpt_sft.py


@rule(
    "packing.modes_exclusive",
    "Offline packing and in-batch packing are mutually exclusive.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError 'enable_offline_packing and "
        "enable_in_batch_packing are mutually exclusive.'"
    ),
)
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
            {"dataset.enable_offline_packing": True, "dataset.enable_in_batch_packing": True},
            "offline packing (micro batch 1, pre-packed rows) and in-batch packing (micro batch > 1, packed at "
            "collate) cannot both be on",
            assignments=fix,
        )
    ]


@rule(
    "offline.specs_required",
    "enable_offline_packing=True needs dataset.offline_packing_specs.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError 'offline_packing_specs must be set "
        "when enable_offline_packing=True.'"
    ),
)
def specs_required(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.offline_packing:
        return None
    if ctx.specs is not None:
        return []
    seq = getattr(ctx.dataset, "seq_length", ctx.model.seq_length)
    align = ctx.topology.sequence_alignment
    return [
        Violation(
            {"dataset.enable_offline_packing": True, SPECS: None},
            "offline packing needs its specs (pack size, alignment, artifact paths)",
            fix=f"cfg.{SPECS} = PackedSequenceSpecs(packed_sequence_size={seq}, pad_seq_to_mult={align})",
        )
    ]


@rule(
    "offline.flag_required",
    "dataset.offline_packing_specs set needs enable_offline_packing=True.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError 'enable_offline_packing must be True "
        "when offline_packing_specs is set.'"
    ),
)
def flag_required(ctx: RuleContext) -> list[Violation] | None:
    if ctx.specs is None:
        return None
    if ctx.offline_packing:
        return []
    return [
        Violation(
            {"dataset.enable_offline_packing": False, SPECS: type(ctx.specs).__name__},
            "offline packing specs are set but the packing flag is off; the specs would be ignored",
            fix=f"cfg.dataset.enable_offline_packing = True (or cfg.{SPECS} = None to train unpacked)",
        )
    ]


@rule(
    "offline.micro_batch_one",
    "Offline packing needs train.micro_batch_size == 1.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError 'Micro batch size should be 1 when "
        "training with packed sequence'; training/gpt_step.py also rejects it for THD CP slicing."
    ),
)
def micro_batch_one(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.offline_packing:
        return None
    mbs = ctx.train.micro_batch_size
    if mbs is None:
        return None  # Megatron-Bridge's own "train.micro_batch_size must be set" shows
    if mbs == 1:
        return []
    gbs = ctx.train.global_batch_size
    pack = ctx.specs.packed_sequence_size if ctx.specs is not None else ctx.model.seq_length
    return [
        Violation(
            {"train.micro_batch_size": mbs, "train.global_batch_size": gbs},
            "a packed row already holds several sequences; THD layout and CP slicing expect one row per micro batch",
            fix=(
                f"cfg.train.micro_batch_size = 1 (global_batch_size then counts {gbs} packed rows of {pack}); "
                f"to keep the row count and tokens of one micro batch instead, also set "
                f"cfg.train.global_batch_size = {gbs // mbs if gbs is not None else None} and pack to {pack * mbs} "
                f"(model/dataset seq_length and packed_sequence_size = {pack * mbs})"
            ),
            assignments={"train.micro_batch_size": 1},
        )
    ]


@rule(
    "offline.eval_micro_batch_one",
    "Offline packing needs validation.eval_micro_batch_size == 1 (when set).",
    severity=ERROR,
    evidence=(
        "Megatron-Bridge's validate() (training/config.py) checks only train.micro_batch_size for packing; with "
        "eval_micro_batch_size > 1, data/packing/gpt_sft.py collate_fn stacks packed rows and "
        "training/utils/packed_seq_utils.py get_packed_seq_params raises 'max_seqlen_q must contain exactly one "
        "value' at the first evaluation, after the training steps before it."
    ),
)
def eval_micro_batch_one(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.offline_packing:
        return None
    validation = getattr(ctx.cfg, "validation", None)
    mbs = getattr(validation, "eval_micro_batch_size", None)
    if mbs is None:
        return None  # Megatron-Bridge sets it to train.micro_batch_size
    if mbs == 1:
        return []
    gbs = getattr(validation, "eval_global_batch_size", None)
    fix: dict[str, object] = {"validation.eval_micro_batch_size": 1}
    return [
        Violation(
            {"validation.eval_micro_batch_size": mbs, "validation.eval_global_batch_size": gbs},
            "evaluation reads the same packed rows; a micro batch of several rows gives one max_seqlen per row, "
            "which the packed forward step cannot take",
            assignments=fix,
        )
    ]


@rule(
    "offline.pack_size_positive",
    "offline_packing_specs.packed_sequence_size must be > 0.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError "
        "'offline_packing_specs.packed_sequence_size must be greater than 0.'"
    ),
)
def pack_size_positive(ctx: RuleContext) -> list[Violation] | None:
    if ctx.specs is None:
        return None
    size = ctx.specs.packed_sequence_size
    if size > 0:
        return []
    return [
        Violation(
            {f"{SPECS}.packed_sequence_size": size},
            "the pack length must be a positive token count (it is the row width)",
            assignments={f"{SPECS}.packed_sequence_size": ctx.model.seq_length},
        )
    ]


@rule(
    "offline.pack_size_matches_seq_length",
    "packed_sequence_size == model.seq_length == dataset.seq_length.",
    severity=ADVISORY,
    evidence=(
        "No Megatron code compares packed_sequence_size with seq_length (docs only: 'keep them equal'); "
        "data/builders/gpt_sft.py sizes packed rows by packed_sequence_size, so a shorter pack wastes the "
        "configured window and a longer one runs rows past the length the model (positions, RoPE scaling, "
        "pipeline buffers) was configured for."
    ),
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
            {f"{SPECS}.packed_sequence_size": size, "model.seq_length": model_seq, "dataset.seq_length": data_seq},
            "rows are packed to packed_sequence_size tokens and the model is built for seq_length; a shorter pack "
            "wastes the window, a longer one overflows it",
            assignments={f"{SPECS}.packed_sequence_size": model_seq, "dataset.seq_length": model_seq},
        )
    ]


@rule(
    "seq_length.model_matches_dataset",
    "model.seq_length == dataset.seq_length.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate asserts 'Please ensure sequence length configuration in "
        "model config and dataset config match.'"
    ),
)
def model_matches_dataset(ctx: RuleContext) -> list[Violation] | None:
    data_seq = getattr(ctx.dataset, "seq_length", None)
    if data_seq is None:
        return None
    if data_seq == ctx.model.seq_length:
        return []
    return [
        Violation(
            {"model.seq_length": ctx.model.seq_length, "dataset.seq_length": data_seq},
            "the dataset emits rows of dataset.seq_length tokens; the model (RoPE, CP chunks) is sized for "
            "model.seq_length",
            assignments={"dataset.seq_length": ctx.model.seq_length},
        )
    ]


@rule(
    "offline.max_single_within_pack",
    "max_single_sequence_length <= packed_sequence_size.",
    severity=ERROR,
    evidence=(
        "data/packing/config.py PackedSequenceSpecs.__post_init__ raises ValueError "
        "'max_single_sequence_length cannot exceed packed_sequence_size.' (a later assignment skips that "
        "check, and data/packing/algorithms.py create_packing_strategy cannot place the sequence)."
    ),
)
def max_single_within_pack(ctx: RuleContext) -> list[Violation] | None:
    if ctx.specs is None or ctx.specs.max_single_sequence_length is None:
        return None
    single, size = ctx.specs.max_single_sequence_length, ctx.specs.packed_sequence_size
    if size <= 0 or single <= size:
        return []
    return [
        Violation(
            {f"{SPECS}.max_single_sequence_length": single, f"{SPECS}.packed_sequence_size": size},
            "a single sequence longer than the pack can never be placed in a row",
            assignments={f"{SPECS}.max_single_sequence_length": size},
        )
    ]


def _alignment_fields(ctx: RuleContext, *, with_tp: bool = True) -> dict[str, object]:
    topo = ctx.topology
    fields: dict[str, object] = {"model.context_parallel_size": topo.cp}
    if with_tp:
        fields["model.tensor_model_parallel_size"] = topo.tp
        fields["model.sequence_parallel"] = topo.sequence_parallel
    return fields


@rule(
    "offline.alignment_multiple",
    "With CP>1, pad_seq_to_mult must be a multiple of 2*CP.",
    severity=ERROR,
    evidence=(
        "megatron/core/utils.py get_thd_cp_partition_indices (used by training/gpt_step.py "
        "_partition_packed_batch_for_cp) calls TE thd_get_partitioned_indices, which requires every sequence "
        "length in cu_seqlens_padded divisible by 2*CP and otherwise drops tokens (TE #1930, Megatron-LM "
        "#1669); the split needs a GPU, so it is cited, not run."
    ),
)
def alignment_multiple(ctx: RuleContext) -> list[Violation] | None:
    need = ctx.topology.sequence_alignment
    if ctx.specs is None or need == 1:
        return None
    have = ctx.specs.pad_seq_to_mult or 1
    if have % need == 0:
        return []
    return [
        Violation(
            {f"{SPECS}.pad_seq_to_mult": ctx.specs.pad_seq_to_mult, **_alignment_fields(ctx, with_tp=False)},
            f"THD context parallelism splits every packed sequence into 2*CP chunks, so each sequence must be "
            f"padded to a multiple of {need}; otherwise the split rounds lengths down and drops tokens",
            assignments={f"{SPECS}.pad_seq_to_mult": math.lcm(have, need)},
        )
    ]


def _pad_seq_length_to_mult(ctx: RuleContext) -> int:
    """The variable-width row multiple of GPT SFT's packed collate (``dataset_kwargs``, default 16)."""
    kwargs = getattr(ctx.dataset, "dataset_kwargs", None) or {}
    return int(kwargs.get("pad_seq_length_to_mult", GPT_SFT_ROW_MULTIPLE))


@rule(
    "offline.row_width_alignment",
    "The packed row width must be divisible by lcm(2*CP if CP>1, CP*TP if SP): packed_sequence_size for "
    "fixed-width rows, also dataset_kwargs['pad_seq_length_to_mult'] for variable-width rows.",
    severity=ERROR,
    evidence=(
        "data/packing/gpt_sft.py GPTSFTPackedDataset.collate_fn makes the row packed_sequence_size wide "
        "(pad_to_max_length) or min(packed_sequence_size, ceil(row, pad_seq_length_to_mult)) wide; the CP "
        "split (2*CP chunks per segment, the tail padding segment included) and "
        "megatron/core/tensor_parallel/mappings.py _split_along_first_dim (asserts 'First dimension of the "
        "tensor should be divisible by tensor parallel size' under SP) then need that width divisible by "
        "lcm(2*CP, CP*TP)."
    ),
)
def row_width_alignment(ctx: RuleContext) -> list[Violation] | None:
    need = ctx.topology.row_alignment
    if ctx.specs is None or ctx.specs.packed_sequence_size <= 0 or need == 1:
        return None
    return row_width_violations(
        ctx,
        need,
        "is split across CP ranks and then, with sequence parallelism, across TP ranks",
    )


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


@rule(
    "gpt_sft.row_width_alignment",
    "Unpacked GPT SFT rows must be divisible by lcm(2*CP if CP>1, CP*TP if SP): dataset_kwargs"
    "['pad_seq_length_to_mult'] for variable-width rows, and the seq_length a truncated row is cut to.",
    severity=ERROR,
    evidence=(
        "data/datasets/gpt_sft.py GPTSFTDataset.collate_fn pads each batch to min(max_seq_length, "
        "ceil(longest, pad_seq_length_to_mult)) (GPTSFTChatDataset: max(16, pad_seq_length_to_mult)); nothing in "
        "0.6.2 ties that multiple to CP or TP (NVIDIA-NeMo/Megatron-Bridge#2642: CP=16 needs 32). "
        "megatron/core/utils.py get_batch_on_this_cp_rank views each row as 2*CP chunks and "
        "tensor_parallel/mappings.py _split_along_first_dim asserts divisibility by TP under SP."
    ),
)
def gpt_sft_row_width_alignment(ctx: RuleContext) -> list[Violation] | None:
    need = ctx.topology.row_alignment
    if not ctx.dataset_is("gpt_sft") or ctx.offline_packing or ctx.in_batch_packing or need == 1:
        return None
    fields: dict[str, object] = {}
    fix: dict[str, object] = {}
    seq = getattr(ctx.dataset, "seq_length", None)
    two_cp = 2 * ctx.topology.cp if ctx.topology.cp > 1 else 1
    if isinstance(seq, int) and seq % need and seq % two_cp == 0:  # cp.seq_length_divisible reports the rest
        fields["dataset.seq_length"] = seq
        fix.update({"dataset.seq_length": round_up(seq, need), "model.seq_length": round_up(seq, need)})
    if not ctx.pad_to_max_length:
        mult = _pad_seq_length_to_mult(ctx)
        kwargs = getattr(ctx.dataset, "dataset_kwargs", None) or {}
        effective = max(GPT_SFT_ROW_MULTIPLE, mult) if kwargs.get("chat") else mult
        if effective % need:
            fields[ROW_MULT] = mult
            fix[ROW_MULT] = math.lcm(effective, need)
    if not fields:
        return []
    return [
        Violation(
            {**fields, ctx.pad_to_max_length_path: ctx.pad_to_max_length, **_alignment_fields(ctx)},
            "each batch is as wide as its longest row rounded up to pad_seq_length_to_mult (at most seq_length), "
            f"then split across CP ranks and, with sequence parallelism, TP ranks, so it must be a multiple of {need}",
            assignments=fix,
        )
    ]


@rule(
    "gpt_sft.dataset_kwargs_accepted",
    "dataset.dataset_kwargs of a GPT SFT dataset may hold only keyword arguments its dataset class takes, and none "
    "that Megatron-Bridge's builder passes itself.",
    severity=ERROR,
    evidence=(
        "data/builders/gpt_sft.py build_gpt_sft_split pops its own keys from dataset_kwargs and passes the rest as "
        "keyword arguments to GPTSFTDataset / GPTSFTChatDataset, or with offline packing GPTSFTPackedParquetDataset "
        "(which adds return_cu_seqlen): an unknown key raises TypeError 'unexpected keyword argument', a key it "
        "passes itself (seed, max_seq_length, file_path, ...) 'got multiple values for keyword argument'. "
        "chat_template is popped only by data/packing/offline.py tokenize_dataset, which GPTSFTDatasetBuilder.build "
        "runs on rank 0 alone and only when the pack does not exist yet. "
        "GPTSFTDatasetConfig.validate checks neither, and training/setup.py builds the datasets after the model "
        "and optimizer."
    ),
)
def gpt_sft_dataset_kwargs_accepted(ctx: RuleContext) -> list[Violation] | None:
    from mbridge_seqpack.tokenization.dataset_kwargs import (
        DATASET_KWARGS,
        PACKED_BY_BUILDER,
        PACKED_DATASET_KWARGS,
        PASSED_BY_BUILDER,
        POPPED_BY_BUILDER,
    )

    kwargs = getattr(ctx.dataset, "dataset_kwargs", None)
    if not ctx.dataset_is("gpt_sft") or not isinstance(kwargs, dict):
        return None
    packed = ctx.offline_packing
    # chat_template: only the prep pops it (tokenize_dataset), on rank 0 and only when it packs
    taken = {*DATASET_KWARGS, *POPPED_BY_BUILDER, *(PACKED_DATASET_KWARGS if packed else ())} - {"chat_template"}
    passed = {*PASSED_BY_BUILDER, *(PACKED_BY_BUILDER if packed else ())}
    dataset = "GPTSFTPackedParquetDataset" if packed else "GPTSFTDataset"
    found = []
    for key in kwargs:
        if key in taken:
            continue
        path = f"dataset.dataset_kwargs.{key}"
        near = difflib.get_close_matches(str(key), sorted(taken), n=1)
        hint = f" (did you mean {near[0]!r}? set it with ++dataset.dataset_kwargs.{near[0]}=...)" if near else ""
        if key in passed:
            why = f"build_gpt_sft_split passes {key!r} to {dataset} itself, so this is a second value: TypeError"
        elif key == "chat_template":
            why = (
                f"{dataset} takes no keyword 'chat_template' (only rank 0's packing prep pops it from "
                f"dataset_kwargs): TypeError on every other rank, and on rank 0 too once the pack exists"
            )
            hint = " and give the template to the tokenizer: tokenizer.chat_template=..."
        else:
            why = f"{dataset} takes no keyword {key!r}: TypeError"
        found.append(
            Violation(
                {path: kwargs[key]},
                f"{why} when the datasets are built, after the model is on the GPUs",
                fix=f"remove it: ~{path}{hint}",
            )
        )
    return found
