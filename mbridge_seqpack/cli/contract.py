"""``contract record|diff|bisect-run``: what a Megatron-Bridge commit changed in packing behaviour, measured on
fixed inputs (mbridge_seqpack/contract/), for its maintainers; docs/contract.md."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["add_contract_command"]


def _checkout(args: argparse.Namespace) -> Path | None:
    return Path(args.megatron_bridge) if args.megatron_bridge else None


def cmd_record(args: argparse.Namespace) -> int:
    from mbridge_seqpack.contract.record import CheckoutImportError, record, write_record
    from mbridge_seqpack.errors import UsageError

    started = time.monotonic()
    try:
        data = record(_checkout(args), args.only)
    except CheckoutImportError as exc:
        raise UsageError(f"{exc}; a commit that needs another Megatron-Core cannot be recorded here") from None
    write_record(data, Path(args.output))
    counts: dict[str, int] = {}
    for obs in data["observations"].values():
        counts[obs["status"]] = counts.get(obs["status"], 0) + 1
    told = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    mb = data["megatron_bridge"]
    print(f"recorded {len(data['observations'])} observations ({told}) of megatron.bridge {mb['version']}")
    print(f"  from {mb['file']}")
    print(f"  to {args.output} in {time.monotonic() - started:.0f} s")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from mbridge_seqpack.contract.diff import diff_records, render_json, render_text
    from mbridge_seqpack.contract.record import load_record

    a, b = load_record(Path(args.a)), load_record(Path(args.b))
    diff = diff_records(a, b, a_name=args.a, b_name=args.b)
    print(render_json(diff) if args.json else render_text(diff))
    return 1 if diff.changed else 0


def cmd_bisect_run(args: argparse.Namespace) -> int:
    """One bisect step; what is not about the commit (a usage error, a plugin bug) exits 128, which aborts
    `git bisect run` (2 and 3 would be counted as bad commits and poison the bisect)."""
    from mbridge_seqpack.contract.bisect import ABORT, bisect_step
    from mbridge_seqpack.contract.diff import render_text
    from mbridge_seqpack.contract.record import check_names
    from mbridge_seqpack.errors import SeqpackError
    from mbridge_seqpack.textout import message_lines

    try:
        check_names(args.only)
        code, diff, why = bisect_step(Path(args.against), _checkout(args), args.only)
    except SeqpackError as exc:
        text = f"{exc} (exit {ABORT}: git bisect run stops here)"
        print("\n".join(message_lines(text, "mbridge-seqpack: error: ")), file=sys.stderr)
        return ABORT
    except Exception:  # noqa: BLE001  (a bug of the kit: never a verdict on the commit)
        import traceback

        traceback.print_exc()
        print(
            f"mbridge-seqpack contract bisect-run: internal error (a bug in mbridge-seqpack); exit {ABORT} stops "
            "git bisect run",
            file=sys.stderr,
        )
        return ABORT
    if diff is not None and diff.changed:
        print(render_text(diff))
    print(f"mbridge-seqpack contract bisect-run: {why}", file=sys.stderr)
    return code


def _abort_on_usage(parser: argparse.ArgumentParser) -> None:
    """A mistyped bisect-run command line exits 128 (git aborts the bisect), not argparse's 2 (git: bad)."""

    def error(message: str) -> None:
        from mbridge_seqpack.textout import message_lines

        parser.print_usage(sys.stderr)
        text = f"{message} (exit 128: git bisect run stops here)"
        parser.exit(128, "\n".join(message_lines(text, "mbridge-seqpack: error: ")) + "\n")

    parser.error = error  # type: ignore[method-assign]


def add_contract_command(sub: argparse._SubParsersAction) -> None:
    contract = sub.add_parser(
        "contract",
        help="record, compare and bisect Megatron-Bridge's packing behaviour (for its maintainers)",
        description=__doc__.splitlines()[0],
    )
    actions = contract.add_subparsers(dest="contract_command", required=True)
    checkout_help = (
        "a Megatron-Bridge repository root (its src/megatron/bridge is imported first; Megatron-Core stays the "
        "installed one); default: the installed Megatron-Bridge"
    )

    rec = actions.add_parser("record", help="run the observations, write one JSON record")
    rec.add_argument("--megatron-bridge", metavar="CHECKOUT", help=checkout_help)
    rec.add_argument("--output", "-o", required=True, metavar="FILE", help="the record to write (JSON)")
    rec.add_argument("--only", nargs="+", metavar="NAME", help="only these observations")
    rec.set_defaults(func=cmd_record)

    dif = actions.add_parser("diff", help="what changed between two records (exit 1 when anything did)")
    dif.add_argument("a", metavar="A.json")
    dif.add_argument("b", metavar="B.json")
    dif.add_argument("--json", action="store_true", help="the diff as JSON (for CI)")
    dif.set_defaults(func=cmd_diff)

    run = actions.add_parser(
        "bisect-run",
        help="for `git bisect run`: exit 0 unchanged, 1 changed, 125 cannot be observed at this commit, 128 the"
        " kit cannot run (git aborts)",
    )
    _abort_on_usage(run)
    run.add_argument("--against", required=True, metavar="A.json", help="the reference record (a good commit's)")
    run.add_argument(
        "--megatron-bridge",
        metavar="CHECKOUT",
        help="the checkout under test (`.` under git bisect run); default: the installed Megatron-Bridge",
    )
    run.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="the observations that decide (default: every one A holds a value of, census.scan shown only)",
    )
    run.set_defaults(func=cmd_bisect_run, parser_for_errors=run)
