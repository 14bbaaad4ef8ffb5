"""Identify model families that Megatron-Bridge 0.6.2 ships with packing turned off.

Detection uses the provider class or the provider's structure, never the model's name or checkpoint id.
``AutoBridge`` (from a hub id or an in-code config) returns a plain ``GPTModelProvider``, so GLM-4.5 and
Qwen3-Next are recognised by the fields their bridges set, which are dataclass fields and so survive
``to_yaml``/``from_yaml``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["QWEN3_NEXT", "GLM45", "QWEN35_VL", "detect_model_family", "looks_like_glm45"]

QWEN3_NEXT = "Qwen3-Next"
GLM45 = "GLM-4.5"
QWEN35_VL = "Qwen3.5-VL"


def _qwen35_vl_provider_classes() -> tuple[type, ...]:
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider, Qwen35VLMoEModelProvider

    return (Qwen35VLModelProvider, Qwen35VLMoEModelProvider)


def looks_like_glm45(model: Any) -> bool:
    """The structure ``GLM45Bridge.provider_bridge`` gives (models/glm/glm45_bridge.py): grouped-query (not
    latent) attention with QKV bias and half-rotary RoPE, MoE with a sigmoid router, expert bias and
    sequence-level aux loss. DeepSeek-style models use latent attention; Qwen/Mixtral-style MoE use softmax."""
    return (
        bool(getattr(model, "num_moe_experts", None))
        and not getattr(model, "multi_latent_attention", False)
        and getattr(model, "moe_router_score_function", None) == "sigmoid"
        and getattr(model, "moe_router_enable_expert_bias", False) is True
        and getattr(model, "moe_router_load_balancing_type", None) == "seq_aux_loss"
        and getattr(model, "add_qkv_bias", False) is True
        and getattr(model, "rotary_percent", 1.0) == 0.5
    )


def detect_model_family(model: Any) -> str | None:
    """Family name for providers that need a packing opt-out, else None."""
    if isinstance(model, _qwen35_vl_provider_classes()):
        return QWEN35_VL
    if getattr(model, "experimental_attention_variant", None) == "gated_delta_net":
        return QWEN3_NEXT  # Qwen3-Next's hybrid GDN stack; its provider is a plain GPTModelProvider
    if looks_like_glm45(model):
        return GLM45
    return None
