"""Rotary-embedding options Megatron-Core refuses at the first forward: the fused single-QKV RoPE kernel, which packed
rows (and QK layernorm, layers without RoPE) turn off under it, and interleaved YaRN."""

from __future__ import annotations

from typing import Any

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.field_types import BOOL, OPTIONAL_NAME, UNCHECKED
from mbridge_seqpack.rules.registry import rule

#: position embeddings for which GPTModel computes a rotary_pos_emb (models/gpt/gpt_model.py GPTModel.__init__)
ROTARY_TYPES = ("rope", "yarn", "mrope")


def _split_qkv_reasons(ctx: RuleContext) -> dict[str, Any]:
    """The fields that make Attention.forward split Q, K and V (split_qkv=True) in a self-attention layer."""
    m = ctx.model
    found: dict[str, Any] = dict(ctx.packing_flags)
    if getattr(m, "qk_layernorm", False):
        found["model.qk_layernorm"] = True
    kind = getattr(m, "position_embedding_type", None)
    if kind not in ROTARY_TYPES:
        found["model.position_embedding_type"] = kind
    if getattr(m, "no_rope_freq", None):
        found["model.no_rope_freq"] = m.no_rope_freq
    if getattr(m, "flash_decode", False):
        found["model.flash_decode"] = True
    return found


@rule(
    "rope.fused_single_qkv",
    "fused_single_qkv_rope needs unpacked rows, RoPE in every layer, no QK layernorm and no flash decode.",
    severity=ERROR,
    evidence=(
        "megatron/core/transformer/attention.py Attention.forward sets split_qkv=True unless every condition of the "
        "fused QKV-RoPE kernel holds (packed_seq_params is None, a rotary_pos_emb for the layer, no flash_decode, no "
        "Q/K layernorm, ...) and then asserts 'fused_single_qkv_rope requested but not available/supported for the "
        "config.' for every self-attention layer at the first forward (run on CPU). The steps pass packed_seq_params "
        "for every packed batch; TransformerConfig refuses only fused_single_qkv_rope with gated attention."
    ),
    reads={
        "dataset.enable_offline_packing": BOOL,
        "model.flash_decode": UNCHECKED,
        "model.fused_single_qkv_rope": BOOL,
        "model.multi_latent_attention": UNCHECKED,
        "model.no_rope_freq": UNCHECKED,
        "model.position_embedding_type": OPTIONAL_NAME,
        "model.qk_layernorm": BOOL,
    },
)
def fused_single_qkv(ctx: RuleContext) -> list[Violation] | None:
    if not getattr(ctx.model, "fused_single_qkv_rope", False) or getattr(ctx.model, "multi_latent_attention", False):
        return None
    reasons = _split_qkv_reasons(ctx)
    if not reasons:
        return []
    return [
        Violation(
            {"model.fused_single_qkv_rope": True, **reasons},
            "each of these makes self-attention split Q, K and V, where the fused single-QKV RoPE kernel cannot run: "
            "every attention layer asserts at the first forward",
            assignments={"model.fused_single_qkv_rope": False},
        )
    ]


@rule(
    "rope.yarn_not_interleaved",
    "YaRN RoPE cannot use rotary_interleaved.",
    severity=ERROR,
    evidence=(
        "megatron/core/models/common/embeddings/yarn_rotary_pos_embedding.py YarnRotaryEmbedding.get_emb asserts "
        "'Yarn RoPE does not support interleaved rotary embeddings' at the first forward (run on CPU); "
        "TransformerConfig refuses rotary_interleaved only with multi-latent attention or RoPE fusion."
    ),
    reads={"model.position_embedding_type": OPTIONAL_NAME, "model.rotary_interleaved": BOOL},
)
def yarn_not_interleaved(ctx: RuleContext) -> list[Violation] | None:
    if getattr(ctx.model, "position_embedding_type", None) != "yarn":
        return None
    if not getattr(ctx.model, "rotary_interleaved", False):
        return []
    return [
        Violation(
            {"model.position_embedding_type": "yarn", "model.rotary_interleaved": True},
            "YaRN's embedding refuses interleaved rotary dimensions: the first forward asserts",
            assignments={"model.rotary_interleaved": False},
        )
    ]


def _qwen3_vl_providers() -> tuple[type, ...]:
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLModelProvider, Qwen3VLMoEModelProvider
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider, Qwen35VLMoEModelProvider

    return (Qwen3VLModelProvider, Qwen3VLMoEModelProvider, Qwen35VLModelProvider, Qwen35VLMoEModelProvider)


@rule(
    "rope.qwen3_vl_no_fusion",
    "Qwen3-VL / Qwen3.5-VL need apply_rope_fusion=False.",
    severity=ERROR,
    evidence=(
        "megatron/bridge/models/qwen_vl/modelling_qwen3_vl/rope.py apply_rotary_pos_emb_absolute (called by "
        "Qwen3VLSelfAttention in every language layer) asserts 'apply_rope_fusion is not supported for Qwen3-VL / "
        "Qwen3.5-VL models' at the first forward (run on CPU). The providers default it to False, but their provide() "
        "builds the language model from the provider itself without GPTModelProvider.provide's "
        "validate_rope_fusion_compatibility reset, so an override that turns it on reaches the assertion."
    ),
    reads={"model.apply_rope_fusion": BOOL},
)
def qwen3_vl_no_fusion(ctx: RuleContext) -> list[Violation] | None:
    if not isinstance(ctx.model, _qwen3_vl_providers()):
        return None
    if not getattr(ctx.model, "apply_rope_fusion", False):
        return []
    return [
        Violation(
            {"model": type(ctx.model).__name__, "model.apply_rope_fusion": True},
            "Qwen3-VL's attention applies per-token absolute rotary frequencies that TE's fused kernel cannot take: "
            "every language layer asserts at the first forward",
            assignments={"model.apply_rope_fusion": False},
        )
    ]
