"""Context-parallel rules: sequence divisibility, fine-tuning loss settings, hierarchical CP, THD support, the
CP communication types Transformer Engine implements (and refuses for windowed, non-vanilla-softmax layers or heads
it cannot scatter) and Megatron-Core's hybrid context parallelism."""

from __future__ import annotations

import difflib
import math
from typing import Any

from mbridge_seqpack.analysis.attention_backend import (
    SWA_REFUSING_COMM_TYPES,
    claims,
    decisive_reasons,
    layer_comm_types,
    num_layers,
    softmax_type,
    window_layers,
)
from mbridge_seqpack.analysis.model_family import per_token_loss_after_finalize
from mbridge_seqpack.analysis.topology import round_up
from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import ATTENTION_VERDICT_READS, TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import (
    BOOL,
    CP_COMM_TYPE,
    OPTIONAL_INT_LIST,
    OPTIONAL_NAME,
    OPTIONAL_NON_NEGATIVE_INT,
    OPTIONAL_WINDOW,
    POSITIVE_INT,
    UNCHECKED,
)
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.shared import _seq_length_fix


@rule(
    "cp.seq_length_divisible",
    "With CP>1, model.seq_length must be divisible by 2*CP.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate asserts model.seq_length % (2*CP) == 0 for the train CP "
        "(evaluation runs at the train CP in 0.6.2: see cp.eval_cp_has_no_effect)."
    ),
    reads={**TOPOLOGY_READS, "dataset.seq_length": POSITIVE_INT, "model.seq_length": POSITIVE_INT},
)
def seq_length_divisible_by_2cp(ctx: RuleContext) -> list[Violation] | None:
    topo = ctx.topology
    if topo.cp <= 1:
        return None
    need = 2 * topo.cp
    seq = ctx.model.seq_length
    if seq % need == 0:
        return []
    fields = {"model.seq_length": seq, "model.context_parallel_size": topo.cp}
    return [
        Violation(
            fields,
            f"with context parallelism every rank holds 2 chunks per sequence, so seq_length must be a multiple "
            f"of 2*CP = {need}; {seq} is not (THD would round lengths down and drop tokens)",
            assignments=_seq_length_fix(ctx, round_up(seq, need)),
        )
    ]


@rule(
    "cp.eval_cp_has_no_effect",
    "dist.eval_context_parallel_size has no effect in Megatron-Bridge 0.6.2: evaluation runs at the training CP.",
    severity=ADVISORY,
    evidence=(
        "training/state.py GlobalState._eval_pgs is only ever None (nothing builds eval-time CP groups), and "
        "training/eval_context_parallel_rebinding.py eval_cp_context is never called; training/config.py still "
        "uses the value for its eval batch arithmetic and the DirectHF/Energon/MockVLM collate multiple."
    ),
    reads={**TOPOLOGY_READS},
)
def eval_cp_has_no_effect(ctx: RuleContext) -> list[Violation] | None:
    eval_cp = ctx.topology.eval_cp
    if eval_cp is None:
        return None
    if eval_cp == ctx.topology.cp:
        return []
    return [
        Violation(
            {"dist.eval_context_parallel_size": eval_cp, "model.context_parallel_size": ctx.topology.cp},
            f"evaluation runs at the training CP ({ctx.topology.cp}), not at {eval_cp}: Megatron-Bridge 0.6.2 never "
            "wires evaluation-time context parallelism",
            assignments={"dist.eval_context_parallel_size": None},
        )
    ]


