"""``model.*``: what the model a provider builds refuses of packing: a core attention that is not Transformer
Engine's refuses packed rows and CP, and the families Megatron-Bridge 0.6.2 ships with packing turned off."""

from __future__ import annotations

from typing import Any

from mbridge_seqpack.analysis.attention_backend import (
    LOCAL_SUFFIX,
)
from mbridge_seqpack.analysis.model_family import GLM45, QWEN3_NEXT, QWEN35_VL, detect_model_family
from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import MOE_READS, TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import BOOL, OPTIONAL_NAME, UNCHECKED
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
    reads={
        "dataset.enable_in_batch_packing": BOOL,
        "dataset.enable_offline_packing": BOOL,
        "model.attention_backend": OPTIONAL_NAME,
        "model.transformer_layer_spec": UNCHECKED,
    },
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
    reads={**TOPOLOGY_READS, "model.attention_backend": OPTIONAL_NAME, "model.transformer_layer_spec": UNCHECKED},
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
    "model.offline_packing_opt_out",
    "Qwen3-Next and GLM-4.5 do not support offline packing.",
    severity=ADVISORY,
    evidence=(
        "Megatron-Bridge 0.6.2 ships Qwen3-Next and GLM-4.5 SFT/PEFT recipes with offline packing off and a "
        "docstring 'Packed sequence is NOT supported' (recipes/qwen/h100/qwen3_next.py, "
        "recipes/glm/h100/glm45.py); no Megatron code fails on it (megatron/core/ssm/gated_delta_net/gdn.py "
        "takes THD cu_seqlens)."
    ),
    reads={
        "dataset.enable_offline_packing": BOOL,
        "model.experimental_attention_variant": UNCHECKED,
        "model.moe_router_score_function": UNCHECKED,
        "model.multi_latent_attention": UNCHECKED,
        **MOE_READS,
    },
)
def offline_packing_opt_out(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.offline_packing:
        return None
    family = detect_model_family(ctx.model)
    if family not in (QWEN3_NEXT, GLM45):
        return []
    return [
        Violation(
            {"model": type(ctx.model).__name__, "model family": family, "dataset.enable_offline_packing": True},
            f"Megatron-Bridge ships {family} fine-tuning with offline packing off: packed sequences are not "
            "supported for this family",
            assignments={"dataset.enable_offline_packing": False, "dataset.offline_packing_specs": None},
        )
    ]


@rule(
    "model.in_batch_packing_opt_out",
    "Qwen3.5-VL does not support in-batch packing.",
    severity=ADVISORY,
    evidence=(
        "Megatron-Bridge 0.6.2 ships every Qwen3.5-VL recipe with enable_in_batch_packing=False and "
        "defer_in_batch_packing_to_step=True (recipes/qwen_vl/h100/qwen35_vl.py); its step "
        "models/qwen_vl/qwen3_vl_step.py raises ValueError on collate-packed batches, but which step runs is "
        "not part of the config."
    ),
    reads={
        "dataset.enable_in_batch_packing": BOOL,
        "model.experimental_attention_variant": UNCHECKED,
        **MOE_READS,
    },
)
def in_batch_packing_opt_out(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.in_batch_packing:
        return None
    family = detect_model_family(ctx.model)
    if family != QWEN35_VL:
        return []
    return [
        Violation(
            {"model": type(ctx.model).__name__, "model family": family, "dataset.enable_in_batch_packing": True},
            "Megatron-Bridge 0.6.2 ships every Qwen3.5-VL recipe with in-batch packing off (its gated-delta-net "
            "layers do not take packed boundaries)",
            assignments={"dataset.enable_in_batch_packing": False},
        )
    ]
