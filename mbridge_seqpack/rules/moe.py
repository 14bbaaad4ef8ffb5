"""Mixture-of-experts options Megatron-Core 0.19.2 refuses after the model is built: quantile balancing over token
counts it cannot split evenly, MoE with TP but no sequence parallelism, flex dispatchers without an expert-parallel
group, and router / expert option pairs its __post_init__ does not check."""

from __future__ import annotations

import math
from typing import Any

from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import DATASET_KWARGS_READS, MOE_READS, TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import (
    ANY_INT,
    BOOL,
    OPTIONAL_MICRO_BATCH,
    OPTIONAL_NAME,
    OPTIONAL_NAMES,
    OPTIONAL_NUMBERS,
    OPTIONAL_POSITIVE_INT,
    POSITIVE_INT,
    UNCHECKED,
)
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.row_widths import row_widths, width_fix


def _aux_loss_coeffs(model: Any) -> list[float]:
    coeff = getattr(model, "moe_aux_loss_coeff", 0.0)
    return [c for c in (coeff if isinstance(coeff, (list, tuple)) else [coeff]) if isinstance(c, (int, float))]


@rule(
    "moe.quantile_balancing_tokens",
    "Quantile-balancing routing needs every micro batch's token count x top-k to divide by the number of experts.",
    severity=ERROR,
    evidence=(
        "megatron/core/transformer/moe/router.py TopKRouter.quantile_balancing gathers the micro batch's router "
        "logits over TP x CP and calls moe/moe_utils.py qb_dual_update, which asserts 'Quantile balancing requires "
        "the number of routed assignments (N tokens * top-k) to be divisible by E experts' at every training "
        "forward (run on CPU). The token count is the micro batch's: packed rows are as wide as their content "
        "rounded up to pad_seq_length_to_mult, unpacked batches as their longest row rounded up, collate-packed "
        "rows the sum of sequences padded to the CP/SP multiple; a width that is not a multiple of "
        "experts / gcd(top-k, experts) fails at the first such batch."
    ),
    reads={
        **DATASET_KWARGS_READS,
        "dataset.enable_offline_packing": BOOL,
        "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
        "dataset.pad_to_multiple_of": POSITIVE_INT,
        "dataset.seq_length": POSITIVE_INT,
        "model.moe_router_load_balancing_type": OPTIONAL_NAMES,
        "model.moe_router_topk": OPTIONAL_POSITIVE_INT,
        **MOE_READS,
        "model.seq_length": POSITIVE_INT,
        "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
    },
)
def quantile_balancing_tokens(ctx: RuleContext) -> list[Violation] | None:
    experts = ctx.moe.experts
    if experts is None or getattr(ctx.model, "moe_router_load_balancing_type", None) != "quantile_balancing":
        return None
    widths = row_widths(ctx)
    topk = getattr(ctx.model, "moe_router_topk", 2)
    if widths is None or not isinstance(topk, int) or topk < 1:
        return None
    need = experts // math.gcd(topk, experts)
    if widths.tokens_divisible(need):
        return []
    per_width = need // math.gcd(need, widths.rows)
    if ctx.in_batch_packing:
        fix: dict[str, object] = {"dataset.enable_in_batch_packing": False}
    else:
        fix = width_fix(ctx, widths.fields, per_width)
    return [
        Violation(
            {
                "model.moe_router_load_balancing_type": "quantile_balancing",
                "model.num_moe_experts": experts,
                "model.moe_router_topk": topk,
                "train.micro_batch_size": ctx.train.micro_batch_size,
                **widths.fields,
            },
            f"the router splits each micro batch's tokens x {topk} evenly over {experts} experts, so every micro "
            f"batch must hold a multiple of {need} tokens; these rows are as wide as "
            f"{' or '.join(str(g) for g in widths.generators)} multiples and fail the router's assertion",
            assignments=fix,
        )
    ]


@rule(
    "moe.tp_needs_sequence_parallel",
    "MoE layers with TP>1 need sequence_parallel=True in training.",
    severity=ERROR,
    evidence=(
        "megatron/core/transformer/moe/moe_layer.py MoELayer.forward raises ValueError 'During training, performance "
        "may degrade if MoE and tensor parallelism are enabled without also enabling sequence parallelism.' at the "
        "first training forward whenever the attention TP group is larger than 1 and sequence_parallel is off (run on "
        "CPU; 'performance' is the reason for the check, NVIDIA/Megatron-LM#1587, but it raises); "
        "megatron/core/model_parallel_config.py only warns (and only with EP>1), and Megatron-Bridge checks nothing."
    ),
    reads={**TOPOLOGY_READS, **MOE_READS},
)
def tp_needs_sequence_parallel(ctx: RuleContext) -> list[Violation] | None:
    if ctx.moe.experts is None or ctx.topology.tp == 1:
        return None
    if ctx.topology.sequence_parallel:
        return []
    return [
        Violation(
            {
                "model.num_moe_experts": ctx.moe.experts,
                "model.tensor_model_parallel_size": ctx.topology.tp,
                "model.sequence_parallel": False,
            },
            "every MoE layer raises at the first training forward when tensor parallelism runs without sequence "
            "parallelism",
            assignments={"model.sequence_parallel": True},
        )
    ]


