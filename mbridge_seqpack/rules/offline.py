"""Offline (pre-packed, micro batch 1) packing rules: flags, pack size, alignment, sequence lengths, and offline
packs as Megatron-Bridge's GPT SFT builder makes and reads them (what its rank-0 prep and its packed dataset refuse
after the model is built)."""

from __future__ import annotations

import math

from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import (
    DATASET_KWARGS_READS,
    PACK_FINGERPRINT_READS,
    PACK_PATH_READS,
    SPECS,
    TOPOLOGY_READS,
    RuleContext,
)
from mbridge_seqpack.rules.field_types import (
    ANY_INT,
    BOOL,
    OPTIONAL_MICRO_BATCH,
    OPTIONAL_NAME,
    OPTIONAL_NON_NEGATIVE_INT,
    OPTIONAL_POSITIVE_INT,
    POSITIVE_INT,
    UNCHECKED,
)
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.row_widths import _alignment_fields, row_width_violations


@rule(
    "offline.specs_required",
    "enable_offline_packing=True needs dataset.offline_packing_specs.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError 'offline_packing_specs must be set "
        "when enable_offline_packing=True.'"
    ),
    reads={
        **TOPOLOGY_READS,
        "dataset.enable_offline_packing": BOOL,
        "dataset.seq_length": POSITIVE_INT,
        "model.seq_length": POSITIVE_INT,
    },
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
    reads={"dataset.enable_offline_packing": BOOL},
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
    reads={
        "dataset.enable_offline_packing": BOOL,
        "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
        "train.global_batch_size": OPTIONAL_MICRO_BATCH,
        "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
    },
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
    reads={
        "dataset.enable_offline_packing": BOOL,
        "validation.eval_global_batch_size": OPTIONAL_MICRO_BATCH,
        "validation.eval_micro_batch_size": OPTIONAL_MICRO_BATCH,
    },
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
    reads={"dataset.offline_packing_specs.packed_sequence_size": ANY_INT, "model.seq_length": POSITIVE_INT},
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
    reads={
        "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
        "dataset.seq_length": POSITIVE_INT,
        "model.seq_length": POSITIVE_INT,
    },
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
    "offline.max_single_within_pack",
    "max_single_sequence_length <= packed_sequence_size.",
    severity=ERROR,
    evidence=(
        "data/packing/config.py PackedSequenceSpecs.__post_init__ raises ValueError "
        "'max_single_sequence_length cannot exceed packed_sequence_size.' (a later assignment skips that "
        "check, and data/packing/algorithms.py create_packing_strategy cannot place the sequence)."
    ),
    reads={
        "dataset.offline_packing_specs.max_single_sequence_length": OPTIONAL_POSITIVE_INT,
        "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
    },
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
    reads={**TOPOLOGY_READS, "dataset.offline_packing_specs.pad_seq_to_mult": POSITIVE_INT},
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
    reads={
        **TOPOLOGY_READS,
        **DATASET_KWARGS_READS,
        "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
        "dataset.pad_to_multiple_of": POSITIVE_INT,
        "dataset.seq_length": POSITIVE_INT,
        "model.seq_length": POSITIVE_INT,
    },
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


def _pack_will_be_made(ctx: RuleContext) -> bool:
    """Whether the builder's rank-0 prep will pack the training split: no existing pack at the explicit path (or at
    the builder's default location)."""
    from megatron.bridge.data.packing.paths import is_packed_parquet_spec, resolve_packed_parquet_paths

    from mbridge_seqpack.artifact.builder_location import builder_location

    spec = getattr(ctx.specs, "packed_train_data_path", None)
    if spec is not None:
        if not is_packed_parquet_spec(str(spec)):
            return False  # a legacy .npy path: the prep skips it (and warns)
        try:
            return not resolve_packed_parquet_paths(str(spec))
        except ValueError:
            return True
    location = builder_location(ctx.cfg)
    return location is None or not location.split_path("training").is_file()


