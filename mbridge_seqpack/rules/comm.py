"""Communication settings that fix the token count or the CP algorithm: Transformer Engine's userbuffer TP overlap,
Megatron-Core's hybrid context parallelism, and the CP communication types Transformer Engine implements."""

from __future__ import annotations

import difflib
from typing import Any

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import SPECS, RuleContext
from mbridge_seqpack.rules.registry import rule


def _overlap_fix(ctx: RuleContext) -> dict[str, Any]:
    """Turn the userbuffer overlap off where the config sets it (comm_overlap wins over the model field)."""
    if getattr(ctx.cfg, "comm_overlap", None) is not None:
        return {"comm_overlap.tp_comm_overlap": False}
    return {"model.tp_comm_overlap": False}


def _token_count_problem(ctx: RuleContext) -> tuple[str, dict[str, Any]] | None:
    """Why a training micro batch does not hold exactly seq_length * micro_batch tokens, and the fix; None when it
    does (or the dataset kind is not one whose widths are known)."""
    seq = ctx.model.seq_length
    if ctx.in_batch_packing or ctx.energon_packing:
        return "collate-time / online packing gives every micro batch its own token count", _overlap_fix(ctx)
    if ctx.offline_packing and ctx.specs is not None:
        size = ctx.specs.packed_sequence_size
        if not ctx.pad_to_max_length:
            return (
                "packed rows are as wide as their content rounded up to pad_seq_length_to_mult",
                ctx.pad_to_max_length_fix() | ({} if size == seq else {f"{SPECS}.packed_sequence_size": seq}),
            )
        if size != seq:
            return f"packed rows are packed_sequence_size = {size} tokens wide", {f"{SPECS}.packed_sequence_size": seq}
        return None
    if ctx.dataset_is("gpt_sft", "direct_hf", "energon", "mock_vlm"):
        if ctx.fixed_width_rows:
            return None
        return "each batch is padded only to its longest row", ctx.pad_to_max_length_fix()
    return None


