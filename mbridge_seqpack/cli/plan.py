"""``plan``: pack length vs global batch at equal token slots per step, checked by the real rules."""

from __future__ import annotations

import argparse

from mbridge_seqpack.cli.args import DEFAULT_RECIPE, int_list, positive_int
from mbridge_seqpack.cli.check import split_target

__all__ = ["cmd_plan", "add_plan_command"]


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from mbridge_seqpack.compose.planner import plan

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
