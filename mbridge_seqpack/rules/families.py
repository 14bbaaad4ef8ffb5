"""Model families whose own code decides what packing does: VLM collators that refuse packing, Mamba layers that
need a per-token sequence index, MoE routers that count every token they are given."""

from __future__ import annotations

from typing import Any

from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import rule

#: providers whose registered collate (data/collators/registry.py, keyed by HF processor type) or step refuses
#: in-batch packing: (module, class) -> that processor's name
_MODELS = "megatron.bridge.models"
REFUSING_COLLATE_FAMILIES = {
    (f"{_MODELS}.nemotron_vl.nemotron_vl_provider", "NemotronVLModelProvider"): "NemotronNanoVLV2Processor",
    (f"{_MODELS}.qwen_omni.qwen3_omni_provider", "Qwen3OmniModelProvider"): "Qwen3OmniMoeProcessor",
}


def _refusing_collate_families() -> dict[type, str]:
    """The provider classes of ``REFUSING_COLLATE_FAMILIES`` this installation has (a family whose module does not
    import, e.g. for a missing optional dependency, cannot be the model either)."""
    import importlib

    found = {}
    for (module, name), processor in REFUSING_COLLATE_FAMILIES.items():
        try:
            found[getattr(importlib.import_module(module), name)] = processor
        except (ImportError, AttributeError):
            continue
    return found


