"""Multi-token prediction: packing and CP with MTP, and MTP under uniform full recompute with more than one layer a
unit."""

from __future__ import annotations

from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import BOOL, OPTIONAL_NAME, OPTIONAL_NON_NEGATIVE_INT
from mbridge_seqpack.rules.registry import rule


def _packing_flags(ctx: RuleContext) -> dict[str, bool]:
    flags = {}
    if ctx.offline_packing:
        flags["dataset.enable_offline_packing"] = True
    if ctx.in_batch_packing:
        flags["dataset.enable_in_batch_packing"] = True
    if ctx.energon_packing:
        flags["dataset.packing_buffer_size"] = ctx.dataset.packing_buffer_size
    return flags


@rule(
    "mtp.no_packing",
    "Multi-token prediction (mtp_num_layers > 0) is not supported with packed sequences.",
    severity=ADVISORY,
    evidence=(
        "Megatron-Core 0.19.2 rolls MTP labels within each packed sequence "
        "(megatron/core/transformer/multi_token_prediction.py roll_tensor -> _roll_tensor_packed_seq whenever "
        "packed_seq_params is passed, from models/gpt/gpt_model.py and models/hybrid/hybrid_model.py), and "
        "Megatron-Bridge 0.6.2 ships Nemotron-3 SFT recipes with MTP and packing; only documentation calls "
        "the combination unsupported. That roll uses packed_seq_params.cu_seqlens_q, the logical offsets, which "
        "leave the sequences when the rows carry alignment padding (pad_seq_to_mult > 1, an in-batch CP/SP "
        "multiple > 1): whether the MTP labels of this config stay within their sequences is computed by "
        "equivalence.mtp_labels (an error where they do not)."
    ),
    reads={
        "dataset.enable_in_batch_packing": BOOL,
        "dataset.enable_offline_packing": BOOL,
        "dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT,
        "model.mtp_num_layers": OPTIONAL_NON_NEGATIVE_INT,
    },
)
def mtp_no_packing(ctx: RuleContext) -> list[Violation] | None:
    flags = _packing_flags(ctx)
    if ctx.mtp_layers == 0 or not flags:
        return None
    return [
        Violation(
            {"model.mtp_num_layers": ctx.mtp_layers, **flags},
            "documented as unsupported for fine-tuning packing; Megatron-Core 0.19.2 rolls MTP labels within the "
            "logical cu_seqlens_q spans, which are the sequences only when the rows carry no alignment padding "
            "(equivalence.mtp_labels computes it for this config)",
            fix="cfg.model.mtp_num_layers = None (or turn packing off: "
            + ", ".join(f"cfg.{k} = {False if isinstance(v, bool) else None!r}" for k, v in flags.items())
            + ")",
            assignments={"model.mtp_num_layers": None},
        )
    ]


@rule(
    "mtp.packed_context_parallel",
    "Multi-token prediction over packed rows with CP>1 rolls labels across sequences in Megatron-Core 0.19.2.",
    severity=ERROR,
    evidence=(
        "megatron/core/transformer/multi_token_prediction.py _roll_tensor_packed_seq, CP branch: each rank's "
        "chunks are located with packed_seq_params.cu_seqlens_q // cp_size, the logical (unpadded) boundaries, "
        "while the THD split (get_thd_cp_partition_indices) cuts the physical ones (cu_seqlens_q_padded, each "
        "sequence padded to 2*CP); with any alignment padding the local chunks are misplaced and MTP labels roll "
        "across sequences, silently (NVIDIA/Megatron-LM#4494/#4495: fixed after 0.19)."
    ),
    reads={
        **TOPOLOGY_READS,
        "dataset.enable_in_batch_packing": BOOL,
        "dataset.enable_offline_packing": BOOL,
        "dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT,
        "model.mtp_num_layers": OPTIONAL_NON_NEGATIVE_INT,
    },
)
def mtp_packed_context_parallel(ctx: RuleContext) -> list[Violation] | None:
    flags = _packing_flags(ctx)
    if ctx.mtp_layers == 0 or not flags or ctx.topology.cp <= 1:
        return None
    return [
        Violation(
            {"model.mtp_num_layers": ctx.mtp_layers, "model.context_parallel_size": ctx.topology.cp, **flags},
            "under CP the MTP roll reads the unpadded boundaries where the rows are split by the padded ones, so "
            "MTP trains on tokens of the neighbouring sequence",
            assignments={"model.mtp_num_layers": None},
        )
    ]


@rule(
    "mtp.full_recompute_layers",
    "Multi-token prediction under uniform full recompute needs recompute_num_layers=1.",
    severity=ERROR,
    evidence=(
        "megatron/core/transformer/multi_token_prediction.py MultiTokenPredictionLayer._checkpointed_forward (taken "
        "when recompute_granularity='full' in training) asserts 'recompute_num_layers must be 1 for MTP recompute' "
        "for recompute_method='uniform' at the first forward (run on CPU); TransformerConfig bounds "
        "recompute_num_layers by the "
        "decoder's layers, not the MTP layers'."
    ),
    reads={
        "model.mtp_num_layers": OPTIONAL_NON_NEGATIVE_INT,
        "model.recompute_granularity": OPTIONAL_NAME,
        "model.recompute_method": OPTIONAL_NAME,
        "model.recompute_num_layers": OPTIONAL_NON_NEGATIVE_INT,
    },
)
def mtp_full_recompute_layers(ctx: RuleContext) -> list[Violation] | None:
    m = ctx.model
    if ctx.mtp_layers == 0 or getattr(m, "recompute_granularity", None) != "full":
        return None
    if getattr(m, "recompute_method", None) != "uniform" or getattr(m, "recompute_num_layers", None) in (None, 1):
        return []
    return [
        Violation(
            {
                "model.mtp_num_layers": ctx.mtp_layers,
                "model.recompute_granularity": "full",
                "model.recompute_method": "uniform",
                "model.recompute_num_layers": m.recompute_num_layers,
            },
            "each MTP layer is recomputed as a unit of one layer: the first forward asserts",
            assignments={"model.recompute_num_layers": 1},
        )
    ]
