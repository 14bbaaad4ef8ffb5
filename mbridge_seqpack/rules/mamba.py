"""Mamba layers against packed rows and the parallel layout: what Megatron-Core's ``MambaMixer`` and
``MambaContextParallel`` assert when they are built or first run, and the per-token sequence index they need."""

from __future__ import annotations

import math
from typing import Any

from mbridge_seqpack.analysis.model_family import MAMBA, hybrid_layer_counts
from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import (
    BOOL,
    OPTIONAL_NON_NEGATIVE_INT,
    OPTIONAL_POSITIVE_INT,
    POSITIVE_INT,
    UNCHECKED,
)
from mbridge_seqpack.rules.registry import rule

#: MambaMixer's default expand (hybrid_layer_specs.py builds it without one): d_inner = expand * hidden_size
MAMBA_EXPAND = 2


def _is_falcon_h1(model: Any) -> bool:
    """Falcon-H1 runs a MambaMixer beside attention in every layer (models/falcon_h1/modeling_falconh1)."""
    from megatron.bridge.models.falcon_h1.falconh1_provider import FalconH1ModelProvider

    return isinstance(model, FalconH1ModelProvider)


def has_mamba_layers(model: Any) -> bool:
    """Whether the model builds Megatron-Core MambaMixer layers (a hybrid 'M' layer, or Falcon-H1's)."""
    return _is_falcon_h1(model) or hybrid_layer_counts(model).get(MAMBA, 0) > 0


def mamba_heads(model: Any) -> tuple[int, int] | None:
    """(nheads, ngroups) of the model's Mamba layers as MambaMixer.__init__ derives them, or None without Mamba
    layers (or with fields it cannot read)."""
    if not has_mamba_layers(model):
        return None
    groups, head_dim = getattr(model, "mamba_num_groups", None), getattr(model, "mamba_head_dim", None)
    heads = getattr(model, "mamba_num_heads", None)
    if heads is None and isinstance(head_dim, int) and head_dim > 0:
        expand = getattr(model, "expand", MAMBA_EXPAND) if _is_falcon_h1(model) else MAMBA_EXPAND
        heads = int(expand) * int(getattr(model, "hidden_size", 0) or 0) // head_dim
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (heads, groups)):
        return None
    return heads, groups


def mamba_split_problem(heads: int, groups: int, tp: int, cp: int) -> str | None:
    """Why MambaMixer (TP) or MambaContextParallel (CP) refuses this split of heads and groups, else None."""
    if heads % tp:
        return f"{heads} heads do not divide by TP={tp} (MambaMixer: 'nheads must be evenly divisble by tp_size')"
    if groups % tp:
        return f"{groups} groups do not divide by TP={tp} (MambaMixer: 'ngroups must be evenly divisible by tp_size')"
    if cp == 1:
        return None
    local_heads, local_groups = heads // tp, groups // tp
    if local_heads % cp:
        return (
            f"{local_heads} heads per TP rank do not divide by CP={cp} (MambaContextParallel: 'nheads must be evenly "
            "divisible by tp_size * cp_size')"
        )
    if local_groups < cp and cp % local_groups:
        return (
            f"CP={cp} does not divide by the {local_groups} groups per TP rank (MambaContextParallel: 'cp_size must "
            "be evenly divisible by ngroups/tp_size')"
        )
    if local_groups >= cp and local_groups % cp:
        return (
            f"{local_groups} groups per TP rank do not divide by CP={cp} (MambaContextParallel: 'ngroups must be "
            "evenly divisible by tp_size * cp_size')"
        )
    return None


@rule(
    "mamba.heads_divisible",
    "Mamba layers split their heads and groups over TP, then over CP: each split must divide them.",
    severity=ERROR,
    evidence=(
        "megatron/core/ssm/mamba_mixer.py MambaMixer.__init__ asserts 'nheads must be evenly divisble by tp_size' and "
        "'ngroups must be evenly divisible by tp_size' (nheads = mamba_num_heads, else 2 * hidden_size // "
        "mamba_head_dim), then builds megatron/core/ssm/mamba_context_parallel.py MambaContextParallel, whose "
        "__init__ asserts at CP>1 that the heads per TP rank divide by CP and that the groups per TP rank divide by "
        "CP (or CP by them, when fewer): run on CPU. TransformerConfig checks attention heads against TP, not "
        "Mamba's; all of it fails when the model is built, after the GPUs are allocated."
    ),
    reads={
        **TOPOLOGY_READS,
        "model.hybrid_layer_pattern": UNCHECKED,
        "model.mamba_head_dim": UNCHECKED,
        "model.mamba_num_groups": POSITIVE_INT,
        "model.mamba_num_heads": OPTIONAL_POSITIVE_INT,
    },
)
def mamba_heads_divisible(ctx: RuleContext) -> list[Violation] | None:
    found = mamba_heads(ctx.model)
    if found is None:
        return None
    heads, groups = found
    topo = ctx.topology
    problem = mamba_split_problem(heads, groups, topo.tp, topo.cp)
    if problem is None:
        return []
    if mamba_split_problem(heads, groups, topo.tp, 1) is None:  # TP fits: the largest CP dividing this one that fits
        fitting = [c for c in range(1, topo.cp + 1) if topo.cp % c == 0]
        cp = max(c for c in fitting if mamba_split_problem(heads, groups, topo.tp, c) is None)
        fix: dict[str, Any] = {"model.context_parallel_size": cp}
    else:
        tp = max(t for t in range(1, topo.tp + 1) if topo.tp % t == 0 and math.gcd(heads, groups) % t == 0)
        fix = {"model.tensor_model_parallel_size": tp}
    return [
        Violation(
            {
                "model.mamba_num_heads": heads,
                "model.mamba_num_groups": groups,
                "model.tensor_model_parallel_size": topo.tp,
                "model.context_parallel_size": topo.cp,
            },
            f"{problem}: the model fails when it is built",
            assignments=fix,
        )
    ]