@rule(
    "moe.flex_dispatcher_parallel",
    "The flex token dispatcher with the DeepEP or NCCL-EP backend needs expert TP x EP > 1.",
    severity=ERROR,
    evidence=(
        "megatron/core/transformer/moe/token_dispatcher.py MoEFlexTokenDispatcher.__init__ asserts 'DeepEP dispatcher "
        "requires TPxEP > 1' / 'NCCL EP dispatcher requires TPxEP > 1' (its tp is the expert TP group) when the model "
        "is built; TransformerConfig.__post_init__ checks the backend against the dispatcher type, not the sizes."
    ),
    reads={
        **TOPOLOGY_READS,
        "model.moe_flex_dispatcher_backend": OPTIONAL_NAME,
        "model.moe_token_dispatcher_type": OPTIONAL_NAME,
        **MOE_READS,
    },
)
def flex_dispatcher_parallel(ctx: RuleContext) -> list[Violation] | None:
    m = ctx.model
    if ctx.moe.experts is None or getattr(m, "moe_token_dispatcher_type", None) != "flex":
        return None
    backend = getattr(m, "moe_flex_dispatcher_backend", "deepep")
    if backend not in ("deepep", "ncclep"):
        return None
    topo = ctx.topology
    if topo.expert_tensor_parallel * topo.ep > 1:
        return []
    return [
        Violation(
            {
                "model.moe_token_dispatcher_type": "flex",
                "model.moe_flex_dispatcher_backend": backend,
                "model.expert_model_parallel_size": topo.ep,
                "model.expert_tensor_parallel_size": topo.expert_tensor_parallel,
            },
            f"the {backend} dispatcher exchanges tokens across expert ranks and refuses a single one: the model fails "
            "when it is built",
            assignments={"model.moe_token_dispatcher_type": "alltoall"},
        )
    ]


def _router_conflicts(m: Any) -> list[tuple[str, str, dict[str, object]]]:
    """(what, Megatron's assertion, fix) for each router / expert option pair Megatron-Core refuses."""
    found = []
    kind = getattr(m, "moe_router_load_balancing_type", None)
    aux = any(c > 0 for c in _aux_loss_coeffs(m))
    if kind == "quantile_balancing":
        if aux:
            found.append(("quantile balancing with moe_aux_loss_coeff > 0", "aux losses must be disabled",
                          {"model.moe_aux_loss_coeff": 0.0}))  # fmt: skip
        if getattr(m, "moe_router_fusion", False):
            found.append(("quantile balancing with moe_router_fusion", "does not support moe_router_fusion",
                          {"model.moe_router_fusion": False}))  # fmt: skip
        if getattr(m, "moe_router_num_groups", None) is not None or getattr(m, "moe_router_group_topk", None):
            found.append(("quantile balancing with group-limited routing", "does not support group-limited routing",
                          {"model.moe_router_num_groups": None, "model.moe_router_group_topk": None}))  # fmt: skip
    if kind == "sinkhorn" and getattr(m, "moe_aux_loss_coeff", 0) != 0:
        found.append(("sinkhorn routing with moe_aux_loss_coeff != 0", "Sinkhorn routing does not support aux loss",
                      {"model.moe_aux_loss_coeff": 0.0}))  # fmt: skip
    if getattr(m, "moe_latent_size", None) and getattr(m, "moe_shared_expert_overlap", False):
        found.append(("moe_shared_expert_overlap with MoE latent projections (moe_latent_size)",
                      "Shared expert overlap with MoE latent projections is not supported during training",
                      {"model.moe_shared_expert_overlap": False}))  # fmt: skip
    if getattr(m, "moe_apply_probs_on_input", False) and getattr(m, "moe_router_topk", 2) != 1:
        found.append(("moe_apply_probs_on_input with moe_router_topk > 1", "only works with `moe_router_topk`=1",
                      {"model.moe_apply_probs_on_input": False}))  # fmt: skip
    return found


