"""``plan``: pack length vs global batch at equal token slots per optimizer step, checked by the real rules.

For each candidate pack length L the planner rebuilds the recipe, sets the sequence length to L (on
``dataset.seq_length``, its owner), re-derives the dependent fields (as the mixins do), sets
``global_batch_size = slots / L`` and runs the full rule catalog at the given world size. Lengths above the
model's context window (a packaged recipe's ``context_window``, or ``--context-window``) are marked: nothing
crashes there, but the model has never seen such positions. It builds recipes, so it lives with the command
line, not in ``compose/`` (which the recipes import).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Sequence

from mbridge_seqpack.cli.args import DEFAULT_RECIPE, int_list, positive_int
from mbridge_seqpack.cli.check import split_target

__all__ = ["PlanRow", "plan", "default_lengths", "cmd_plan", "add_plan_command"]


@dataclass(frozen=True)
class PlanRow:
    """One candidate: its batch, DP and the rules it breaks (empty: valid)."""

    pack_length: int
    global_batch_size: int | None
    dp: int | None
    broken: tuple[str, ...] = ()
    reasons: tuple[str, ...] = field(default=())
    context_window: int | None = None

    @property
    def within_context(self) -> bool | None:
        """False above the model's context window; None when the window is unknown."""
        return None if self.context_window is None else self.pack_length <= self.context_window

    @property
    def ok(self) -> bool:
        return not self.broken and self.within_context is not False

    def verdict(self) -> str:
        parts = [f"{rid}: {why}" for rid, why in zip(self.broken, self.reasons)]
        if self.within_context is False:
            parts.insert(0, f"above the model's {self.context_window:,}-token context window")
        return "; ".join(parts) if parts else "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "pack_length": self.pack_length,
            "global_batch_size": self.global_batch_size,
            "dp": self.dp,
            "ok": self.ok,
            "context_window": self.context_window,
            "within_context": self.within_context,
            "violations": [{"rule_id": r, "rule": w} for r, w in zip(self.broken, self.reasons)],
        }


def default_lengths(slots: int) -> list[int]:
    """Powers of two from 1024 up to ``slots``."""
    out, length = [], 1024
    while length <= slots:
        out.append(length)
        length *= 2
    return out


def plan(
    target: str,
    *,
    slots: int,
    world_size: int | None = None,
    lengths: Sequence[int] | None = None,
    overrides: Sequence[str] = (),
    context_window: int | None = None,
) -> list[PlanRow]:
    """Evaluate each pack length at ``slots`` token slots per step (``context_window`` defaults to the
    packaged recipe's)."""
    from mbridge_seqpack.compose.derive import derive
    from mbridge_seqpack.recipes.targets import build_target, resolve_world
    from mbridge_seqpack.report import check
    from mbridge_seqpack.rules.context import RuleContext

    rows = []
    for length in lengths or default_lengths(slots):
        cfg, info = build_target(target, overrides)
        world = resolve_world(world_size, info)
        window = context_window if context_window is not None else getattr(info, "context_window", None)
        cfg.dataset.seq_length = cfg.model.seq_length = length  # the dataset owns the length (derive syncs from it)
        derive(cfg)
        dp = RuleContext(cfg=cfg, world_size=world).topology.data_parallel
        if slots % length:
            rows.append(
                PlanRow(
                    length,
                    None,
                    dp,
                    ("plan.slots_divisible",),
                    (f"{slots} token slots are not a whole number of {length}-token rows",),
                    window,
                )
            )
            continue
        cfg.train.global_batch_size = slots // length
        found = check(cfg, world_size=world)
        rows.append(
            PlanRow(length, slots // length, dp, tuple(v.rule_id for v in found), tuple(v.rule for v in found), window)
        )
    return rows


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    split_target(args)
    rows = plan(
        args.target,
        slots=args.slots,
        world_size=args.world_size,
        lengths=args.lengths,
        overrides=args.overrides,
        context_window=args.context_window,
    )
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        from mbridge_seqpack.textout import table, wrap

        window = rows[0].context_window if rows else None
        known = f"context window {window:,} tokens" if window else "context window unknown (--context-window N)"
        print(
            "\n".join(
                wrap(f"plan for {args.target}: {args.slots:,} token slots per optimizer step; {known}", hang="  ")
            )
        )
        columns = [("pack length", "right"), ("GBS", "right"), ("DP", "right"), ("verdict", "left")]
        print(
            table(
                columns,
                [
                    (r.pack_length, r.global_batch_size or "-", "-" if r.dp is None else r.dp, r.verdict())
                    for r in rows
                ],
                keep_whole=(),
            )
        )
    return 0 if any(r.ok for r in rows) else 1


def add_plan_command(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("plan", help="pack length vs global batch at equal token slots per step")
    p.add_argument("target", nargs="?", default=DEFAULT_RECIPE)
    p.add_argument("overrides", nargs="*")
    p.add_argument("--slots", type=positive_int, default=65536, help="token slots per optimizer step")
    p.add_argument("--world-size", type=positive_int, default=None)
    p.add_argument(
        "--lengths",
        type=int_list,
        default=None,
        help="comma-separated pack lengths (default: powers of two from 1024 up to --slots)",
    )
    p.add_argument(
        "--context-window",
        type=positive_int,
        default=None,
        help="the model's context window in tokens (default: the packaged recipe's)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)
