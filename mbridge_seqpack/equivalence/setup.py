"""What of a config decides the packed-vs-unpacked outcome: read once per check, hashable (the cache key).

Only fields the pack, the collate, the step, the MTP roll and the router read are kept, so two configs that differ
elsewhere share one computed verdict.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from mbridge_seqpack.moe_layers import routed_experts

__all__ = ["AUX_LOSS_TYPES", "Router", "Setup", "setup_of", "in_batch_multiple", "correction_covers"]

#: the load-balancing types whose loss TopKRouter computes (transformer/moe/router.py _apply_*aux_loss)
AUX_LOSS_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss")


@dataclass(frozen=True)
class Router:
    """The MoE router settings Megatron-Core's ``TopKRouter`` reads (``None`` stands for a dense model)."""

    experts: int
    topk: int
    score_function: str
    load_balancing_type: str
    aux_loss_coeff: float | tuple[float, ...]
    z_loss_coeff: float | None
    expert_bias: bool
    capacity_factor: float | None
    drop_policy: str
    pad_to_capacity: bool
    num_groups: int | None
    group_topk: int | None
    pre_softmax: bool
    topk_scaling_factor: float | None
    per_token_loss: bool
    #: the step hands the router the packed rows' padding mask (the opt-in correction router_padding_mask is in
    #: effect for the process that trains and covers this config: corrections/router_padding.py)
    padding_mask: bool = False

    @property
    def counting_terms(self) -> list[str]:
        """The router terms that average over, or count, every token they get."""
        coeffs = self.aux_loss_coeff if isinstance(self.aux_loss_coeff, tuple) else (self.aux_loss_coeff,)
        kinds = (
            self.load_balancing_type if isinstance(self.load_balancing_type, tuple) else (self.load_balancing_type,)
        )
        terms = []
        # TopKRouter.get_aux_loss_coeff: a coefficient applies only to an aux-loss type the balancing type names
        if any(c > 0 for c in coeffs) and any(k in AUX_LOSS_TYPES for k in kinds):
            terms.append("moe_aux_loss_coeff")
        if self.z_loss_coeff:
            terms.append("moe_z_loss_coeff")
        if self.expert_bias:
            terms.append("moe_router_enable_expert_bias")
        if self.capacity_factor is not None:
            terms.append("moe_expert_capacity_factor")
        return terms


@dataclass(frozen=True)
class Setup:
    """One config's packing, collate and model features, as the check runs them."""

    mode: str  # "offline" | "in_batch"
    pad_seq_to_mult: int  # offline: the prep's and collate's alignment multiple; in-batch: the collate's
    pad_cu_seqlens: bool
    fixed_width: bool  # rows padded to the full width (pad_to_max_length)
    row_mult: int  # variable-width rows: the width rounds up to this (dataset_kwargs pad_seq_length_to_mult)
    answer_only_loss: bool
    chat: bool
    micro_batch: int
    cp: int
    mtp_layers: int
    mtp_loss_scale: float
    per_token_loss: bool
    router: Router | None
    vlm_step: bool = False  # training/vlm_step.py passes the loss mask to the model (gpt_step does not)


def in_batch_multiple(cp: int, tp: int, sequence_parallel: bool) -> int:
    """The per-sequence multiple ``ConfigContainer.validate`` gives in-batch packing
    (training/config.py: ``in_batch_packing_pad_to_multiple_of = lcm(2*CP if CP>1, TP if SP and TP>1)``)."""
    cp_multiple = 2 * cp if cp > 1 else 1
    sp_multiple = cp * tp if sequence_parallel and tp > 1 else 1
    return math.lcm(cp_multiple, sp_multiple)


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _router_of(model: Any) -> Router | None:
    experts = routed_experts(model)
    if experts is None:
        return None
    coeff = getattr(model, "moe_aux_loss_coeff", 0.0)
    coeffs = tuple(_number(c, 0.0) for c in coeff) if isinstance(coeff, (list, tuple)) else _number(coeff, 0.0)
    z_loss = getattr(model, "moe_z_loss_coeff", None)
    capacity = getattr(model, "moe_expert_capacity_factor", None)
    return Router(
        experts=experts,
        topk=int(getattr(model, "moe_router_topk", 2) or 2),
        score_function=str(getattr(model, "moe_router_score_function", "softmax") or "softmax"),
        load_balancing_type=_balancing(getattr(model, "moe_router_load_balancing_type", "aux_loss")),
        aux_loss_coeff=coeffs,
        z_loss_coeff=_number(z_loss, 0.0) or None,
        expert_bias=bool(getattr(model, "moe_router_enable_expert_bias", False)),
        capacity_factor=None if capacity is None else _number(capacity, 1.0),
        drop_policy=str(getattr(model, "moe_token_drop_policy", "probs") or "probs"),
        pad_to_capacity=bool(getattr(model, "moe_pad_expert_input_to_capacity", False)),
        num_groups=getattr(model, "moe_router_num_groups", None),
        group_topk=getattr(model, "moe_router_group_topk", None),
        pre_softmax=bool(getattr(model, "moe_router_pre_softmax", False)),
        topk_scaling_factor=getattr(model, "moe_router_topk_scaling_factor", None),
        per_token_loss=bool(getattr(model, "calculate_per_token_loss", False)),
        padding_mask=correction_covers(model),
    )