@rule(
    "moe.router_options",
    "Router / expert options Megatron-Core refuses together: quantile balancing with aux loss, router fusion or "
    "group-limited routing; sinkhorn with aux loss; moe_apply_probs_on_input with top-k > 1; shared-expert overlap "
    "with latent projections.",
    severity=ERROR,
    evidence=(
        "megatron/core/transformer/moe/router.py TopKRouter.__init__ asserts 'Quantile balancing handles load balance "
        "via the bias update; aux losses must be disabled' when the model is built; TopKRouter.quantile_balancing "
        "asserts 'does not support moe_router_fusion' / 'does not support group-limited routing' and "
        "TopKRouter.sinkhorn_load_balancing 'Sinkhorn routing does not support aux loss' at the first forward; "
        "moe/experts.py TEGroupedMLP.forward and SequentialMLP.forward assert '`moe_apply_probs_on_input` only works "
        "with `moe_router_topk`=1'; moe/moe_layer.py MoELayer.preprocess raises 'Shared expert overlap with MoE "
        "latent projections is not supported during training'. TransformerConfig.__post_init__ checks none of these "
        "pairs."
    ),
    reads={
        "model.moe_apply_probs_on_input": BOOL,
        "model.moe_aux_loss_coeff": OPTIONAL_NUMBERS,
        "model.moe_latent_size": UNCHECKED,
        "model.moe_router_fusion": BOOL,
        "model.moe_router_group_topk": UNCHECKED,
        "model.moe_router_load_balancing_type": OPTIONAL_NAMES,
        "model.moe_router_num_groups": UNCHECKED,
        "model.moe_shared_expert_overlap": BOOL,
        **MOE_READS,
    },
)
def router_options(ctx: RuleContext) -> list[Violation] | None:
    if ctx.moe.experts is None:
        return None
    found = []
    for what, message, fix in _router_conflicts(ctx.model):
        shown = {k: getattr(ctx.model, k.split(".", 1)[1], None) for k in fix}
        found.append(
            Violation(
                {"model.moe_router_load_balancing_type": ctx.model.moe_router_load_balancing_type, **shown},
                f"{what}: Megatron-Core asserts '{message}' when the model is built or at its first forward",
                assignments=fix,
            )
        )
    return found


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
    reads={
        **DATASET_KWARGS_READS,
        "dataset.enable_offline_packing": BOOL,
        "model.moe_aux_loss_coeff": OPTIONAL_NUMBERS,
        "model.moe_expert_capacity_factor": UNCHECKED,
        "model.moe_router_enable_expert_bias": UNCHECKED,
        "model.moe_z_loss_coeff": UNCHECKED,
        **MOE_READS,
    },
)
def router_counts_padding(ctx: RuleContext) -> list[Violation] | None:
    experts = ctx.moe.experts
    # packed rows: equivalence.router_padding routes them through Megatron-Core's router and measures the padding
    if experts is None or ctx.any_packing or not ctx.fixed_width_rows:
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


@rule(
    "moe.hybridep_uneven_inputs",
    "HybridEP dispatch over variable-width GPT SFT rows needs moe_hybridep_pad_uneven_dispatch_inputs.",
    severity=ERROR,
    evidence=(
        "megatron/core/transformer/moe/token_dispatcher.py _HybridEPManager.setup_metadata: 'HybridEP dispatch "
        "expects equal per-rank input sizes' and pads to the group maximum only when "
        "moe_hybridep_pad_uneven_dispatch_inputs is set; Megatron-Bridge 0.6.2 sets it itself only for THD "
        "packing without CUDA graphs (models/transformer_config.py _enable_safe_hybridep_dispatch). Unequal "
        "token counts across the EP group hang HybridEP's buffer all-gather or corrupt routing "
        "(deepseek-ai/DeepEP#604)."
    ),
    reads={
        **TOPOLOGY_READS,
        **DATASET_KWARGS_READS,
        "dataset.enable_offline_packing": BOOL,
        "model.moe_flex_dispatcher_backend": OPTIONAL_NAME,
        "model.moe_hybridep_pad_uneven_dispatch_inputs": BOOL,
        "model.moe_token_dispatcher_type": OPTIONAL_NAME,
    },
)
def hybridep_uneven_inputs(ctx: RuleContext) -> list[Violation] | None:
    model = ctx.model
    if (
        getattr(model, "moe_token_dispatcher_type", None) != "flex"
        or getattr(model, "moe_flex_dispatcher_backend", None) != "hybridep"
        or ctx.topology.ep <= 1
        or not ctx.dataset_is("gpt_sft")
    ):
        return None
    if getattr(model, "moe_hybridep_pad_uneven_dispatch_inputs", False) or ctx.pad_to_max_length:
        return []
    if (ctx.offline_packing or ctx.in_batch_packing) and getattr(model, "cuda_graph_impl", "none") in (None, "none"):
        return []  # Megatron-Bridge turns the padding on for THD packing without CUDA graphs
    return [
        Violation(
            {
                "model.moe_flex_dispatcher_backend": "hybridep",
                "model.expert_model_parallel_size": ctx.topology.ep,
                ctx.pad_to_max_length_path: False,
                "model.moe_hybridep_pad_uneven_dispatch_inputs": False,
            },
            "each EP rank dispatches its own micro batch, as wide as its longest row; HybridEP expects the same "
            "token count on every rank and hangs or mis-routes otherwise",
            assignments={"model.moe_hybridep_pad_uneven_dispatch_inputs": True},
        )
    ]
