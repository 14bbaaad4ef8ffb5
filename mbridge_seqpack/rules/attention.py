"""What the attention a model builds asserts of a config when the model is built or first runs: a core attention
that is not Transformer Engine's refuses packed rows and CP; Transformer Engine's own backend selection must leave a
backend for every layer (computed by calling it: ``rules/attention_backend.py``), and its CP code refuses windowed
or non-vanilla-softmax layers over the wrong communication type and all-to-all CP over heads it cannot scatter;
Megatron-Core refuses deterministic mode without the TE variable, and NVTE_*_ATTN variables that contradict
``attention_backend``. Megatron-Bridge 0.6.2's validate() checks none of them."""

from __future__ import annotations

import math
import os
from typing import Any

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.attention_backend import (
    BACKEND_ENV,
    LOCAL_SUFFIX,
    NONDETERMINISTIC_ENV,
    SWA_REFUSING_COMM_TYPES,
    claims,
    decisive_reasons,
    env_value,
    layer_comm_types,
    mcore_backend_env,
    no_backend_violation,
    num_layers,
    softmax_type,
    training_env,
    undetermined_violation,
    window_layers,
)
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import rule


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
            f"{_whose(refusing)} is not Transformer Engine's and raises on packed sequences at the first forward",
            assignments=_unpin_local(refusing) or _packing_off(ctx),
        )
    ]


def _whose(refusing: list[str]) -> str:
    if all(name.endswith(LOCAL_SUFFIX) for name in refusing):
        return "with attention_backend=local, provide() swaps in Megatron-Core's own core attention, which"
    return "the layer spec's core attention"


def _unpin_local(refusing: list[str]) -> dict[str, Any]:
    """``model.attention_backend=auto`` where the only non-TE attention is the one ``local`` swaps in: as an
    override it is a string, which no provider swaps for and Megatron-Core sets no variable for."""
    return {"model.attention_backend": "auto"} if all(n.endswith(LOCAL_SUFFIX) for n in refusing) else {}


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
            f"{_whose(refusing)} is not Transformer Engine's and refuses context parallelism when the model is built",
            assignments=_unpin_local(refusing) or {"model.context_parallel_size": 1},
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
        "get_attention_backend, run on the layers' AttentionParams (rules/attention_backend.py): it disables "
        "FusedAttention for CP with a non-vanilla softmax_type unless cp_comm_type is a2a, FlashAttention for any "
        "non-vanilla softmax and UnfusedDotProductAttention under CP, so DotProductAttention.forward raises 'No "
        "dot product attention backend is available' (NVIDIA-NeMo/Megatron-Bridge#2298, "
        "NVIDIA/TransformerEngine#2541); context_parallel.py attn_forward_func_with_cp asserts the same after. "
        "Without Transformer Engine here, the same condition is checked from the config."
    ),
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


def _env_value(ctx: RuleContext, name: str) -> str | None:
    """The value the training process will see (the launch environment's, else ``env_vars``)."""
    return env_value(ctx.cfg, name)


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
    why = (
        "Megatron-Core builds Transformer Engine attention only when non-deterministic algorithms are "
        "disallowed, and raises at model build otherwise"
    )
    fields = {"model.deterministic_mode": True, f"env {NONDETERMINISTIC_ENV}": value}
    if NONDETERMINISTIC_ENV in os.environ:  # runtime_config_update's setdefault leaves a launch value in place
        return [
            Violation(
                fields,
                f"{why}; the launch environment sets it, and env_vars do not override a launch value "
                "(runtime_config_update: os.environ.setdefault)",
                fix=f"export {NONDETERMINISTIC_ENV}=0 in the launch environment (or unset it and set env_vars)",
            )
        ]
    return [Violation(fields, why, assignments={f"env_vars.{NONDETERMINISTIC_ENV}": "0"})]


