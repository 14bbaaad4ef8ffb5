"""Energon online packing (``packing_buffer_size``) rules; 0.6.2 accepts the field and checks nothing."""

from __future__ import annotations

from typing import Any

from mbridge_seqpack.analysis.model_family import per_token_loss_after_finalize
from mbridge_seqpack.errors import ADVISORY, Violation
from mbridge_seqpack.rules.context import TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import (
    BOOL,
    OPTIONAL_MICRO_BATCH,
    OPTIONAL_NON_NEGATIVE_INT,
    OPTIONAL_POSITIVE_INT,
    OPTIONAL_STR,
)
from mbridge_seqpack.rules.registry import rule

BUFFER = "dataset.packing_buffer_size"


def _one(ctx: RuleContext, fields: dict[str, Any], why: str, fix: dict[str, Any]) -> list[Violation]:
    return [Violation({BUFFER: ctx.dataset.packing_buffer_size, **fields}, why, assignments=fix)]


@rule(
    "energon.micro_batch_one",
    "Energon online packing needs train.micro_batch_size == 1.",
    severity=ADVISORY,
    evidence=(
        "Enforced only on Megatron-Bridge main (training/config.py Energon native packing checks, "
        "data/builders/energon.py); 0.6.2 forwards packing_buffer_size to Energon and checks nothing, so "
        "these are advisories for 0.6.2."
    ),
    reads={
        "dataset.micro_batch_size": OPTIONAL_POSITIVE_INT,
        "dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT,
        "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
    },
)
def energon_micro_batch_one(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.energon_packing:
        return None
    mbs = ctx.train.micro_batch_size
    if mbs is None or mbs == 1:
        return []
    return _one(
        ctx,
        {"train.micro_batch_size": mbs},
        "Energon packs samples into one physical row per micro batch",
        {"train.micro_batch_size": 1, "dataset.micro_batch_size": 1},
    )


@rule(
    "energon.exclusive_in_batch",
    "Energon online packing excludes in-batch and deferred in-batch packing.",
    severity=ADVISORY,
    evidence=(
        "Enforced only on Megatron-Bridge main (training/config.py Energon native packing checks, "
        "data/builders/energon.py); 0.6.2 forwards packing_buffer_size to Energon and checks nothing, so "
        "these are advisories for 0.6.2."
    ),
    reads={
        "dataset.defer_in_batch_packing_to_step": BOOL,
        "dataset.enable_in_batch_packing": BOOL,
        "dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT,
    },
)
def energon_exclusive_in_batch(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.energon_packing:
        return None
    on = {
        f"dataset.{name}": True
        for name in ("enable_in_batch_packing", "defer_in_batch_packing_to_step")
        if getattr(ctx.dataset, name, False)
    }
    if not on:
        return []
    return _one(
        ctx,
        on,
        "samples are already packed by Energon; packing them again at collate or step time corrupts boundaries",
        {k: False for k in on},
    )


@rule(
    "energon.no_mtp",
    "Energon online packing does not support MTP.",
    severity=ADVISORY,
    evidence=(
        "Enforced only on Megatron-Bridge main (training/config.py Energon native packing checks, "
        "data/builders/energon.py); 0.6.2 forwards packing_buffer_size to Energon and checks nothing, so "
        "these are advisories for 0.6.2."
    ),
    reads={
        "dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT,
        "model.mtp_num_layers": OPTIONAL_NON_NEGATIVE_INT,
    },
)
def energon_no_mtp(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.energon_packing:
        return None
    if ctx.mtp_layers == 0:
        return []
    return _one(
        ctx,
        {"model.mtp_num_layers": ctx.mtp_layers},
        "Megatron-Bridge main refused Energon packing with MTP for a while (the guard was removed as stale in "
        "NVIDIA-NeMo/Megatron-Bridge#5990); Megatron-Core 0.19.2 rolls MTP labels within each packed sequence",
        {"model.mtp_num_layers": None},
    )


@rule(
    "energon.no_cuda_graphs",
    "Energon online packing does not support CUDA graphs.",
    severity=ADVISORY,
    evidence=(
        "Enforced only on Megatron-Bridge main (training/config.py Energon native packing checks, "
        "data/builders/energon.py); 0.6.2 forwards packing_buffer_size to Energon and checks nothing, so "
        "these are advisories for 0.6.2."
    ),
    reads={"dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT, "model.cuda_graph_impl": OPTIONAL_STR},
)
def energon_no_cuda_graphs(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.energon_packing:
        return None
    if ctx.cuda_graph_impl == "none":
        return []
    return _one(
        ctx,
        {"model.cuda_graph_impl": ctx.cuda_graph_impl},
        "online packs have a different number of sequences every step; graphs replay one shape",
        {"model.cuda_graph_impl": "none"},
    )


@rule(
    "energon.no_pipeline",
    "Energon online packing does not support pipeline parallelism.",
    severity=ADVISORY,
    evidence=(
        "Enforced only on Megatron-Bridge main (training/config.py Energon native packing checks, "
        "data/builders/energon.py); 0.6.2 forwards packing_buffer_size to Energon and checks nothing, so "
        "these are advisories for 0.6.2."
    ),
    reads={**TOPOLOGY_READS, "dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT},
)
def energon_no_pipeline(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.energon_packing:
        return None
    pp = ctx.topology.pp
    if pp == 1:
        return []
    return _one(
        ctx,
        {"model.pipeline_model_parallel_size": pp},
        "packed metadata is not forwarded between pipeline stages on this path",
        {"model.pipeline_model_parallel_size": 1},
    )


@rule(
    "energon.per_token_loss",
    "Energon online packing needs per-token loss and average_in_collective=False.",
    severity=ADVISORY,
    evidence=(
        "Enforced only on Megatron-Bridge main (training/config.py Energon native packing checks, "
        "data/builders/energon.py); 0.6.2 forwards packing_buffer_size to Energon and checks nothing, so "
        "these are advisories for 0.6.2."
    ),
    reads={
        **TOPOLOGY_READS,
        "dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT,
        "ddp.average_in_collective": BOOL,
        "model.calculate_per_token_loss": BOOL,
    },
)
def energon_per_token_loss(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.energon_packing:
        return None
    fields: dict[str, Any] = {}
    fix: dict[str, Any] = {}
    if not per_token_loss_after_finalize(ctx.model, ctx.topology.cp):
        fields["model.calculate_per_token_loss"] = False
        fix["model.calculate_per_token_loss"] = True
    if getattr(ctx.cfg.ddp, "average_in_collective", False):
        fields["ddp.average_in_collective"] = True
        fix["ddp.average_in_collective"] = False
    if not fields:
        return []
    return _one(
        ctx,
        fields,
        "rows hold a varying number of loss tokens; per-sample averaging would weight them unequally",
        fix,
    )
