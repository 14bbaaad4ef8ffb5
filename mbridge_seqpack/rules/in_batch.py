"""In-batch (collate-time, VLM-style) packing rules."""

from __future__ import annotations

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.topology import round_up


@rule(
    "in_batch.micro_batch_gt_one",
    "In-batch packing needs train.micro_batch_size > 1.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError 'micro_batch_size should be greater "
        "than 1 when using enable_in_batch_packing=True.'"
    ),
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
            "in_batch.micro_batch_gt_one",
            {"train.micro_batch_size": mbs, "dataset.enable_in_batch_packing": True},
            "in-batch packing concatenates the sequences of one micro batch; with one sequence there is nothing "
            "to pack",
            assignments=fix,
        )
    ]


@rule(
    "in_batch.no_cuda_graphs",
    "In-batch packing is variable width: no training CUDA graphs unless the static-shape path is on.",
    severity=ERROR,
    evidence=(
        "data/packing/in_batch.py packs each micro batch to its own width and number of cu_seqlens entries; a "
        "captured graph (megatron/core/transformer/cuda_graphs.py, TE make_graphed_callables) replays the "
        "captured shapes and fails on any other shape. training/config.py checks this only for offline "
        "packing."
    ),
)
def no_cuda_graphs(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.in_batch_packing:
        return None
    if not ctx.training_cuda_graphs:
        return []
    from mbridge_seqpack.thd.record import static_in_batch_enabled

    if static_in_batch_enabled(ctx.cfg):
        return []
    return [
        Violation(
            "in_batch.no_cuda_graphs",
            {"dataset.enable_in_batch_packing": True, "model.cuda_graph_impl": ctx.cuda_graph_impl},
            "collate-time packing produces a different width and cu_seqlens length every batch; a CUDA graph "
            "replays one fixed shape",
            fix=(
                "cfg.model.cuda_graph_impl = 'none'; or turn on the static in-batch path: "
                "mbridge_seqpack.apply(cfg, StaticTHD(capacity=...)) (fixed width + fixed cu_seqlens capacity)"
            ),
            assignments={"model.cuda_graph_impl": "none"},
        )
    ]
