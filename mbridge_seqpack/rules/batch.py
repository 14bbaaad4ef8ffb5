"""Batch geometry rules that Megatron-Bridge only checks in setup(), after GPUs are allocated."""

from __future__ import annotations

from mbridge_seqpack.analysis.topology import round_up
from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import OPTIONAL_MICRO_BATCH, UNCHECKED
from mbridge_seqpack.rules.registry import rule


def _topology_fields(ctx: RuleContext) -> dict[str, int]:
    topo = ctx.topology
    return {
        "world_size": topo.world_size,
        "model.tensor_model_parallel_size": topo.tp,
        "model.pipeline_model_parallel_size": topo.pp,
        "model.context_parallel_size": topo.cp,
    }


@rule(
    "batch.world_size_divisible",
    "world size divisible by TP*PP*CP (and by ETP*EP*PP for MoE).",
    severity=ERROR,
    evidence=(
        "megatron/core/parallel_state.py initialize_model_parallel raises RuntimeError 'world_size (N) is not "
        "divisible by ...' for TP*PP*CP and for expert TP*EP*PP, at setup() after the GPUs are allocated; expert "
        "TP is 1 when EP>1 and it is unset (models/transformer_config.py _set_moe_expert_tensor_parallel_default)."
    ),
    reads={**TOPOLOGY_READS},
)
def world_size_divisible(ctx: RuleContext) -> list[Violation] | None:
    topo = ctx.topology
    found = []
    if topo.world_size % topo.model_parallel:
        found.append(
            Violation(
                _topology_fields(ctx),
                f"data-parallel size is world_size / (TP*PP*CP) = {topo.world_size} / {topo.model_parallel}, "
                "which must be a whole number",
                fix=f"run on a multiple of {topo.model_parallel} GPUs, or change TP/PP/CP so their product divides "
                f"{topo.world_size}",
            )
        )
    if topo.ep > 1 and topo.world_size % topo.expert_model_parallel:
        found.append(
            Violation(
                {
                    **_topology_fields(ctx),
                    "model.expert_model_parallel_size": topo.ep,
                    "model.expert_tensor_parallel_size": topo.expert_tensor_parallel,
                },
                f"expert data-parallel size is world_size / (ETP*EP*PP) = {topo.world_size} / "
                f"{topo.expert_model_parallel}, which must be a whole number",
                fix=f"run on a multiple of {topo.expert_model_parallel} GPUs, or change EP/ETP/PP",
            )
        )
    return found


def _batch_sizes_apply(ctx: RuleContext) -> bool:
    """Constant batch sizes that Megatron-Core's calculator will check (no rampup, both sizes set)."""
    train = ctx.train
    return (
        getattr(train, "rampup_batch_size", None) is None
        and train.micro_batch_size is not None
        and train.global_batch_size is not None
    )


_CALCULATOR_EVIDENCE = (
    "megatron/core/num_microbatches_calculator.py ConstantNumMicroBatchesCalculator asserts 'global batch size "
    "(G) is not divisible by micro batch size (M) times data parallel size (D)' and 'number of microbatches should "
    "be at least 1', from training/initialize.py at setup(), after the GPUs are allocated."
)


@rule(
    "batch.global_batch_divisible",
    "train.global_batch_size % (micro_batch_size * DP) == 0.",
    severity=ERROR,
    evidence=_CALCULATOR_EVIDENCE + " With train.decrease_batch_size_if_needed it rounds down instead (n/a).",
    reads={
        **TOPOLOGY_READS,
        "train.decrease_batch_size_if_needed": UNCHECKED,
        "train.global_batch_size": OPTIONAL_MICRO_BATCH,
        "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
        "train.rampup_batch_size": UNCHECKED,
    },
)
def global_batch_divisible(ctx: RuleContext) -> list[Violation] | None:
    dp = ctx.topology.data_parallel
    if dp is None or not _batch_sizes_apply(ctx) or getattr(ctx.train, "decrease_batch_size_if_needed", False):
        return None
    mbs, gbs = ctx.train.micro_batch_size, ctx.train.global_batch_size
    step = mbs * dp
    if gbs < step or gbs % step == 0:
        return []  # too small is its own rule
    return [
        Violation(
            {"train.global_batch_size": gbs, "train.micro_batch_size": mbs, "data_parallel_size": dp},
            f"each optimizer step runs a whole number of micro batches on every DP rank, so global_batch_size "
            f"must be a multiple of micro_batch_size*DP = {step}",
            assignments={"train.global_batch_size": round_up(gbs, step)},
        )
    ]


@rule(
    "batch.global_batch_min",
    "train.global_batch_size >= micro_batch_size * DP.",
    severity=ERROR,
    evidence=_CALCULATOR_EVIDENCE,
    reads={
        **TOPOLOGY_READS,
        "train.global_batch_size": OPTIONAL_MICRO_BATCH,
        "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
        "train.rampup_batch_size": UNCHECKED,
    },
)
def global_batch_min(ctx: RuleContext) -> list[Violation] | None:
    dp = ctx.topology.data_parallel
    if dp is None or not _batch_sizes_apply(ctx):
        return None
    mbs, gbs = ctx.train.micro_batch_size, ctx.train.global_batch_size
    if gbs >= mbs * dp:
        return []
    return [
        Violation(
            {"train.global_batch_size": gbs, "train.micro_batch_size": mbs, "data_parallel_size": dp},
            f"every DP rank needs at least one micro batch per step: global_batch_size >= {mbs * dp}",
            assignments={"train.global_batch_size": mbs * dp},
        )
    ]
