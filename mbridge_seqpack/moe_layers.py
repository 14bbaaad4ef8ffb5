"""Which layers of a model are mixture-of-experts, decided once as Megatron-Core 0.19.2 builds them.

The rules, the equivalence setup, the router-padding correction, the capture verdicts and the model-family detection
all ask "is this MoE, with how many experts, and is some layer dense"; they read it here so that they agree.
Megatron-Core builds a ``MoELayer`` wherever ``num_moe_experts`` is set (gpt_layer_specs.py get_mlp_module_spec:
``num_experts is not None``; TransformerConfig refuses 0 and below) on the layers ``moe_layer_freq`` marks
(experimental_attention_variant_module_specs.py get_moe_layer_pattern: an int N puts MoE on every N-th layer from the
first, a list is the pattern itself); a hybrid model's layers are its pattern string's symbols (hybrid_layer_allocation
Symbols: ``E`` MoE, ``-`` dense MLP) and ``moe_layer_freq`` plays no part there. Nothing here imports Megatron."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MoeLayers", "moe_layers", "routed_experts", "hybrid_pattern", "MOE_SYMBOL", "MLP_SYMBOL"]

MOE_SYMBOL, MLP_SYMBOL = "E", "-"  # megatron/core/models/hybrid/hybrid_layer_allocation.py Symbols.MOE / .MLP


@dataclass(frozen=True)
class MoeLayers:
    """A model's MoE structure: the routed experts of each MoE layer (None: no MoE layer is built), the per-layer
    pattern of a GPT decoder (1 MoE, 0 dense; None where the layer count or a hybrid pattern decides otherwise), and
    whether some layer has a dense MLP."""

    experts: int | None
    pattern: tuple[int, ...] | None
    dense_mlp: bool


def hybrid_pattern(model: Any) -> str | None:
    """A hybrid model's layer pattern (``hybrid_layer_pattern``, else the deprecated ``hybrid_override_pattern``
    that HybridModelProvider.finalize moves there); None for other models."""
    pattern = getattr(model, "hybrid_layer_pattern", None) or getattr(model, "hybrid_override_pattern", None)
    return pattern if isinstance(pattern, str) else None


def _configured_experts(model: Any) -> int | None:
    """``num_moe_experts`` as a count: an int of 1 or more; a bool, a string or 0 builds no expert."""
    experts = getattr(model, "num_moe_experts", None)
    return experts if isinstance(experts, int) and not isinstance(experts, bool) and experts >= 1 else None


def _freq_pattern(freq: Any, num_layers: Any) -> tuple[int, ...] | None:
    if isinstance(freq, list):
        return tuple(freq)
    if isinstance(freq, int) and isinstance(num_layers, int) and freq > 0 and num_layers > 0:
        return tuple(1 if i % freq == 0 else 0 for i in range(num_layers))
    return None


def moe_layers(model: Any) -> MoeLayers:
    """The MoE structure Megatron-Core builds for ``model`` (a provider or TransformerConfig)."""
    experts = _configured_experts(model)
    hybrid = hybrid_pattern(model)
    if hybrid is not None:
        symbols = hybrid.replace("|", "").replace("/", "")
        return MoeLayers(experts if MOE_SYMBOL in symbols else None, None, MLP_SYMBOL in symbols)
    if experts is None:
        return MoeLayers(None, None, True)
    freq = getattr(model, "moe_layer_freq", 1)
    pattern = _freq_pattern(freq, getattr(model, "num_layers", None))
    if pattern is not None:
        return MoeLayers(experts if 1 in pattern else None, pattern, 0 in pattern)
    # no layer count: TransformerConfig's own reading of the frequency (its mixed dense/MoE test in __post_init__)
    return MoeLayers(experts, None, isinstance(freq, int) and freq > 1)


def routed_experts(model: Any) -> int | None:
    """The experts each MoE layer routes to; None when the model builds no MoE layer."""
    return moe_layers(model).experts
