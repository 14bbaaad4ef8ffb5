"""``packing.*``: offline and in-batch packing are mutually exclusive."""

from __future__ import annotations

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import SPECS, RuleContext
from mbridge_seqpack.rules.field_types import BOOL, OPTIONAL_MICRO_BATCH
from mbridge_seqpack.rules.registry import rule


@rule(
    "packing.modes_exclusive",
    "Offline packing and in-batch packing are mutually exclusive.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError 'enable_offline_packing and "
        "enable_in_batch_packing are mutually exclusive.'"
    ),
    reads={
        "dataset.enable_in_batch_packing": BOOL,
        "dataset.enable_offline_packing": BOOL,
        "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
    },
)
def modes_exclusive(ctx: RuleContext) -> list[Violation] | None:
    if not (ctx.offline_packing or ctx.in_batch_packing):
        return None
    if not (ctx.offline_packing and ctx.in_batch_packing):
        return []
    fix = (
        {"dataset.enable_in_batch_packing": False}
        if ctx.train.micro_batch_size == 1
        else {"dataset.enable_offline_packing": False, SPECS: None}
    )
    return [
        Violation(
            {"dataset.enable_offline_packing": True, "dataset.enable_in_batch_packing": True},
            "offline packing (micro batch 1, pre-packed rows) and in-batch packing (micro batch > 1, packed at "
            "collate) cannot both be on",
            assignments=fix,
        )
    ]