def correction_covers(model: Any) -> bool:
    """Whether the step of the process that trains hands the router a padding mask: the correction
    ``router_padding_mask`` is installed here or at launch, and covers this model config."""
    from mbridge_seqpack.corrections import router_padding

    return router_padding.state().in_effect and router_padding.uncovered(model) is None


def _balancing(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _runtime_kwargs(dataset: Any) -> dict[str, Any]:
    """The dataset kwargs the GPT SFT builder runs with (its ``preprocessing`` config folded in by Megatron-Bridge's
    own ``normalize_gpt_sft_dataset_kwargs``); the plain ``dataset_kwargs`` where that refuses the config (another
    rule then names why)."""
    from megatron.bridge.data.builders import GPTSFTDatasetConfig

    plain = dict(getattr(dataset, "dataset_kwargs", None) or {})
    if not isinstance(dataset, GPTSFTDatasetConfig):
        return plain
    from megatron.bridge.data.builders.gpt_sft import normalize_gpt_sft_dataset_kwargs

    try:
        return dict(normalize_gpt_sft_dataset_kwargs(copy.copy(dataset)))
    except (ValueError, TypeError, AssertionError, AttributeError):
        return plain


def setup_of(cfg: Any) -> Setup | None:
    """The check's view of ``cfg``; None where it builds no packed rows the check can make (no packing, Energon's
    online packing, a custom dataset)."""
    from megatron.bridge.data.builders import DirectHFSFTDatasetConfig, GPTSFTDatasetConfig
    from megatron.bridge.data.builders.mock_vlm_sft import MockVLMSFTDatasetConfig

    in_batch_kinds = (DirectHFSFTDatasetConfig, MockVLMSFTDatasetConfig)

    dataset, model = cfg.dataset, cfg.model
    kwargs = _runtime_kwargs(dataset)
    cp = int(getattr(model, "context_parallel_size", 1) or 1)
    tp = int(getattr(model, "tensor_model_parallel_size", 1) or 1)
    common = dict(
        micro_batch=int(getattr(cfg.train, "micro_batch_size", 1) or 1),
        cp=cp,
        mtp_layers=int(getattr(model, "mtp_num_layers", None) or 0),
        mtp_loss_scale=_number(getattr(model, "mtp_loss_scaling_factor", 0.1), 0.1),
        per_token_loss=bool(getattr(model, "calculate_per_token_loss", False)),
        router=_router_of(model),
    )
    if isinstance(dataset, GPTSFTDatasetConfig) and getattr(dataset, "enable_offline_packing", False):
        specs = getattr(dataset, "offline_packing_specs", None)
        if specs is None or not isinstance(getattr(specs, "pad_seq_to_mult", 1), int):
            return None
        fixed = getattr(dataset, "pad_to_max_length", False) is True or kwargs.get("pad_to_max_length") is True
        return Setup(
            mode="offline",
            pad_seq_to_mult=max(1, specs.pad_seq_to_mult),
            pad_cu_seqlens=bool(specs.pad_cu_seqlens),
            fixed_width=bool(fixed),
            row_mult=int(kwargs.get("pad_seq_length_to_mult", 16) or 1),
            answer_only_loss=bool(kwargs.get("answer_only_loss", True)),
            chat=bool(kwargs.get("chat", False)),
            **common,
        )
    if getattr(dataset, "enable_in_batch_packing", False) is True:
        if getattr(dataset, "defer_in_batch_packing_to_step", False) or not isinstance(dataset, in_batch_kinds):
            return None
        return Setup(
            mode="in_batch",
            pad_seq_to_mult=in_batch_multiple(cp, tp, bool(getattr(model, "sequence_parallel", False))),
            pad_cu_seqlens=False,
            fixed_width=False,
            row_mult=1,
            answer_only_loss=True,
            chat=True,
            vlm_step=isinstance(dataset, MockVLMSFTDatasetConfig),
            **common,
        )
    return None