@rule(
    "cp.finetune_per_token_loss",
    "Fine-tuning with CP>1 needs model.calculate_per_token_loss=True.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate asserts 'When finetuning with CP>1, "
        "calculate_per_token_loss must be True' (GPT SFT, DirectHF, Energon, MockVLM datasets), after "
        "model.finalize(): the Qwen3-VL / Qwen3.5-VL providers turn it on themselves at CP>1."
    ),
    reads={**TOPOLOGY_READS, "model.calculate_per_token_loss": BOOL},
)
def finetune_per_token_loss(ctx: RuleContext) -> list[Violation] | None:
    if ctx.topology.cp <= 1 or not ctx.is_finetuning:
        return None
    if per_token_loss_after_finalize(ctx.model, ctx.topology.cp):
        return []
    return [
        Violation(
            {"model.calculate_per_token_loss": False, "model.context_parallel_size": ctx.topology.cp},
            "with CP>1 a rank can hold only masked (prompt/padding) tokens; per-sequence loss averaging then "
            "divides by zero and gives NaN, so fine-tuning must use per-token loss",
            assignments={"model.calculate_per_token_loss": True},
        )
    ]


def _uses_megatron_fsdp(ctx: RuleContext) -> bool:
    return bool(getattr(ctx.cfg.dist, "use_megatron_fsdp", False) or getattr(ctx.cfg.ddp, "use_megatron_fsdp", False))


@rule(
    "cp.finetune_average_in_collective",
    "Fine-tuning with CP>1 needs ddp.average_in_collective=False.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate asserts 'When finetuning with CP>1, "
        "average_in_collective must be False' (Megatron-FSDP sets it to False itself)."
    ),
    reads={
        **TOPOLOGY_READS,
        "ddp.average_in_collective": BOOL,
        "ddp.use_megatron_fsdp": BOOL,
        "dist.use_megatron_fsdp": BOOL,
    },
)
def finetune_average_in_collective(ctx: RuleContext) -> list[Violation] | None:
    if ctx.topology.cp <= 1 or not ctx.is_finetuning or _uses_megatron_fsdp(ctx):
        return None  # Megatron-FSDP forces it to False itself
    if not getattr(ctx.cfg.ddp, "average_in_collective", False):
        return []
    return [
        Violation(
            {"ddp.average_in_collective": True, "model.context_parallel_size": ctx.topology.cp},
            "per-token loss under CP sums token counts across ranks; averaging gradients inside the collective "
            "divides a second time",
            assignments={"ddp.average_in_collective": False},
        )
    ]


def _comm_types(ctx: RuleContext) -> list[str]:
    value = getattr(ctx.model, "cp_comm_type", None)
    return list(value) if isinstance(value, list) else [value or "p2p"]


