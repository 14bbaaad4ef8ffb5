"""The config's model provider at CPU sizes, every switch kept.

The copy keeps what decides construction: the provider class and its ``provide()``, the layer spec, every per-layer
pattern, the parallel sizes the config declares (finalize's divisibility checks and the provider's own asserts read
them), attention kind, MoE routing, precision, CUDA-graph and recompute switches. It shrinks only sizes: hidden size,
MLP and expert widths, head dimension, head and expert counts (keeping every ratio and divisibility the config's
parallel sizes need), vocabulary, MLA ranks, and the layer count where no setting names layers one by one (one period
of each periodic setting, two layers per pipeline stage). Virtual pipeline stages cannot be
built in a one-rank world (the pipeline group has one stage, so ``get_model`` builds one chunk): the copy drops them
and says so (``followed``).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from mbridge_seqpack.moe_layers import routed_experts

__all__ = ["Shrunk", "shrunk_provider", "HIDDEN", "VOCAB"]

HIDDEN = 64
VOCAB = 256
HEAD_DIM = 16
FFN = 64
EXPERT_FFN = 32
MLA_RANK = 32


@dataclass
class Shrunk:
    """The shrunk copy and, in words, every switch it changed because the one-rank world follows from it."""

    provider: Any
    followed: list[str] = field(default_factory=list)


def _get(provider: Any, name: str) -> Any:
    return getattr(provider, name, None)


def _set(provider: Any, name: str, value: Any) -> None:
    if hasattr(provider, name) and getattr(provider, name) is not None:
        setattr(provider, name, value)


def _multiple(value: int, of: int) -> int:
    return -(-value // of) * of


def _heads(provider: Any, tp: int) -> None:
    """Fewer query groups (a multiple of TP that divides the config's), the same heads per group."""
    heads = _get(provider, "num_attention_heads")
    if not isinstance(heads, int) or heads <= 0:
        return
    groups = _get(provider, "num_query_groups") or heads
    if not isinstance(groups, int) or groups <= 0 or heads % groups:
        return
    fewer = next((g for g in range(tp, groups + 1, tp) if groups % g == 0), groups)
    provider.num_attention_heads = heads // groups * fewer
    if _get(provider, "num_query_groups") is not None:
        provider.num_query_groups = fewer


def _fewer_experts(provider: Any, ep: int) -> None:
    """Fewer experts, keeping top-k within reach of group-limited routing and a multiple of EP and of the groups."""
    experts = routed_experts(provider)
    if experts is None or experts <= 16:
        return
    topk = _get(provider, "moe_router_topk") or 1
    groups = _get(provider, "moe_router_num_groups") or 1
    group_topk = _get(provider, "moe_router_group_topk") or groups
    per_group = max(1, -(-topk // group_topk), -(-topk // groups))
    fewer = _multiple(max(groups * per_group, topk, 2), math.lcm(groups, ep))
    if fewer < experts:
        provider.num_moe_experts = fewer


#: per-layer settings: where one is a list (or a pipeline layout names layers), the layer count stays
_PER_LAYER = (
    "moe_layer_freq",
    "window_attn_skip_freq",
    "no_rope_freq",
    "linear_attention_freq",
    "cp_comm_type",
    "pipeline_model_parallel_layout",
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "hybrid_layer_pattern",
    "hybrid_override_pattern",
    "heterogeneous_layers_config_path",
)


def _layers(provider: Any) -> None:
    """Fewer layers where nothing names layers one by one: one period of every periodic setting (MoE, window, no-RoPE
    and linear-attention frequencies), at least two layers per pipeline stage."""
    layers = _get(provider, "num_layers")
    if not isinstance(layers, int) or layers <= 2:
        return
    periods = [1]
    for name in _PER_LAYER:
        value = _get(provider, name)
        if isinstance(value, bool) or value is None:
            continue
        if not isinstance(value, int):
            return  # a list, a pattern or a layout: every layer kept
        periods.append(max(1, value))
    pp = _get(provider, "pipeline_model_parallel_size") or 1
    fewer = math.lcm(2 * pp, *periods)
    if fewer < layers and layers % pp == 0:
        provider.num_layers = fewer


def shrunk_provider(provider: Any, scale: int = 1) -> Shrunk:
    """A deep copy of ``provider`` at CPU sizes (see the module docstring), every width ``scale`` times the smallest;
    the original is not touched."""
    copy_ = copy.deepcopy(provider)
    out = Shrunk(copy_)
    tp = _get(copy_, "tensor_model_parallel_size") or 1
    etp = _get(copy_, "expert_tensor_parallel_size") or tp
    ep = _get(copy_, "expert_model_parallel_size") or 1
    hidden, heads = _get(copy_, "hidden_size"), _get(copy_, "num_attention_heads")
    if _get(copy_, "kv_channels") is None and isinstance(hidden, int) and isinstance(heads, int) and heads:
        copy_.kv_channels = hidden // heads  # what finalize() derives, fixed before the hidden size shrinks
    if not _get(copy_, "mrope_section"):  # mRoPE's sections add up to half the head dimension
        _set(copy_, "kv_channels", min(copy_.kv_channels, HEAD_DIM * scale) if copy_.kv_channels else None)
    _heads(copy_, tp)
    _set(copy_, "hidden_size", HIDDEN * scale)
    _set(copy_, "ffn_hidden_size", _multiple(FFN * scale, 16 * tp))
    _set(copy_, "moe_ffn_hidden_size", _multiple(EXPERT_FFN * scale, 16 * etp))
    _set(copy_, "moe_shared_expert_intermediate_size", _multiple(EXPERT_FFN * scale, 16 * tp))
    _set(copy_, "q_lora_rank", MLA_RANK * scale)
    _set(copy_, "kv_lora_rank", MLA_RANK * scale)
    _fewer_experts(copy_, ep)
    _layers(copy_)
    if hasattr(copy_, "vocab_size"):  # setup() sets it from the tokenizer before the build, whatever the recipe had
        copy_.vocab_size = VOCAB * scale
    if _get(copy_, "virtual_pipeline_model_parallel_size"):
        out.followed.append(
            f"virtual_pipeline_model_parallel_size={copy_.virtual_pipeline_model_parallel_size} -> None (a one-rank "
            "world has one pipeline stage, so the model is built as one chunk)"
        )
        copy_.virtual_pipeline_model_parallel_size = None
    return out
