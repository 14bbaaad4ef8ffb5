"""``contract bisect-run``: one step of ``git bisect run``. The checkout (``--megatron-bridge .`` under
``git bisect``, which has moved it to the commit under test; without it, the installed Megatron-Bridge) is recorded
for the named observations and compared with the reference record: exit 0 unchanged (good), 1 changed (bad), 125
the commit cannot be imported (skip)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from mbridge_seqpack.contract.diff import Diff, diff_records
from mbridge_seqpack.contract.record import CheckoutImportError, load_record, record
from mbridge_seqpack.errors import UsageError

__all__ = ["UNCHANGED", "CHANGED", "SKIP", "bisect_step"]

UNCHANGED, CHANGED, SKIP = 0, 1, 125


def bisect_step(against: Path, checkout: Path | None, only: Sequence[str] | None) -> tuple[int, Diff | None, str]:
    """(exit code, the diff or None, a one-line reason)."""
    reference = load_record(against)
    wanted = list(only or [])
    missing = [n for n in wanted if n not in reference["observations"]]
    if missing:
        raise UsageError(f"--only {' '.join(missing)}: not in {against}; record it there first (contract record)")
    if not wanted:
        wanted = sorted(reference["observations"])
    if checkout is not None:
        if not checkout.is_dir():
            raise UsageError(f"--megatron-bridge {checkout}: no such folder; pass a Megatron-Bridge repository root")
        if not (checkout / "src" / "megatron" / "bridge" / "__init__.py").is_file():
            # a commit from before the src/megatron/bridge layout: neither good nor bad, git bisect skips it
            return SKIP, None, f"skip: {checkout} has no src/megatron/bridge/__init__.py at this commit"
    try:
        now: dict[str, Any] = record(checkout, wanted)
    except CheckoutImportError as exc:
        return SKIP, None, f"skip: {exc}"
    kept = {**reference, "only": wanted, "observations": {n: reference["observations"][n] for n in wanted}}
    commit = now["megatron_bridge"].get("commit")
    where = f"{checkout}{f' at {commit[:12]}' if commit else ''}" if checkout else "the installed Megatron-Bridge"
    diff = diff_records(kept, now, a_name=str(against), b_name=where)
    if diff.changed:
        return CHANGED, diff, f"changed: {', '.join(c.observation for c in diff.changes)}"
    return UNCHANGED, diff, f"unchanged: {', '.join(wanted)}"