@rule(
    "mamba.packing_needs_mem_eff_path",
    "Packed rows through Mamba layers need use_mamba_mem_eff_path=True.",
    severity=ERROR,
    evidence=(
        "megatron/core/ssm/mamba_mixer.py MambaMixer.forward takes the non-memory-efficient path (_ssm_prefill) when "
        "config.use_mamba_mem_eff_path is False and there asserts packed_seq_params is None: 'Training with packed "
        "sequences is not supported in the non-memory-efficient code path', in every Mamba layer at the first "
        "forward (run on CPU). The steps pass packed_seq_params whenever the batch is packed (offline, in-batch, "
        "Energon). Megatron-Bridge 0.6.2 ships nemotronh_4b_sft_1gpu_h100_bf16_config and "
        "nemotronh_4b_peft_1gpu_h100_bf16_config with offline packing and use_mamba_mem_eff_path=False."
    ),
    reads={
        "dataset.enable_in_batch_packing": BOOL,
        "dataset.enable_offline_packing": BOOL,
        "dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT,
        "model.hybrid_layer_pattern": UNCHECKED,
        "model.use_mamba_mem_eff_path": BOOL,
    },
)
def mamba_packing_needs_mem_eff_path(ctx: RuleContext) -> list[Violation] | None:
    flags = ctx.packing_flags
    if not flags or not has_mamba_layers(ctx.model):
        return None
    if getattr(ctx.model, "use_mamba_mem_eff_path", True):
        return []
    return [
        Violation(
            {"model.use_mamba_mem_eff_path": False, **flags},
            "the non-memory-efficient Mamba path refuses packed sequences: every Mamba layer asserts at the first "
            "forward",
            assignments={"model.use_mamba_mem_eff_path": True},
        )
    ]


@rule(
    "mamba.cp_needs_rmsnorm_off_mem_eff_path",
    "Mamba layers with CP>1 off the memory-efficient path need their gated RMSNorm (Falcon-H1's rmsnorm=True).",
    severity=ERROR,
    evidence=(
        "megatron/core/ssm/mamba_mixer.py MambaMixer._ssm_prefill (the training path when use_mamba_mem_eff_path is "
        "False) asserts 'Context parallel not supported for use_mem_eff_path==False and rmsnorm==False' at the first "
        "forward; MambaMixer takes rmsnorm from its spec, which only Falcon-H1 sets from the config "
        "(models/falcon_h1/modeling_falconh1/falconh1_block.py rmsnorm=self.config.rmsnorm)."
    ),
    reads={
        **TOPOLOGY_READS,
        "model.hybrid_layer_pattern": UNCHECKED,
        "model.rmsnorm": BOOL,
        "model.use_mamba_mem_eff_path": BOOL,
    },
)
def mamba_cp_needs_rmsnorm(ctx: RuleContext) -> list[Violation] | None:
    if ctx.topology.cp == 1 or not has_mamba_layers(ctx.model) or getattr(ctx.model, "use_mamba_mem_eff_path", True):
        return None
    if getattr(ctx.model, "rmsnorm", True):
        return []
    return [
        Violation(
            {
                "model.use_mamba_mem_eff_path": False,
                "model.rmsnorm": False,
                "model.context_parallel_size": ctx.topology.cp,
            },
            "off the memory-efficient path, Mamba's ungated norm would run over the heads one CP rank holds: the "
            "first forward asserts",
            assignments={"model.use_mamba_mem_eff_path": True},
        )
    ]


def _has_mamba_layers(model: Any) -> bool:
    """Whether a hybrid provider builds Mamba layers: 'M' in its layer pattern (before any MTP part), or no pattern
    and attention/MLP ratios that leave layers to Mamba (megatron/core/models/hybrid/hybrid_layer_allocation.py)."""
    from mbridge_seqpack.moe_layers import hybrid_pattern

    pattern = hybrid_pattern(model)
    if pattern is not None:
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
    reads={
        "dataset.enable_in_batch_packing": BOOL,
        "dataset.enable_offline_packing": BOOL,
        "dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT,
        "model.hybrid_layer_pattern": UNCHECKED,
        "model.is_hybrid_model": BOOL,
    },
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