@rule(
    "offline.pad_multiple_within_length",
    "offline_packing_specs.pad_seq_to_mult may not exceed the longest sequence the prep keeps (max_single_sequence_"
    "length, else dataset.seq_length).",
    severity=ERROR,
    evidence=(
        "megatron/bridge/data/packing/offline.py tokenize_dataset (run by GPTSFTDatasetBuilder.prepare_packed_data "
        "on rank 0 when the pack does not exist yet, after the model is built) raises ValueError 'max_seq_length (N) "
        "must be at least the effective padding multiple (M).' when pad_seq_to_mult > max_seq_length, which the "
        "builder passes as max_single_sequence_length or seq_length (run on CPU). PackedSequenceSpecs checks only "
        "that the multiple is positive."
    ),
    reads={
        **TOPOLOGY_READS,
        **DATASET_KWARGS_READS,
        **PACK_PATH_READS,
        "dataset.enable_offline_packing": BOOL,
        "dataset.offline_packing_specs.max_single_sequence_length": OPTIONAL_POSITIVE_INT,
        "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
        "dataset.offline_packing_specs.pad_seq_to_mult": POSITIVE_INT,
        "dataset.seq_length": POSITIVE_INT,
        "tokenizer.hf_tokenizer_kwargs": UNCHECKED,
        "tokenizer.tokenizer_model": UNCHECKED,
        "tokenizer.tokenizer_type": UNCHECKED,
    },
)
def pad_multiple_within_length(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.offline_packing or ctx.specs is None or not ctx.dataset_is("gpt_sft"):
        return None
    mult = ctx.specs.pad_seq_to_mult or 1
    single = ctx.specs.max_single_sequence_length
    longest = single or ctx.dataset.seq_length
    if mult <= longest or not _pack_will_be_made(ctx):
        return []
    field = f"{SPECS}.max_single_sequence_length" if single else "dataset.seq_length"
    seq = ctx.dataset.seq_length
    if single and mult <= seq:
        fix: dict[str, object] = {f"{SPECS}.max_single_sequence_length": None}  # keep sequences up to seq_length
    else:
        align = ctx.topology.sequence_alignment  # the least THD CP needs (offline.alignment_multiple)
        fix = {f"{SPECS}.pad_seq_to_mult": align}
        if single and align > single:
            fix[f"{SPECS}.max_single_sequence_length"] = None
    return [
        Violation(
            {f"{SPECS}.pad_seq_to_mult": mult, field: longest},
            f"the prep pads every sequence to a multiple of {mult} but keeps sequences of at most {longest} tokens: "
            "it raises before packing, on rank 0 after the model is built",
            assignments=fix,
        )
    ]


@rule(
    "offline.no_p_tuning",
    "Offline packed splits refuse dataset_kwargs['virtual_tokens'] > 0 (P-Tuning).",
    severity=ERROR,
    evidence=(
        "megatron/bridge/data/packing/gpt_sft.py GPTSFTPackedDataset.__init__ (the base of the packed Parquet "
        "dataset build_gpt_sft_split makes for an offline pack) asserts 'P-Tuning with packed sequence is not "
        "supported.' when virtual_tokens (passed through from dataset_kwargs) is not 0: the training split fails "
        "when the datasets are built, after the model (run on CPU). The unpacked GPTSFTDataset takes the key, so "
        "gpt_sft.dataset_kwargs_accepted lets it through."
    ),
    reads={
        **DATASET_KWARGS_READS,
        "dataset.dataset_kwargs['virtual_tokens']": OPTIONAL_NON_NEGATIVE_INT,
        "dataset.enable_offline_packing": BOOL,
    },
)
def no_p_tuning(ctx: RuleContext) -> list[Violation] | None:
    kwargs = getattr(ctx.dataset, "dataset_kwargs", None)
    if not ctx.offline_packing or not ctx.dataset_is("gpt_sft") or not isinstance(kwargs, dict):
        return None
    tokens = kwargs.get("virtual_tokens", 0)
    if not tokens:
        return []
    return [
        Violation(
            {"dataset.dataset_kwargs.virtual_tokens": tokens, "dataset.enable_offline_packing": True},
            "the packed dataset asserts that no virtual (P-Tuning) tokens are prepended: packed rows hold several "
            "sequences and no prefix slots",
            assignments={"dataset.dataset_kwargs.virtual_tokens": 0},
        )
    ]


@rule(
    "offline.train_split_rows",
    "A packed training split must hold at least one global batch of rows (or dataset.max_train_samples must ask for "
    "that many samples).",
    severity=ERROR,
    evidence=(
        "megatron/bridge/data/loaders.py build_train_valid_test_data_loaders raises RuntimeError 'Not enough train "
        "samples for a single global batch: train dataset size (N) < global batch size (G)' when the loaders are "
        "built, after the model and optimizer, whenever drop_last holds (dataset.drop_last, the default, without "
        "train.num_epochs) and the dataloader is not 'external' (run on CPU over a packed split). The packed "
        "dataset's length is its rows (data/packing/parquet.py), or dataset.max_train_samples when set (its "
        "samples mapping repeats the rows in shuffled epochs). eval.packed_split_rows checks the validation split."
    ),
    reads={
        **PACK_FINGERPRINT_READS,
        **DATASET_KWARGS_READS,
        **PACK_PATH_READS,
        "dataset.dataloader_type": OPTIONAL_NAME,
        "dataset.drop_last": BOOL,
        "dataset.enable_offline_packing": BOOL,
        "dataset.max_train_samples": OPTIONAL_POSITIVE_INT,
        "train.global_batch_size": OPTIONAL_MICRO_BATCH,
        "train.num_epochs": UNCHECKED,
        "train.train_iters": UNCHECKED,
    },
)
def train_split_rows(ctx: RuleContext) -> list[Violation] | None:
    from mbridge_seqpack.rules.shared import packed_split_files, parquet_rows

    dataset = ctx.dataset
    if ctx.specs is None or not ctx.offline_packing or not ctx.dataset_is("gpt_sft"):
        return None
    if getattr(ctx.train, "num_epochs", None) is not None or not getattr(dataset, "drop_last", True):
        return None
    if getattr(dataset, "dataloader_type", None) == "external":
        return None
    files = packed_split_files(ctx, "training")
    rows = parquet_rows(files) if files else None
    gbs = ctx.train.global_batch_size
    if rows is None or not isinstance(gbs, int):
        return None
    samples = getattr(dataset, "max_train_samples", None)
    length = samples if isinstance(samples, int) and samples > 0 else rows
    if length >= gbs:
        return []
    iters = getattr(ctx.train, "train_iters", None)
    wanted = gbs * iters if isinstance(iters, int) and iters > 0 else gbs
    return [
        Violation(
            {
                f"{SPECS}.packed_train_data_path": str(ctx.specs.packed_train_data_path or files[0]),
                "training rows": rows,
                "dataset.max_train_samples": samples,
                "train.global_batch_size": gbs,
            },
            f"the packed training split holds {rows} rows and one global batch takes {gbs}: the data loaders refuse "
            "it when they are built, after the model",
            fix=f"cfg.dataset.max_train_samples = {wanted} (the samples the run consumes: the rows repeat in shuffled "
            "epochs), or pack more data, or lower cfg.train.global_batch_size",
            assignments={"dataset.max_train_samples": wanted},
        )
    ]