def _suggest_hierarchy(ctx: RuleContext) -> list[int]:
    """A 2-level split that keeps the a2a level inside an 8-GPU node when it can, and no larger than what each TP
    rank's query and key/value heads divide by (the a2a level scatters heads: cp.a2a_heads_divisible)."""
    cp, tp = ctx.topology.cp, max(ctx.topology.tp, 1)
    heads = int(getattr(ctx.model, "num_attention_heads", 0) or 0)
    groups = int(getattr(ctx.model, "num_query_groups", None) or heads)
    inner = math.gcd(math.gcd(cp, max(1, 8 // tp)), math.gcd(heads // tp, groups // tp) or cp)
    return [inner, cp // inner]


@rule(
    "cp.hierarchical_sizes_required",
    "cp_comm_type 'a2a+p2p' needs model.hierarchical_context_parallel_sizes.",
    severity=ERROR,
    evidence=(
        "megatron/core/extensions/transformer_engine.py TEDotProductAttention.__init__ passes "
        "get_hierarchical_context_parallel_groups(check_initialized=False) as cp_group for 'a2a+p2p'; without "
        "hierarchical sizes (None or an empty list: parallel_state.initialize_model_parallel makes the groups only "
        "under `if hierarchical_context_parallel_sizes:`) it never creates those groups, so TE gets cp_group=None "
        "(crash at model build)."
    ),
    reads={
        **TOPOLOGY_READS,
        "model.cp_comm_type": CP_COMM_TYPE,
        "model.hierarchical_context_parallel_sizes": OPTIONAL_INT_LIST,
        "model.num_attention_heads": OPTIONAL_NON_NEGATIVE_INT,
        "model.num_query_groups": OPTIONAL_NON_NEGATIVE_INT,
    },
)
def hierarchical_sizes_required(ctx: RuleContext) -> list[Violation] | None:
    if not any(t is not None and "a2a+p2p" in t for t in _comm_types(ctx)):
        return None
    sizes = getattr(ctx.model, "hierarchical_context_parallel_sizes", None)
    if sizes:  # parallel_state.initialize_model_parallel makes the groups only for a non-empty list
        return []
    return [
        Violation(
            {
                "model.cp_comm_type": getattr(ctx.model, "cp_comm_type", None),
                "model.hierarchical_context_parallel_sizes": sizes,
            },
            "without hierarchical sizes the a2a+p2p CP communication is silently disabled: each rank attends "
            "only to its local chunk (fast, and wrong)",
            assignments={"model.hierarchical_context_parallel_sizes": _suggest_hierarchy(ctx)},
        )
    ]


@rule(
    "cp.hierarchical_sizes_product",
    "prod(model.hierarchical_context_parallel_sizes) must equal CP.",
    severity=ERROR,
    evidence=(
        "megatron/core/parallel_state.py initialize_model_parallel asserts "
        "np.prod(hierarchical_context_parallel_sizes) == context_parallel_size."
    ),
    reads={
        **TOPOLOGY_READS,
        "model.hierarchical_context_parallel_sizes": OPTIONAL_INT_LIST,
        "model.num_attention_heads": OPTIONAL_NON_NEGATIVE_INT,
        "model.num_query_groups": OPTIONAL_NON_NEGATIVE_INT,
    },
)
def hierarchical_sizes_product(ctx: RuleContext) -> list[Violation] | None:
    sizes = getattr(ctx.model, "hierarchical_context_parallel_sizes", None)
    if not sizes:  # initialize_model_parallel checks the product only under `if hierarchical_context_parallel_sizes:`
        return None
    cp = ctx.topology.cp
    if math.prod(sizes) == cp:
        return []
    return [
        Violation(
            {"model.hierarchical_context_parallel_sizes": list(sizes), "model.context_parallel_size": cp},
            f"the hierarchical CP levels must multiply to context_parallel_size ({math.prod(sizes)} != {cp})",
            assignments={"model.hierarchical_context_parallel_sizes": _suggest_hierarchy(ctx)},
        )
    ]


MIN_MCORE_FOR_THD_CP = (0, 18, 0)


def _mcore_version() -> tuple[int, ...]:
    from megatron.core import package_info
    from packaging.version import Version

    return Version(package_info.__version__).release[:3]


@rule(
    "cp.thd_mcore_version",
    "Packed (THD) sequences with CP>1 need Megatron-Core >= 0.18.",
    severity=ERROR,
    evidence=(
        "THD partitioning under CP (megatron/core/utils.py get_thd_cp_partition_indices) does not exist "
        "before Megatron-Core 0.18: training/gpt_step.py cannot import it."
    ),
    reads={
        **TOPOLOGY_READS,
        "dataset.enable_in_batch_packing": BOOL,
        "dataset.enable_offline_packing": BOOL,
        "dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT,
    },
)
def thd_mcore_version(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.any_packing or ctx.topology.cp <= 1:
        return None
    version = _mcore_version()
    if version >= MIN_MCORE_FOR_THD_CP:
        return []
    return [
        Violation(
            {"megatron.core.__version__": ".".join(map(str, version)), "model.context_parallel_size": ctx.topology.cp},
            "THD context-parallel partitioning (thd_get_partitioned_indices) exists from Megatron-Core 0.18",
            fix="pip install 'megatron-core>=0.18' (or set cfg.model.context_parallel_size = 1)",
        )
    ]


@rule(
    "cp.sliding_window_comm_type",
    "Sliding-window layers with CP>1 need cp_comm_type 'all_gather' or 'a2a', not 'p2p' / 'a2a+p2p'.",
    severity=ERROR,
    evidence=(
        "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py "
        "attn_forward_func_with_cp asserts 'Context parallelism does not support sliding window attention with "
        "cp_comm_type=...' for p2p and a2a+p2p at the first forward; Megatron-Core passes window_size to every "
        "layer is_layer_window_attention selects (extensions/transformer_engine.py TEDotProductAttention), and "
        "its default cp_comm_type is p2p (NVIDIA/Megatron-LM#1160)."
    ),
    reads={
        **TOPOLOGY_READS,
        "model.attention_backend": OPTIONAL_NAME,
        "model.cp_comm_type": CP_COMM_TYPE,
        "model.num_layers": UNCHECKED,
        "model.softmax_type": OPTIONAL_NAME,
        "model.transformer_layer_spec": UNCHECKED,
        "model.window_attn_skip_freq": UNCHECKED,
        "model.window_size": OPTIONAL_WINDOW,
    },
)
def sliding_window_comm_type(ctx: RuleContext) -> list[Violation] | None:
    layers = int(getattr(ctx.model, "num_layers", 0) or 0)
    if ctx.topology.cp <= 1 or layers <= 0 or ctx.non_te_core_attention:
        return None  # a non-TE core attention refuses CP altogether: model.core_attention_cp
    windowed = window_layers(ctx.model, layers)
    if not windowed:
        return None
    types = layer_comm_types(ctx.model, layers)
    bad = [n for n in windowed if n <= len(types) and types[n - 1] in SWA_REFUSING_COMM_TYPES]
    if not bad:
        return []
    return [
        Violation(
            {
                "model.window_size": list(ctx.model.window_size),
                "model.cp_comm_type": getattr(ctx.model, "cp_comm_type", None),
                "model.context_parallel_size": ctx.topology.cp,
                "sliding-window layers": len(bad),
            },
            f"{len(bad)} sliding-window layer(s) run ring (p2p) context parallelism, which Transformer Engine "
            "refuses for windowed attention at the first forward",
            assignments={"model.cp_comm_type": _windowed_cp_comm_type(ctx.model)},
        )
    ]


def _windowed_cp_comm_type(model: Any) -> str:
    """all_gather for windowed layers, unless a non-vanilla softmax needs a2a (which takes windows too)."""
    return "all_gather" if softmax_type(model) == "vanilla" else "a2a"


@rule(
    "cp.softmax_type_comm_type",
    "A non-vanilla softmax (attention sinks, off-by-one) with CP>1 needs cp_comm_type 'a2a'.",
    severity=ERROR,
    evidence=(
        "decided by Transformer Engine's own transformer_engine/pytorch/attention/dot_product_attention/utils.py "
        "get_attention_backend, run on the layers' AttentionParams (analysis/attention_backend.py): it disables "
        "FusedAttention for CP with a non-vanilla softmax_type unless cp_comm_type is a2a, FlashAttention for any "
        "non-vanilla softmax and UnfusedDotProductAttention under CP, so DotProductAttention.forward raises 'No "
        "dot product attention backend is available' (NVIDIA-NeMo/Megatron-Bridge#2298, "
        "NVIDIA/TransformerEngine#2541); context_parallel.py attn_forward_func_with_cp asserts the same after. "
        "Without Transformer Engine here, the same condition is checked from the config."
    ),
    reads={**ATTENTION_VERDICT_READS, **TOPOLOGY_READS},
)
def softmax_type_comm_type(ctx: RuleContext) -> list[Violation] | None:
    softmax = softmax_type(ctx.model)
    layers = num_layers(ctx.model)
    if ctx.topology.cp <= 1 or softmax == "vanilla" or ctx.non_te_core_attention:
        return None
    verdict = ctx.attention_verdict
    reasons = ""
    if verdict.computed:
        refused = [k for k in verdict.failing if "cp.softmax_type_comm_type" in claims(ctx, k.kind)]
        if not refused:
            return []
        reasons = f" (TE's selection on {verdict.target.sm}: {decisive_reasons(refused[0].selection, verdict.target)})"
    elif not set(layer_comm_types(ctx.model, layers)) - {"a2a"}:
        return []
    return [
        Violation(
            {
                "model.softmax_type": softmax,
                "model.cp_comm_type": getattr(ctx.model, "cp_comm_type", None),
                "model.context_parallel_size": ctx.topology.cp,
            },
            f"Transformer Engine runs a {softmax} softmax under context parallelism only with the all-to-all "
            f"communication type{reasons}",
            assignments={"model.cp_comm_type": "a2a"},
        )
    ]


@rule(
    "cp.a2a_heads_divisible",
    "All-to-all CP scatters heads: each TP rank's query and key/value heads must divide by the a2a group size.",
    severity=ERROR,
    evidence=(
        "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py "
        "AttnFuncWithCPAndQKVOA2A.forward asserts 'cp_comm_type=a2a requires num_heads % cp_size == 0 for Q, K, "
        "V' on the rank-local heads (num_attention_heads / TP, num_query_groups / TP); for a2a+p2p the a2a level "
        "is hierarchical_context_parallel_sizes[0]. LlamaFactory hit the same split with 2 KV heads at CP 4 "
        "(hiyouga/LlamaFactory#10794)."
    ),
    reads={
        **TOPOLOGY_READS,
        "model.cp_comm_type": CP_COMM_TYPE,
        "model.hierarchical_context_parallel_sizes": OPTIONAL_INT_LIST,
        "model.num_attention_heads": OPTIONAL_NON_NEGATIVE_INT,
        "model.num_layers": UNCHECKED,
        "model.num_query_groups": OPTIONAL_NON_NEGATIVE_INT,
        "model.softmax_type": OPTIONAL_NAME,
        "model.window_size": OPTIONAL_WINDOW,
    },
)
def a2a_heads_divisible(ctx: RuleContext) -> list[Violation] | None:
    topo = ctx.topology
    types = set(layer_comm_types(ctx.model, num_layers(ctx.model)))
    if topo.cp <= 1 or not types & {"a2a", "a2a+p2p"}:
        return None
    group = topo.cp
    if "a2a" not in types:
        sizes = getattr(ctx.model, "hierarchical_context_parallel_sizes", None)
        if not sizes:
            return None  # cp.hierarchical_sizes_required reports it
        group = int(sizes[0])
    heads = int(getattr(ctx.model, "num_attention_heads", 0) or 0)
    groups = int(getattr(ctx.model, "num_query_groups", None) or heads)
    # fewer key/value groups than TP ranks are replicated: one per rank
    local = {"query heads": max(1, heads // max(topo.tp, 1)), "key/value heads": max(1, groups // max(topo.tp, 1))}
    short = {name: n for name, n in local.items() if n % group}
    if not short:
        return []
    fields: dict[str, Any] = {
        "model.num_attention_heads": heads,
        "model.num_query_groups": groups,
        "model.tensor_model_parallel_size": topo.tp,
        "model.cp_comm_type": getattr(ctx.model, "cp_comm_type", None),
        "a2a group size": group,
    }
    what = ", ".join(f"{n} {name}" for name, n in short.items())
    return [
        Violation(
            fields,
            f"each TP rank holds {what}, which all-to-all CP cannot scatter over {group} ranks",
            assignments=_a2a_heads_fix(ctx, local),
        )
    ]


def _a2a_heads_fix(ctx: RuleContext, local: dict[str, int]) -> dict[str, Any]:
    """Ring CP (all_gather where layers are windowed), or, where a non-vanilla softmax needs a2a, the largest CP
    size the heads divide by."""
    if softmax_type(ctx.model) != "vanilla":
        return {"model.context_parallel_size": math.gcd(ctx.topology.cp, *local.values())}
    layers = num_layers(ctx.model)
    return {"model.cp_comm_type": "all_gather" if window_layers(ctx.model, layers) else "p2p"}


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
    reads={**TOPOLOGY_READS, "model.hybrid_context_parallel": BOOL},
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
    reads={**TOPOLOGY_READS, "model.cp_comm_type": CP_COMM_TYPE, "model.experimental_attention_variant": UNCHECKED},
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