@rule(
    "attention.backend_available",
    "Transformer Engine's own backend selection must leave an attention backend for every layer.",
    severity=ERROR,
    evidence=(
        "transformer_engine/pytorch/attention/dot_product_attention/utils.py get_attention_backend, called here "
        "unchanged on the AttentionParams DotProductAttention.forward builds for each kind of layer "
        "(rules/attention_backend.py: THD and pad_between_seqs from Megatron-Bridge's batches, CP size and comm "
        "type, window, softmax, determinism, FP8 attention, the NVTE_* variables Megatron-Core's "
        "_set_attention_backend leaves) on the target GPU (rules/te_attention.py: architecture, cuDNN, flash-attn "
        "declared; TE's fixed FusedAttention rules applied as data, rules/te_fused_rules.py; cuDNN's own support "
        "query assumed to accept); when it leaves none, "
        "dot_product_attention.py DotProductAttention.forward raises 'No dot product attention backend is "
        "available for the provided inputs' at the first forward (NVIDIA-NeMo/Megatron-Bridge#2298). Layers a "
        "cp.* rule reports are left to it."
    ),
)
def backend_available(ctx: RuleContext) -> list[Violation] | None:
    verdict = ctx.attention_verdict
    if not verdict.computed:
        return None
    heads_split = bool(a2a_heads_divisible(ctx))  # that rule reports a2a layers whose heads TE cannot split

    def own(kind: Any) -> bool:  # not a layer kind another rule reports
        return not claims(ctx, kind.kind) and not (heads_split and kind.kind.cp_comm_type in ("a2a", "a2a+p2p"))

    mine = [k for k in verdict.kinds if own(k)]
    found = [no_backend_violation(ctx.cfg, verdict, failing) for failing in verdict.failing if own(failing)]
    if verdict.undetermined_for(mine) is not None:  # kinds served on some stacks asked and not on others
        found.append(undetermined_violation(ctx.cfg, verdict, mine))
    return found


@rule(
    "attention.backend_env_conflict",
    "An NVTE_*_ATTN variable set for the launch must agree with an AttnBackend model.attention_backend.",
    severity=ERROR,
    evidence=(
        "megatron/core/models/common/language_module/language_module.py LanguageModule._set_attention_backend "
        "(run by GPTModel.__init__, when the model is built) asserts 'NVTE_... set to ..., but expected ... for "
        "attention backend type ...' for every AttnBackend value, the default auto included (it expects 1 for all "
        "three); run here on a copy of the launch's NVTE_* variables (environment, then env_vars as "
        "runtime_config_update's setdefault leaves them). A string value sets and checks nothing."
    ),
)
def backend_env_conflict(ctx: RuleContext) -> list[Violation] | None:
    env = training_env(ctx.cfg)
    if not any(name in env for name in BACKEND_ENV) or not hasattr(ctx.model, "attention_backend"):
        return None
    _, conflict = mcore_backend_env(ctx.model, env)
    if conflict is None:
        return []
    name, value, expected = _conflict_parts(conflict)
    pinned = getattr(ctx.model, "attention_backend", None)
    return [
        Violation(
            {"model.attention_backend": f"AttnBackend.{getattr(pinned, 'name', pinned)}", f"env {name}": value},
            f"Megatron-Core asserts when the model is built: {conflict.split('. ')[0]}",
            fix=(
                f"cfg.model.attention_backend = 'auto' (as an override: a string, for which Megatron-Core sets and "
                f"checks no variable, so Transformer Engine honours {name}={value}); or unset {name} "
                f"(or set it to {expected})"
            ),
            assignments={"model.attention_backend": "auto"},
        )
    ]


def _conflict_parts(message: str) -> tuple[str, str, str]:
    """(variable, value, expected) from _set_attention_backend's assertion message."""
    import re

    found = re.match(r"(\w+) set to (.*?), but expected (\w+)", message)
    return (found.group(1), found.group(2), found.group(3)) if found else ("NVTE_*_ATTN", "?", "?")
