"""Identify model families that Megatron-Bridge 0.6.2 ships with packing turned off, and the core attention a
provider's layer spec builds (Transformer Engine's, or one that refuses packed rows and CP).

Detection uses the provider class or the provider's structure, never the model's name or checkpoint id.
``AutoBridge`` (from a hub id or an in-code config) returns a plain ``GPTModelProvider``, so GLM-4.5 and
Qwen3-Next are recognised by the fields their bridges set, which are dataclass fields and so survive
``to_yaml``/``from_yaml``.
"""

from __future__ import annotations

import warnings
from typing import Any

from mbridge_seqpack.moe_layers import routed_experts

__all__ = [
    "QWEN3_NEXT",
    "GLM45",
    "QWEN35_VL",
    "PER_TOKEN_LOSS_UNDER_CP",
    "detect_model_family",
    "looks_like_glm45",
    "per_token_loss_after_finalize",
    "non_te_core_attention",
    "hybrid_layer_counts",
    "MAMBA",
    "GDN",
    "ATTENTION_SYMBOLS",
]

QWEN3_NEXT = "Qwen3-Next"
GLM45 = "GLM-4.5"
QWEN35_VL = "Qwen3.5-VL"


def _qwen35_vl_provider_classes() -> tuple[type, ...]:
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider, Qwen35VLMoEModelProvider

    return (Qwen35VLModelProvider, Qwen35VLMoEModelProvider)


#: providers whose ``finalize()`` turns per-token loss on whenever CP > 1 (models/qwen_vl/qwen3_vl_provider.py and
#: qwen35_vl_provider.py); ``ConfigContainer.validate`` finalizes the model before its CP assertions
PER_TOKEN_LOSS_UNDER_CP = (
    "Qwen3VLModelProvider",
    "Qwen3VLMoEModelProvider",
    "Qwen35VLModelProvider",
    "Qwen35VLMoEModelProvider",
)


def per_token_loss_after_finalize(model: Any, cp: int) -> bool:
    """``model.calculate_per_token_loss`` as Megatron-Bridge's validate() will see it: the Qwen3-VL / Qwen3.5-VL
    providers set it themselves at CP > 1, so a recipe that leaves it False still trains with per-token loss."""
    if getattr(model, "calculate_per_token_loss", False):
        return True
    forced = cp > 1 and any(
        klass.__name__ in PER_TOKEN_LOSS_UNDER_CP and klass.__module__.startswith("megatron.bridge.models.qwen_vl")
        for klass in type(model).__mro__
    )
    return forced


def looks_like_glm45(model: Any) -> bool:
    """The structure ``GLM45Bridge.provider_bridge`` gives (models/glm/glm45_bridge.py): grouped-query (not
    latent) attention with QKV bias and half-rotary RoPE, MoE with a sigmoid router, expert bias and
    sequence-level aux loss. DeepSeek-style models use latent attention; Qwen/Mixtral-style MoE use softmax."""
    return (
        routed_experts(model) is not None
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


def _core_attention_classes(model: Any) -> set[type]:
    """The core-attention classes the provider's layer spec builds (empty when the spec cannot be resolved
    offline: then nothing is claimed)."""
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    spec = getattr(model, "transformer_layer_spec", None)
    if callable(spec) and not isinstance(spec, ModuleSpec):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                spec = spec(model)
        except Exception:  # noqa: BLE001 - a spec that needs the finalized model or a GPU says nothing here
            return set()
    layers = spec.layer_specs if isinstance(spec, TransformerBlockSubmodules) else [spec]
    found: set[type] = set()
    for layer in layers:
        attention = getattr(getattr(layer, "submodules", None), "self_attention", None)
        core = getattr(getattr(attention, "submodules", None), "core_attention", None)
        core = getattr(core, "module", core)
        if isinstance(core, type):
            found.add(core)
    return found


def non_te_core_attention(model: Any) -> list[str]:
    """Names of the core-attention classes in the layer spec that are not Transformer Engine's: Megatron-Core's
    local DotProductAttention and Gemma-2's own both refuse packed (THD) input and context parallelism."""
    try:
        from megatron.core.extensions.transformer_engine import TEDotProductAttention
    except ImportError:
        return []
    return sorted(c.__name__ for c in _core_attention_classes(model) if not issubclass(c, TEDotProductAttention))


MAMBA, GDN = "M", "G"  # megatron/core/models/hybrid/hybrid_layer_allocation.py Symbols
#: the symbols of layers with core attention there (ATTENTION, DS_ATTENTION, MLA)
ATTENTION_SYMBOLS = ("*", "D", "+")


def hybrid_layer_counts(model: Any) -> dict[str, int]:
    """Layers by type symbol a hybrid provider builds (main pattern and MTP depths), by Megatron-Core's own parser of
    ``hybrid_layer_pattern`` (HybridModelProvider.finalize moves the deprecated override pattern there; provide()
    passes the pattern alone, never the deprecated ratios); {} for other providers, no pattern, or a pattern
    Megatron will refuse itself."""
    from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider
    from megatron.core.models.hybrid.hybrid_layer_allocation import get_hybrid_layer_counts

    if not isinstance(model, HybridModelProvider):
        return {}
    from mbridge_seqpack.moe_layers import hybrid_pattern

    pattern = hybrid_pattern(model)
    if pattern is None:
        return {}
    try:
        return dict(get_hybrid_layer_counts(pattern))
    except (AssertionError, ValueError):
        return {}
