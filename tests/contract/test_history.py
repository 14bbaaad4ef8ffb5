"""The contract on real Megatron-Bridge history, offline: records of real commits (tests/contract_fixtures/history/,
each made once with ``contract record --megatron-bridge`` on a checkout of that commit's ``src``) compared and
bisected as a maintainer would, with the defaults.

- PR 4685, a pure refactor (the data package moved to config and builder classes, 2026-07-09): parent and child
  diff empty; two records of the parent, a commit whose prep ignored its seed (before PR 4891), diff empty.
- PR 5400, a collate that stopped raising on ragged rows: the diff says ``raised ... -> returns``.
- PR 5213, the packed collate's loss mask no longer zeroed at EOS: a default bisect over the commits of
  ``src/megatron/bridge/data`` from adb8c2320 (good) to 81c47141f (bad) lands on it, past 317f4a21b, which added a
  guard to ``first_fit`` (a check of a new argument) on the path the prep runs.
- Megatron-Bridge main (067f987df): ``gpt_step`` no longer imports with the installed Megatron-Core; the step's
  observations cannot be made there, and bisect-run says skip (125), not bad.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from mbridge_seqpack.cli.main import main
from mbridge_seqpack.contract.bisect import decide, deciding
from mbridge_seqpack.contract.diff import diff_records, render_text

HISTORY = Path(__file__).resolve().parents[1] / "contract_fixtures" / "history"

#: `git log --first-parent --reverse --format=%h adb8c2320^..81c47141f -- src/megatron/bridge/data` (main): the
#: commits `git bisect start 81c47141f adb8c2320 -- src/megatron/bridge/data` bisects, good first, bad last
RANGE_5213 = ("adb8c2320", "19f7367b1", "317f4a21b", "84e7948ea", "81c47141f")


def _path(name: str) -> Path:
    return next(HISTORY.glob(f"*{name}.json"))


@lru_cache(maxsize=None)
def _load(name: str) -> str:
    return _path(name).read_text()


def _record(name: str) -> dict[str, Any]:
    return json.loads(_load(name))


def _diff(a: str, b: str, capsys) -> tuple[int, str]:
    code = main(["contract", "diff", str(_path(a)), str(_path(b))])
    return code, capsys.readouterr().out


def test_two_records_of_one_commit_diff_empty(capsys) -> None:
    """8614c895b's prep shuffled with NumPy's global state (its seed was ignored until PR 4891): seeded here."""
    assert _record("8614c895b")["megatron_bridge"]["commit"].startswith("8614c895b")
    code, out = _diff("8614c895b", "8614c895b_again", capsys)
    assert (code, out.splitlines()[0]) == (0, "no change: every observation of both records is the same")
    assert _record("8614c895b")["observations"] == _record("8614c895b_again")["observations"]


def test_a_pure_refactor_diffs_empty(capsys) -> None:
    parent, child = _record("8614c895b"), _record("e577829e1")
    # the functions moved (prep, packed dataset, in-batch packing): found where each commit keeps them
    moved = {
        "megatron.bridge.data.datasets.packed_sequence:prepare_packed_sequence_data",
        "megatron.bridge.data.datasets.sft:GPTSFTPackedDataset",
        "megatron.bridge.data.sequence_batching:pack_right_padded_sequence_batch_to_mcore_thd",
    }
    assert moved <= set(parent["megatron_bridge"]["resolved"])
    assert not moved & set(child["megatron_bridge"]["resolved"])
    assert {n for n, o in parent["observations"].items() if o["status"] == "ok"} >= {
        "collate.in_batch", "prep.pack", "collate.packed.mult1", "step.get_batch.pp_stages"
    }  # fmt: skip
    code, out = _diff("8614c895b", "e577829e1", capsys)
    assert code == 0
    assert out.splitlines()[0] == (
        "no change: every observation of both records is the same (1 guard of the code they ran changed: below, "
        "not counted)"
    )
    # prep_packed_sequence_data -> prepare_gpt_sft_packed_data kept its guard (not listed); one guard is new
    assert "  added guard megatron/bridge/data/packing/offline.py tokenize_dataset: if dataset is None: raise" in out
    assert "removed guard" not in out


def test_a_parent_that_raised_is_an_outcome(capsys) -> None:
    code, out = _diff("f109ea541", "4e085c1e4", capsys)
    assert code == 1
    assert "  outcome: raised ValueError -> returns\n" in out
    assert "(absent)" not in out


def _first_bad(names: tuple[str, ...], only: list[str] | None) -> tuple[str, list[tuple[str, int]]]:
    """git bisect's search on a linear range with ``bisect-run``'s decision at each step: (first bad, steps)."""
    reference = _record(names[0])
    wanted = deciding(reference, only, names[0])
    good, bad, steps = 0, len(names) - 1, []
    untested = list(range(1, len(names) - 1))
    while pending := [i for i in untested if good < i < bad]:
        mid = pending[len(pending) // 2]
        code = decide(reference, _record(names[mid]), wanted)[0]
        steps.append((names[mid], code))
        untested.remove(mid)
        if code == 0:
            good = mid
        elif code == 1:
            bad = mid
    return names[bad], steps


def test_every_commit_of_the_range_against_the_good_one() -> None:
    reference = _record(RANGE_5213[0])
    wanted = deciding(reference, None, "good")
    assert "census.scan" not in wanted and "collate.packed.mult4" in wanted
    codes = {name: decide(reference, _record(name), wanted)[::2] for name in RANGE_5213[1:]}
    assert {n: c for n, (c, _) in codes.items()} == {"19f7367b1": 0, "317f4a21b": 0, "84e7948ea": 1, "81c47141f": 1}
    assert codes["84e7948ea"][1] == "changed: collate.packed.mult4, step.get_batch.cp2"


def test_a_default_bisect_lands_on_the_packing_change() -> None:
    assert _first_bad(RANGE_5213, None)[0] == "84e7948ea"
    _, diff, _ = decide(_record("317f4a21b"), _record("84e7948ea"), ["collate.packed.mult4", "step.get_batch.cp2"])
    # the EOS that ends the first sequence keeps its loss now, in the collate and on CP rank 1 of the step
    assert [(c.observation, c.input, c.position, c.before, c.after) for c in diff.changes] == [
        ("collate.packed.mult4", "rows 0,1,2", "loss_mask[0][6]", 0, 1),
        ("step.get_batch.cp2", "CP 2 rank 1", "[2][0][3]", 0, 1),
    ]


def test_guards_decide_only_when_named() -> None:
    """317f4a21b added ``raise ValueError`` to ``first_fit`` (a check of its new ``item_lengths``): a guard of code
    the prep runs, so a bisect counting guards stops there; the default does not."""
    diff = diff_records(_record("19f7367b1"), _record("317f4a21b"))
    assert not diff.changed
    (census,) = diff.guards
    added = "added guard megatron/bridge/data/packing/algorithms.py first_fit: if item_lengths is not None and"
    assert any(d.startswith(added) for d in census.details), census.details
    assert _first_bad(RANGE_5213, ["census.scan"])[0] == "317f4a21b"


def test_at_main_what_cannot_be_observed_is_a_skip() -> None:
    """At 067f987df ``gpt_step`` does not import with the installed Megatron-Core: the step's observations are
    absent (never another ``get_batch`` of the same name: diffusion's ``dgpt_step`` has one), and a bisect they
    decide skips the commit. The collate did change by then (PR 5470's ``padding_mask``): the defaults say bad."""
    reference, main_record = _record("4e085c1e4"), _record("067f987df")
    assert not [r for r in main_record["megatron_bridge"]["resolved"] if ".diffusion." in r]
    steps = {n: o["status"] for n, o in main_record["observations"].items() if n.startswith("step.")}
    assert steps == dict.fromkeys(
        ("step.get_batch.cp2", "step.get_batch.pp_stages", "step.packed_seq_params"), "absent"
    )
    assert (
        "megatron.bridge.training.gpt_step:get_batch: ImportError"
        in main_record["observations"]["step.get_batch.cp2"]["why"]
    )
    code, diff, why = decide(reference, main_record, sorted(steps))
    assert (code, diff.changed) == (125, False)
    assert why == (
        "skip: cannot be observed at this commit (step.get_batch.cp2 absent; step.get_batch.pp_stages absent; "
        "step.packed_seq_params absent); unchanged: none"
    )
    code, diff, why = decide(reference, main_record, deciding(reference, None, "ref"))
    assert (code, why) == (1, "changed: collate.packed.mult1, collate.packed.mult4")
    assert render_text(diff).startswith("2 observations changed")