@rule(
    "vlm.collate_refuses_packing",
    "Nemotron Nano VL V2 and Qwen3-Omni cannot use in-batch packing (their collate and step refuse it).",
    severity=ERROR,
    evidence=(
        "megatron/bridge/data/datasets/direct_sft.py DirectSFTDataset picks the collate registered for the HF "
        "processor type (data/collators/registry.py): models/nemotron_vl/data/collate_fn.py "
        "nemotron_nano_v2_vl_collate_fn raises 'Nemotron-VL collation does not support in-batch packing' and "
        "models/qwen_omni/data/collate_fn.py qwen3_omni_collate_fn 'Qwen3-Omni does not support in-batch packing' "
        "(both run on CPU) at the first batch; deferring to the step does not help: training/vlm_step.py raises "
        "'vlm_step requires collate-time in-batch packing' and models/qwen_omni/qwen3_omni_step.py "
        "NotImplementedError. recipes/common.py _sft_common_vlm / _peft_common_vlm turn packing on; the "
        "Nemotron-VL and Qwen3-Omni recipes turn it off again."
    ),
)
def collate_refuses_packing(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.in_batch_packing:
        return None
    families = _refusing_collate_families().items()
    processor = next((name for klass, name in families if isinstance(ctx.model, klass)), None)
    if processor is None:
        return []
    return [
        Violation(
            {"model": type(ctx.model).__name__, "dataset.enable_in_batch_packing": True},
            f"the collate registered for {processor} raises on in-batch packing at the first batch (and the step "
            "refuses packing deferred to it)",
            assignments={"dataset.enable_in_batch_packing": False},
        )
    ]


def _has_mamba_layers(model: Any) -> bool:
    """Whether a hybrid provider builds Mamba layers: 'M' in its layer pattern (before any MTP part), or no pattern
    and attention/MLP ratios that leave layers to Mamba (megatron/core/models/hybrid/hybrid_layer_allocation.py)."""
    pattern = getattr(model, "hybrid_layer_pattern", None) or getattr(model, "hybrid_override_pattern", None)
    if isinstance(pattern, str):
        return "M" in pattern.split("/")[0]
    ratios = (getattr(model, "hybrid_attention_ratio", 0.0) or 0.0) + (getattr(model, "hybrid_mlp_ratio", 0.0) or 0.0)
    return ratios < 1.0


@rule(
    "mamba.packing_needs_hybrid",
    "Packed rows through Mamba layers need model.is_hybrid_model=True (else SSM state flows across documents).",
    severity=ERROR,
    evidence=(
        "megatron/bridge/training/gpt_step.py _forward_step_common (also vlm_step.py, llava_step.py) sets "
        "packed_seq_params total_tokens only when config.is_hybrid_model; megatron/core/packed_seq_params.py "
        "PackedSeqParams.__post_init__ builds seq_idx only from total_tokens, and "
        "megatron/core/ssm/mamba_mixer.py MambaMixer._ssm_training passes packed_seq_params.seq_idx to "
        "mamba_split_conv1d_scan_combined: with seq_idx None the scan and conv carry state from one document into "
        "the next, silently. HybridModelProvider (and MambaModelProvider) default is_hybrid_model to False; "
        "Megatron-Bridge's Nemotron-H bridge and recipes set it."
    ),
)
def packing_needs_hybrid(ctx: RuleContext) -> list[Violation] | None:
    from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider

    if not ctx.any_packing or not isinstance(ctx.model, HybridModelProvider) or not _has_mamba_layers(ctx.model):
        return None
    if getattr(ctx.model, "is_hybrid_model", False):
        return []
    return [
        Violation(
            {"model": type(ctx.model).__name__, "model.is_hybrid_model": False, **ctx.packing_flags},
            "without is_hybrid_model the step gives the packed params no total_tokens, so no seq_idx: Mamba's scan "
            "and convolution run through every document boundary of a packed row",
            assignments={"model.is_hybrid_model": True},
        )
    ]


def _router_counts_tokens(model: Any) -> list[str]:
    """The router terms that average over every token they get (aux losses, z-loss, expert bias, capacity)."""
    found = []
    coeff = getattr(model, "moe_aux_loss_coeff", 0.0)
    coeffs = coeff if isinstance(coeff, (list, tuple)) else [coeff]
    if any(isinstance(c, (int, float)) and c > 0 for c in coeffs):
        found.append("moe_aux_loss_coeff")
    if getattr(model, "moe_z_loss_coeff", None):
        found.append("moe_z_loss_coeff")
    if getattr(model, "moe_router_enable_expert_bias", False):
        found.append("moe_router_enable_expert_bias")
    if getattr(model, "moe_expert_capacity_factor", None) is not None:
        found.append("moe_expert_capacity_factor")
    return found


@rule(
    "moe.router_counts_padding",
    "MoE routers count the padding of full-width rows in their load-balancing statistics.",
    severity=ADVISORY,
    evidence=(
        "megatron/core/transformer/moe/router.py TopKRouter.routing excludes padding from the aux / z losses, "
        "expert-bias counts and token totals only when given padding_mask (moe/moe_utils.py "
        "switch_load_balancing_loss_func, z_loss_func, get_tokens_per_expert_and_token_count); "
        "megatron/core/models/gpt/gpt_model.py GPTModel.forward takes padding_mask, but "
        "megatron/bridge/training/gpt_step.py _forward_step_common never passes one, so pad tokens are routed and "
        "counted like text (and take expert capacity). Rows padded to full width (pad_to_max_length, which "
        "Megatron-Bridge sets itself under PP>1 / EP>1 for HF/VLM datasets) can be mostly padding. Nothing fails; "
        "the balance statistics are skewed: an advisory. Packed rows are computed instead by "
        "equivalence.router_padding (an error: the unpacked sequences it compares with have no padding), so this "
        "rule leaves them to it."
    ),
)
def router_counts_padding(ctx: RuleContext) -> list[Violation] | None:
    experts = getattr(ctx.model, "num_moe_experts", None)
    # packed rows: equivalence.router_padding routes them through Megatron-Core's router and measures the padding
    if not isinstance(experts, int) or experts <= 1 or ctx.any_packing or not ctx.fixed_width_rows:
        return None
    terms = _router_counts_tokens(ctx.model)
    if not terms:
        return []
    return [
        Violation(
            {"model.num_moe_experts": experts, ctx.pad_to_max_length_path: True, "router terms": terms},
            "every row is padded to seq_length and Megatron-Bridge gives the router no padding_mask: pad tokens "
            "count in the load-balancing loss, expert bias and capacity like text",
            fix="pack the rows (dataset.enable_offline_packing / enable_in_batch_packing) or leave them "
            "variable-width where the layout allows; Megatron-Bridge 0.6.2 has no setting that masks padding in the "
            "router",
        )
    ]
