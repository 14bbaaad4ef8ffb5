"""``check()``: every rule on a config, and what the verdicts rest on, gathered into one ``CheckReport``."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Sequence

from mbridge_seqpack.ranks import is_rank_zero
from mbridge_seqpack.report.check_report import CheckReport, derived_values

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["check"]


def check(
    cfg: ConfigContainer,
    world_size: int | None = None,
    *,
    target: str | None = None,
    gpu_arch: str | None = None,
    notes: Sequence[str] = (),
) -> CheckReport:
    """Run every rule on ``cfg`` (not Megatron-Bridge's own validation) and report: each rule's verdict (ok,
    assumed, violation, not determined), the layout derived, and notes on what stood in (TE's backend picks, the
    packs' contents, corrections, the equivalence check's stand-ins). ``target`` names the config in the report and
    lets a recipe's name say the GPU; ``gpu_arch`` is the GPU the attention verdicts are for; ``notes`` are the
    caller's own (a launch line's). Iterating the report gives the violations."""
    from mbridge_seqpack.analysis.te_attention import declared
    from mbridge_seqpack.rules import RuleContext, evaluate
    from mbridge_seqpack.rules.config import TYPES_RULE_ID

    ctx = RuleContext.build(cfg, world_size)
    asked = declared(gpu_arch=gpu_arch, recipe=target) if gpu_arch or target else contextlib.nullcontext()
    with asked:
        results = evaluate(ctx)
        typed = all(r.status != "fail" for r in results if r.rule.rule_id == TYPES_RULE_ID)
        report = CheckReport(
            target=f"{target or 'the config'} (world size {ctx.world_size})",
            derived=derived_values(ctx) if typed else {},  # a mistyped field: config.types names it
            results=results,
            notes=list(notes),
        )
        if typed:
            _add_notes(report, ctx)
        else:
            report.notes += _correction_notes()
    return report


def _add_notes(report: CheckReport, ctx: Any) -> None:
    """What the verdicts rest on: TE's picks and the stack they were asked on, what the launch reads of the packs,
    the corrections in effect, the equivalence check's stand-ins (its verdict is cached: nothing runs twice)."""
    from mbridge_seqpack.analysis.attention_backend import verdict_notes, verdict_summary
    from mbridge_seqpack.rules.equivalence import equivalence_verdict

    attention = ctx.attention_verdict
    report.derived["attention"] = verdict_summary(attention)
    report.notes += verdict_notes(attention, ctx.model)
    # what validate() read of the packs, and what the launch reads before training: planned on rank 0 only, as the
    # launch guard plans it (the hook checks on every rank of a job; only rank 0 logs the report)
    if ctx.offline_packing and is_rank_zero():
        from mbridge_seqpack.artifact.pack_files import content_plan

        report.contents = content_plan(ctx.cfg).summary()
    report.notes += _correction_notes()
    verdict = equivalence_verdict(ctx)
    report.notes += [] if verdict is None else [f"equivalence check: {note}" for note in verdict.undetermined]


def _correction_notes() -> list[str]:
    """One line per opt-in correction that is not simply off: installed here, installed by the launch, or requested
    and why it is not (other Megatron versions, the plugin not turned on at launch)."""
    from mbridge_seqpack.corrections import router_padding

    state = router_padding.state()
    return [] if state.state == "off" else [state.describe()]
