"""What the attention a model builds asserts of a config when the model is built or first runs: a core attention
that is not Transformer Engine's refuses packed rows and CP; Transformer Engine's refuses windowed or
non-vanilla-softmax layers over the wrong CP communication type and all-to-all CP over heads it cannot scatter;
Megatron-Core refuses deterministic mode without the TE variable. Megatron-Bridge 0.6.2's validate() checks none
of them."""

from __future__ import annotations

import math
import os
from typing import Any

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import rule

#: TE context_parallel.py attn_forward_func_with_cp: 'Context parallelism does not support sliding window
#: attention with cp_comm_type=...' for these
SWA_REFUSING_COMM_TYPES = ("p2p", "a2a+p2p")
NONDETERMINISTIC_ENV = "NVTE_ALLOW_NONDETERMINISTIC_ALGO"


def _num_layers(model: Any) -> int:
    return max(1, int(getattr(model, "num_layers", 1) or 1))


def _softmax_type(model: Any) -> str:
    """Megatron-Core's TransformerConfig.softmax_type ('vanilla', 'off-by-one' or 'learnable')."""
    return getattr(model, "softmax_type", None) or "vanilla"


def _layer_comm_types(model: Any, layers: int) -> list[str]:
    """Each layer's CP communication type (Megatron-Core takes a string, or one entry per layer)."""
    value = getattr(model, "cp_comm_type", None)
    if isinstance(value, (list, tuple)):
        return [v or "p2p" for v in value][:layers]
    return [value or "p2p"] * layers


def _window_layers(model: Any, layers: int) -> list[int]:
    """1-based numbers of the layers that use sliding-window attention, as
    megatron/core/transformer/utils.py is_layer_window_attention decides."""
    from megatron.core.transformer.utils import is_layer_window_attention

    window = getattr(model, "window_size", None)
    if not isinstance(window, (list, tuple)) or len(window) != 2 or tuple(window) in ((-1, 0), (-1, -1)):
        return []  # an int window is a provider's own attention's business (Gemma-4), not TE's
    skip = getattr(model, "window_attn_skip_freq", None)
    return [n for n in range(1, layers + 1) if is_layer_window_attention(window, skip, n)]


def _packing_flag(ctx: RuleContext) -> str:
    return "dataset.enable_in_batch_packing" if ctx.in_batch_packing else "dataset.enable_offline_packing"


def _packing_off(ctx: RuleContext) -> dict[str, Any]:
    if ctx.in_batch_packing:
        return {"dataset.enable_in_batch_packing": False}
    return {"dataset.enable_offline_packing": False, "dataset.offline_packing_specs": None}


@rule(
    "model.core_attention_packing",
    "Packed (THD) rows need Transformer Engine's core attention in every layer.",
    severity=ERROR,
    evidence=(
        "megatron/core/transformer/dot_product_attention.py DotProductAttention.forward asserts "
        "'packed_seq_params is None' and models/gemma/gemma2_provider.py Gemma2DotProductAttention / "
        "Gemma2FlexDotProductAttention.forward raise 'Packed sequence is not supported by DotProductAttention' "
        "at the first forward; Megatron-Bridge 0.6.2 ships its Gemma-2 SFT/PEFT recipes with offline packing on "
        "(recipes/common.py _sft_common) over gemma2_layer_spec (also meta-pytorch/torchtune#2056)."
    ),
)
def core_attention_packing(ctx: RuleContext) -> list[Violation] | None:
    if not (ctx.offline_packing or ctx.in_batch_packing):
        return None
    refusing = ctx.non_te_core_attention
    if not refusing:
        return []
    return [
        Violation(
            {"core attention": ", ".join(refusing), _packing_flag(ctx): True},
            "the layer spec's core attention is not Transformer Engine's and raises on packed sequences at the "
            "first forward",
            assignments=_packing_off(ctx),
        )
    ]


