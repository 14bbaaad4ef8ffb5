"""Offline packs as Megatron-Bridge's GPT SFT builder makes and reads them: what its rank-0 prep and its packed
dataset refuse after the model is built."""

from __future__ import annotations

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import SPECS, RuleContext
from mbridge_seqpack.rules.registry import rule


def _pack_will_be_made(ctx: RuleContext) -> bool:
    """Whether the builder's rank-0 prep will pack the training split: no existing pack at the explicit path (or at
    the builder's default location)."""
    from megatron.bridge.data.packing.paths import is_packed_parquet_spec, resolve_packed_parquet_paths

    from mbridge_seqpack.packing.builder_location import builder_location

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
)
def train_split_rows(ctx: RuleContext) -> list[Violation] | None:
    from mbridge_seqpack.rules.lifecycle import packed_split_files, parquet_rows

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
