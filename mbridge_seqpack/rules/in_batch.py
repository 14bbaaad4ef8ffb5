"""In-batch (collate-time, VLM-style) packing rules."""

from __future__ import annotations

from mbridge_seqpack.analysis.graph_paths import FULL_ITER_READ, TE_SAMPLES
from mbridge_seqpack.analysis.topology import round_up
from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import BOOL, OPTIONAL_MICRO_BATCH, OPTIONAL_STR
from mbridge_seqpack.rules.registry import rule


@rule(
    "in_batch.micro_batch_gt_one",
    "In-batch packing needs train.micro_batch_size > 1.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError 'micro_batch_size should be greater "
        "than 1 when using enable_in_batch_packing=True.'"
    ),
    reads={
        **TOPOLOGY_READS,
        "dataset.enable_in_batch_packing": BOOL,
        "train.global_batch_size": OPTIONAL_MICRO_BATCH,
        "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
    },
)
def micro_batch_gt_one(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.in_batch_packing:
        return None
    mbs = ctx.train.micro_batch_size
    if mbs is None:
        return None  # Megatron-Bridge's own "train.micro_batch_size must be set" shows
    if mbs > 1:
        return []
    dp = ctx.topology.data_parallel or 1
    gbs = ctx.train.global_batch_size
    fix = {"train.micro_batch_size": 2}
    if gbs is not None and gbs % (2 * dp):
        fix["train.global_batch_size"] = round_up(gbs, 2 * dp)
    return [
        Violation(
            {"train.micro_batch_size": mbs, "dataset.enable_in_batch_packing": True},
            "in-batch packing concatenates the sequences of one micro batch; with one sequence there is nothing "
            "to pack",
            assignments=fix,
        )
    ]


@rule(
    "in_batch.no_cuda_graphs",
    "In-batch packing cannot be CUDA-graphed in Megatron-Bridge 0.6.2 (TE per-layer or full-iteration).",
    severity=ERROR,
    evidence=(
        "TE per-layer: "
        + TE_SAMPLES
        + "; in-batch rows are [1, micro_batch*seq_length], so hidden states never fit. Full-iteration: "
        + FULL_ITER_READ
        + ", shaped by the first micro batch; data/packing/in_batch.py packs each micro batch to its own width "
        "and number of cu_seqlens entries. Megatron-Bridge's validate() checks graphs only for offline packing."
    ),
    reads={"dataset.enable_in_batch_packing": BOOL, "model.cuda_graph_impl": OPTIONAL_STR},
)
def no_cuda_graphs(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.in_batch_packing:
        return None
    cell = ctx.graph_path
    if cell is None or cell.rule_id != "in_batch.no_cuda_graphs":
        return []
    return [
        Violation(
            {"dataset.enable_in_batch_packing": True, "model.cuda_graph_impl": ctx.cuda_graph_impl},
            "collate-time packing puts a micro batch in one row of its own width and cu_seqlens length; no graph "
            "path in Megatron-Bridge 0.6.2 replays that (offline packing with fixed width can be graphed)",
            assignments={"model.cuda_graph_impl": "none"},
        )
    ]