@rule(
    "tp_comm_overlap.token_count",
    "TP communication overlap needs every micro batch to hold seq_length * micro_batch / CP tokens per rank.",
    severity=ERROR,
    evidence=(
        "megatron/bridge/training/initialize.py _initialize_tp_communicators sizes Transformer Engine's userbuffers "
        "once, for [seq_length * micro_batch_size / context_parallel_size, hidden_size]; "
        "transformer_engine/pytorch/module/base.py fill_userbuffers_buffer_for_all_gather copies each GEMM input "
        "into them and csrc/extensions/comm_gemm_overlap.cpp copy_into_buffer / get_buffer check "
        "'input_size * tp_size == ubuf_size' (NVTE_CHECK), so a micro batch of any other token count fails at its "
        "first TP GEMM (NVIDIA/TransformerEngine#1303: 'the sequence length has to be constant'). Packed rows "
        "without pad_to_max_length, variable-width GPT SFT batches, collate-time and Energon packing, and "
        "evaluation micro batches of another size all give other counts. Megatron-Bridge keeps the overlap only "
        "with TP>1 and sequence parallelism (training/comm_overlap.py)."
    ),
)
def tp_comm_overlap_token_count(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.tp_comm_overlap:
        return None
    topo = ctx.topology
    mbs = ctx.train.micro_batch_size
    problem = _token_count_problem(ctx)
    found = []
    (overlap_field,) = _overlap_fix(ctx)
    fields = {overlap_field: True, "model.seq_length": ctx.model.seq_length, "train.micro_batch_size": mbs}
    if problem is not None:
        why, fix = problem
        found.append(
            Violation(
                fields | {"model.context_parallel_size": topo.cp},
                f"the userbuffers hold seq_length * micro_batch / CP tokens per micro batch and Transformer Engine "
                f"checks every GEMM input against that size; {why}, so the first TP GEMM fails",
                assignments=fix,
            )
        )
    eval_mbs = getattr(getattr(ctx.cfg, "validation", None), "eval_micro_batch_size", None)
    if problem is None and eval_mbs is not None and mbs is not None and eval_mbs != mbs:
        found.append(
            Violation(
                fields | {"validation.eval_micro_batch_size": eval_mbs},
                f"evaluation micro batches hold {eval_mbs} rows where the userbuffers were sized for {mbs}: the "
                "first evaluation fails at its first TP GEMM",
                assignments={"validation.eval_micro_batch_size": mbs},
            )
        )
    return found


@rule(
    "cp.hybrid_context_parallel",
    "model.hybrid_context_parallel does not run in Megatron-Bridge 0.6.2.",
    severity=ERROR,
    evidence=(
        "megatron/core/pipeline_parallel/schedules.py forward_backward_no_pipelining hands the step to "
        "hybrid_cp_schedule.py hybrid_context_parallel_forward_backward, which reads next(data_iterator) as "
        "(batch, sample_id_groups) (data[1]); Megatron-Bridge's iterators yield dicts (its loaders have no "
        "HybridCPDataLoaderWrapper), so the first step raises KeyError: 1 (run on CPU). With PP>1 the pipelined "
        "schedules never read the flag and training runs with plain CP, except that "
        "megatron/core/parallel_state.py initialize_model_parallel asserts 'Hybrid context parallel requires an "
        "even number of ranks' in each DP x CP group."
    ),
)
def hybrid_context_parallel(ctx: RuleContext) -> list[Violation] | None:
    if not getattr(ctx.model, "hybrid_context_parallel", False):
        return None
    topo = ctx.topology
    dp = topo.data_parallel
    fields = {"model.hybrid_context_parallel": True, "model.pipeline_model_parallel_size": topo.pp}
    if topo.pp == 1:
        why = "the non-pipelined schedule hands it to the hybrid-CP scheduler, which unpacks each batch as a tuple"
        why += " and gets Megatron-Bridge's dict: KeyError at the first step"
    elif dp is not None and (dp * topo.cp) % 2:
        fields |= {"model.context_parallel_size": topo.cp, "data_parallel_size": dp}
        why = f"initialize_model_parallel asserts an even DP x CP group ({dp} x {topo.cp})"
    else:
        return []  # ignored by the pipelined schedules: plain CP (docs/upstream.md)
    return [Violation(fields, why, assignments={"model.hybrid_context_parallel": False})]


#: the values transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py
#: attn_forward_func_with_cp dispatches on ("a2a+p2p" degrades to p2p or a2a by group sizes)
KNOWN_CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")


def _known_spelling(value: str) -> str:
    """The Transformer Engine name a misspelt value most likely means (``allgather`` -> ``all_gather``)."""
    squashed = {known.replace("_", ""): known for known in KNOWN_CP_COMM_TYPES}
    key = value.strip().lower().replace("-", "").replace("_", "").replace(" ", "")
    if key in squashed:
        return squashed[key]
    near = difflib.get_close_matches(value.strip().lower(), KNOWN_CP_COMM_TYPES, n=1)
    return near[0] if near else "p2p"


@rule(
    "cp.comm_type_known",
    "With CP>1 every model.cp_comm_type value is one Transformer Engine implements: p2p, all_gather, a2a, a2a+p2p.",
    severity=ERROR,
    evidence=(
        "megatron/core/transformer/transformer_config.py only checks that cp_comm_type is a string (or a list of "
        "num_layers); megatron/core/extensions/transformer_engine.py TEDotProductAttention passes it on, and "
        "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py attn_forward_func_with_cp "
        "raises ValueError 'Unsupported communication type' for anything else at the first forward (run on CPU: "
        "'allgather' raises, 'all_gather' dispatches). Megatron-Core's DSA attention normalises 'allgather' itself "
        "(experimental_attention_variant/dsa_layout.py), so DSA models are not checked."
    ),
)
def comm_type_known(ctx: RuleContext) -> list[Violation] | None:
    if ctx.topology.cp <= 1 or getattr(ctx.model, "experimental_attention_variant", None) == "dsa":
        return None
    value = getattr(ctx.model, "cp_comm_type", None)
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    unknown = sorted({v for v in values if v is not None and v not in KNOWN_CP_COMM_TYPES})
    if not unknown:
        return []
    if isinstance(value, (list, tuple)):
        fixed: Any = [v if v is None or v in KNOWN_CP_COMM_TYPES else _known_spelling(v) for v in value]
    else:
        fixed = _known_spelling(value)
    return [
        Violation(
            {
                "model.cp_comm_type": value if isinstance(value, str) else list(value),
                "model.context_parallel_size": ctx.topology.cp,
            },
            f"Transformer Engine knows {', '.join(KNOWN_CP_COMM_TYPES)}; {', '.join(map(repr, unknown))} passes "
            "model build and raises 'Unsupported communication type' at the first forward",
            assignments={"model.cp_comm_type": fixed},
        )
    ]
