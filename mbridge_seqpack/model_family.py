"""Identify model families that Megatron-Bridge 0.6.2 ships with packing turned off.

Detection uses the provider class, the Hugging Face architecture recorded on the provider, or
the architectural feature that makes packing unsafe (gated-delta-net linear attention), never the
model's name or checkpoint id.
"""

from __future__ import annotations

from typing import Any

__all__ = ["QWEN3_NEXT", "GLM45", "QWEN35_VL", "detect_model_family", "HF_ARCHITECTURE_FAMILIES"]

QWEN3_NEXT = "Qwen3-Next"
GLM45 = "GLM-4.5"
QWEN35_VL = "Qwen3.5-VL"

HF_ARCHITECTURE_FAMILIES: dict[str, str] = {
    "Qwen3NextForCausalLM": QWEN3_NEXT,
    "Glm4MoeForCausalLM": GLM45,
    "Qwen3_5ForConditionalGeneration": QWEN35_VL,
    "Qwen3_5MoeForConditionalGeneration": QWEN35_VL,
}


def _qwen35_vl_provider_classes() -> tuple[type, ...]:
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider, Qwen35VLMoEModelProvider

    return (Qwen35VLModelProvider, Qwen35VLMoEModelProvider)


def detect_model_family(model: Any) -> str | None:
    """Family name for providers that need a packing opt-out, else None."""
    if isinstance(model, _qwen35_vl_provider_classes()):
        return QWEN35_VL
    for arch in getattr(model, "hf_architectures", None) or ():
        if arch in HF_ARCHITECTURE_FAMILIES:
            return HF_ARCHITECTURE_FAMILIES[arch]
    if getattr(model, "experimental_attention_variant", None) == "gated_delta_net":
        return QWEN3_NEXT  # Qwen3-Next's hybrid GDN stack; its provider is a plain GPTModelProvider
    return None