@rule(
    "model.core_attention_cp",
    "Context parallelism needs Transformer Engine's core attention in every layer.",
    severity=ERROR,
    evidence=(
        "megatron/core/transformer/dot_product_attention.py DotProductAttention.__init__ asserts 'Context "
        "parallelism is only supported by TEDotProductAttention!' and models/gemma/gemma2_provider.py "
        "Gemma2DotProductAttention.__init__ raises the same ValueError when the model is built."
    ),
)
def core_attention_cp(ctx: RuleContext) -> list[Violation] | None:
    if ctx.topology.cp <= 1:
        return None
    refusing = ctx.non_te_core_attention
    if not refusing:
        return []
    return [
        Violation(
            {"core attention": ", ".join(refusing), "model.context_parallel_size": ctx.topology.cp},
            "the layer spec's core attention is not Transformer Engine's and refuses context parallelism when "
            "the model is built",
            assignments={"model.context_parallel_size": 1},
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
)
def sliding_window_comm_type(ctx: RuleContext) -> list[Violation] | None:
    layers = int(getattr(ctx.model, "num_layers", 0) or 0)
    if ctx.topology.cp <= 1 or layers <= 0 or ctx.non_te_core_attention:
        return None  # a non-TE core attention refuses CP altogether: model.core_attention_cp
    windowed = _window_layers(ctx.model, layers)
    if not windowed:
        return None
    types = _layer_comm_types(ctx.model, layers)
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
    return "all_gather" if _softmax_type(model) == "vanilla" else "a2a"


@rule(
    "cp.softmax_type_comm_type",
    "A non-vanilla softmax (attention sinks, off-by-one) with CP>1 needs cp_comm_type 'a2a'.",
    severity=ERROR,
    evidence=(
        "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py "
        "attn_forward_func_with_cp asserts 'Context parallelism only supports softmax_type=... with cp_comm_type = "
        "a2a'; before that, backend selection finds no backend ('No dot product attention backend is available', "
        "NVIDIA-NeMo/Megatron-Bridge#2298, NVIDIA/TransformerEngine#2541). Megatron-Core passes softmax_type to "
        "TEDotProductAttention (extensions/transformer_engine.py)."
    ),
)
def softmax_type_comm_type(ctx: RuleContext) -> list[Violation] | None:
    softmax = _softmax_type(ctx.model)
    layers = _num_layers(ctx.model)
    if ctx.topology.cp <= 1 or softmax == "vanilla" or ctx.non_te_core_attention:
        return None
    types = sorted(set(_layer_comm_types(ctx.model, layers)) - {"a2a"})
    if not types:
        return []
    return [
        Violation(
            {
                "model.softmax_type": softmax,
                "model.cp_comm_type": getattr(ctx.model, "cp_comm_type", None),
                "model.context_parallel_size": ctx.topology.cp,
            },
            f"Transformer Engine runs a {softmax} softmax under context parallelism only with the all-to-all "
            "communication type",
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
)
def a2a_heads_divisible(ctx: RuleContext) -> list[Violation] | None:
    topo = ctx.topology
    types = set(_layer_comm_types(ctx.model, _num_layers(ctx.model)))
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
    if _softmax_type(ctx.model) != "vanilla":
        return {"model.context_parallel_size": math.gcd(ctx.topology.cp, *local.values())}
    layers = _num_layers(ctx.model)
    return {"model.cp_comm_type": "all_gather" if _window_layers(ctx.model, layers) else "p2p"}


def _env_value(ctx: RuleContext, name: str) -> str | None:
    """The value the training process will see: the config's env_vars (runtime_config_update exports them before
    the model is built), else this process's environment."""
    env_vars = getattr(ctx.cfg, "env_vars", None) or {}
    if name in env_vars:
        return str(env_vars[name])
    return os.environ.get(name)


@rule(
    "determinism.te_attention_env",
    "deterministic_mode with Transformer Engine attention needs NVTE_ALLOW_NONDETERMINISTIC_ALGO=0.",
    severity=ERROR,
    evidence=(
        "megatron/core/extensions/transformer_engine.py TEDotProductAttention.__init__ raises RuntimeError "
        "'deterministic_mode is on ... but NVTE_ALLOW_NONDETERMINISTIC_ALGO is not 0' when the model is built, "
        "after the GPUs are allocated; Megatron-Bridge's _validate_and_apply_deterministic_mode checks NCCL_ALGO "
        "only (areal-project/AReaL#1544: the variable must be set before the model is built)."
    ),
)
def te_attention_env(ctx: RuleContext) -> list[Violation] | None:
    if not getattr(ctx.model, "deterministic_mode", False):
        return None
    if getattr(ctx.model, "transformer_impl", "transformer_engine") != "transformer_engine":
        return None
    value = _env_value(ctx, NONDETERMINISTIC_ENV)
    if value is not None and value.strip() == "0":
        return []
    return [
        Violation(
            {"model.deterministic_mode": True, f"env {NONDETERMINISTIC_ENV}": value},
            "Megatron-Core builds Transformer Engine attention only when non-deterministic algorithms are "
            "disallowed, and raises at model build otherwise",
            assignments={f"env_vars.{NONDETERMINISTIC_ENV}": "0"},
        )
    ]
