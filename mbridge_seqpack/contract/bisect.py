"""``contract bisect-run``: one step of ``git bisect run``. The checkout (``--megatron-bridge .`` under
``git bisect``, which has moved it to the commit under test; without it, the installed Megatron-Bridge) is recorded
for the deciding observations and compared with the reference record.

Exit 0: every deciding observation is unchanged (good). 1: one changed (bad). 125: none changed but one cannot be
observed at this commit (its function is not found or does not import with the installed Megatron-Core, its inputs
cannot be built, or ``megatron.bridge`` itself does not import): neither good nor bad, git skips it. 128: the kit
itself cannot run (a missing record, an unknown ``--only``, a plugin bug): git aborts the bisect, as its
documentation says of any exit above 127, instead of counting every commit bad (2 and 3 are in git's "bad" range).

By default the observations of outcomes decide (values and ``validate()`` verdicts): ``census.scan``, the guards
of the functions the inputs ran, is shown but decides only when named with ``--only``, since a new guard on a path
these inputs do not take (a check of a new argument) is a change of code, not of what is observed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from mbridge_seqpack.contract.diff import Diff, diff_records
from mbridge_seqpack.contract.record import CheckoutImportError, RecordingFailed, load_record, record
from mbridge_seqpack.errors import UsageError

__all__ = ["UNCHANGED", "CHANGED", "SKIP", "ABORT", "INFORMATIVE", "deciding", "decide", "bisect_step"]

UNCHANGED, CHANGED, SKIP, ABORT = 0, 1, 125, 128

#: shown, not deciding, unless named with --only
INFORMATIVE = ("census.scan",)


def deciding(reference: dict[str, Any], only: Sequence[str] | None, against: Path | str) -> list[str]:
    """The observations that decide: those named, each recorded ``ok`` in the reference; by default every
    observation the reference holds ``ok`` but the informative ones."""
    observed = reference["observations"]
    if only:
        missing = [n for n in only if n not in observed]
        if missing:
            raise UsageError(f"--only {' '.join(missing)}: not in {against}; record it there first (contract record)")
        blind = [n for n in only if observed[n].get("status") != "ok"]
        if blind:
            raise UsageError(
                f"--only {' '.join(blind)}: {against} holds no value of it ({observed[blind[0]].get('status')}); "
                "take as reference a commit where it is observed"
            )
        return list(only)
    return sorted(n for n, o in observed.items() if o.get("status") == "ok" and n not in INFORMATIVE)


def decide(
    reference: dict[str, Any], now: dict[str, Any], wanted: Sequence[str], *, a_name: str = "A", b_name: str = "B"
) -> tuple[int, Diff, str]:
    """(exit code, the diff of the observations both records hold a value of, a one-line reason)."""
    ref, got = reference["observations"], now["observations"]
    blind = [n for n in wanted if got.get(n, {}).get("status") != "ok"]
    seen = [n for n in wanted if n not in blind]
    keep = set(seen)
    diff = diff_records(
        {**reference, "only": sorted(keep), "observations": {n: ref[n] for n in keep}},
        {**now, "only": sorted(keep), "observations": {n: got[n] for n in keep}},
        a_name=a_name,
        b_name=b_name,
        count_guards="census.scan" in seen,
    )
    if diff.changed:
        return CHANGED, diff, f"changed: {', '.join(c.observation for c in diff.changes)}"
    if blind:
        why = "; ".join(f"{n} {got.get(n, {}).get('status', 'not recorded')}" for n in blind)
        return SKIP, diff, f"skip: cannot be observed at this commit ({why}); unchanged: {', '.join(seen) or 'none'}"
    return UNCHANGED, diff, f"unchanged: {', '.join(seen)}"


def bisect_step(against: Path, checkout: Path | None, only: Sequence[str] | None) -> tuple[int, Diff | None, str]:
    """(exit code, the diff or None, a one-line reason)."""
    reference = load_record(against)
    wanted = deciding(reference, only, against)
    if checkout is not None:
        if not checkout.is_dir():
            raise UsageError(f"--megatron-bridge {checkout}: no such folder; pass a Megatron-Bridge repository root")
        if not (checkout / "src" / "megatron" / "bridge" / "__init__.py").is_file():
            # a commit from before the src/megatron/bridge layout: neither good nor bad, git bisect skips it
            return SKIP, None, f"skip: {checkout} has no src/megatron/bridge/__init__.py at this commit"
    try:
        now: dict[str, Any] = record(checkout, wanted)
    except (CheckoutImportError, RecordingFailed) as exc:
        return SKIP, None, f"skip: {exc}"
    commit = now["megatron_bridge"].get("commit")
    where = f"{checkout}{f' at {commit[:12]}' if commit else ''}" if checkout else "the installed Megatron-Bridge"
    return decide(reference, now, wanted, a_name=str(against), b_name=where)
