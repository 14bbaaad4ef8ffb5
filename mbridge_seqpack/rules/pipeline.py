"""Pipeline schedules: what Megatron-Core's interleaved (virtual pipeline) schedule asks of the micro batches a step
holds, checked when the first training or evaluation step runs."""

from __future__ import annotations

from typing import Any

from mbridge_seqpack.analysis.topology import round_up
from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import BATCH_READS, TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import (
    BOOL,
    OPTIONAL_POSITIVE_INT,
    UNCHECKED,
)
from mbridge_seqpack.rules.registry import rule


def _group_problem(micro_batches: int, group: int, pp: int) -> str | None:
    """Why forward_backward_pipelining_with_interleaving refuses M micro batches in groups of N, else None."""
    if group > micro_batches or group < pp:
        return f"the micro-batch group ({group}) must lie in [PP={pp}, M={micro_batches}]"
    last = micro_batches % group
    if 0 < last < pp:
        return f"the last group of M={micro_batches} micro batches holds {last} < PP={pp}"
    return None


@rule(
    "pipeline.interleaved_micro_batches",
    "The interleaved pipeline schedule (VPP) needs at least microbatch_group_size_per_vp_stage (default PP) micro "
    "batches per step, and a last group of 0 or at least PP.",
    severity=ERROR,
    evidence=(
        "megatron/core/pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving raises ValueError "
        "'The number of contiguous micro-batches in a virtual pipeline stage should range in [PP, M]' when "
        "microbatch_group_size_per_vp_stage (ModelParallelConfig sets it to PP) is larger than the step's micro "
        "batches M or smaller than PP, and RuntimeError when M % group leaves 0 < remainder < PP, at the first "
        "training step (M = global_batch / (micro_batch x DP)) or the first evaluation (its own global and micro "
        "batch). Neither TransformerConfig nor ConfigContainer.validate compares them."
    ),
    reads={
        **TOPOLOGY_READS,
        **BATCH_READS,
        "model.microbatch_group_size_per_vp_stage": OPTIONAL_POSITIVE_INT,
        "model.virtual_pipeline_model_parallel_size": OPTIONAL_POSITIVE_INT,
    },
)
def interleaved_micro_batches(ctx: RuleContext) -> list[Violation] | None:
    topo = ctx.topology
    vpp = getattr(ctx.model, "virtual_pipeline_model_parallel_size", None)
    dp = topo.data_parallel
    if topo.pp == 1 or not vpp or dp is None:
        return None
    group = getattr(ctx.model, "microbatch_group_size_per_vp_stage", None) or topo.pp
    validation = getattr(ctx.cfg, "validation", None)
    runs = [("train", ctx.train.global_batch_size, ctx.train.micro_batch_size)]
    if (getattr(validation, "eval_iters", 0) or 0) > 0:
        runs.append(
            (
                "validation",
                getattr(validation, "eval_global_batch_size", None) or ctx.train.global_batch_size,
                getattr(validation, "eval_micro_batch_size", None) or ctx.train.micro_batch_size,
            )
        )
    found = []
    for where, gbs, mbs in runs:
        if not isinstance(gbs, int) or not isinstance(mbs, int) or gbs % (mbs * dp):
            continue  # batch.global_batch_divisible reports it
        micro_batches = gbs // (mbs * dp)
        problem = _group_problem(micro_batches, group, topo.pp)
        if problem is None:
            continue
        fix: dict[str, Any] = {}
        if group < topo.pp:
            fix["model.microbatch_group_size_per_vp_stage"] = None  # ModelParallelConfig sets it to PP
            group = topo.pp
        wanted = max(group, round_up(micro_batches, group)) * mbs * dp
        if _group_problem(micro_batches, group, topo.pp) is not None:
            fix["train.global_batch_size" if where == "train" else "validation.eval_global_batch_size"] = wanted
        fields: dict[str, Any] = {
            "train.global_batch_size" if where == "train" else "validation.eval_global_batch_size": gbs,
            "train.micro_batch_size" if where == "train" else "validation.eval_micro_batch_size": mbs,
            "data_parallel_size": dp,
            "model.pipeline_model_parallel_size": topo.pp,
            "model.virtual_pipeline_model_parallel_size": vpp,
        }
        found.append(
            Violation(
                fields,
                f"a {where} step runs {micro_batches} micro batch(es) through the interleaved schedule and {problem}: "
                f"it raises at the first {where} step",
                assignments=fix,
            )
        )
    return found


@rule(
    "pipeline.variable_shapes_interleaved_pp2",
    "Variable sequence lengths (in-batch packing sets them under PP) cannot use the interleaved schedule at PP=2.",
    severity=ERROR,
    evidence=(
        "models/transformer_config.py sets variable_seq_lengths=True for in-batch packing with PP>1; "
        "megatron/core/pipeline_parallel/p2p_communication.py P2PCommunicator._communicate_shapes puts "
        "[send_prev, recv_prev, send_next, recv_next] into one tagless batch_isend_irecv. At PP=2 the previous "
        "and the next rank are the same peer, so the interleaved (VPP) schedule's bidirectional exchange pairs the "
        "two shapes crosswise: activations are received with swapped shapes, silently, until backward fails on a "
        "shape mismatch (NVIDIA/Megatron-LM#5100, #5271)."
    ),
    reads={
        **TOPOLOGY_READS,
        "dataset.enable_in_batch_packing": BOOL,
        "model.variable_seq_lengths": UNCHECKED,
        "model.virtual_pipeline_model_parallel_size": OPTIONAL_POSITIVE_INT,
    },
)
def variable_shapes_interleaved_pp2(ctx: RuleContext) -> list[Violation] | None:
    topo = ctx.topology
    variable = getattr(ctx.model, "variable_seq_lengths", False) is True or (ctx.in_batch_packing and topo.pp > 1)
    if not variable or topo.pp != 2:
        return None
    vpp = getattr(ctx.model, "virtual_pipeline_model_parallel_size", None)
    if vpp is None or vpp <= 1:
        return []
    return [
        Violation(
            {
                "model.pipeline_model_parallel_size": 2,
                "model.virtual_pipeline_model_parallel_size": vpp,
                "dataset.enable_in_batch_packing": ctx.in_batch_packing,
            },
            "with one peer on both sides, the interleaved schedule's shape exchange crosses the received shapes; "
            "use the non-interleaved schedule (or PP >= 3)",
            assignments={"model.virtual_pipeline_model_parallel_size": None},
        )
    ]
