"""contract/bisect.py's decision on hand-made records: changed is bad (1) whatever else, an observation the commit
cannot make is a skip (125) never bad, the guards are shown but decide only when named, and a parent that raised
reads as an outcome, not as the keys of the value that replaced it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mbridge_seqpack.contract.bisect import decide, deciding
from mbridge_seqpack.contract.diff import diff_records, render_text
from mbridge_seqpack.errors import UsageError

FUNCTION = "megatron.bridge.data.packing.gpt_sft:GPTSFTPackedDataset.collate_fn"


def _ok(value: Any) -> dict[str, Any]:
    return {"function": FUNCTION, "inputs": "3 rows", "status": "ok", "value": value}


def _record(**observations: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": "mbridge-seqpack contract record",
        "observations_version": 2,
        "observations": {k.replace("_", "."): v for k, v in observations.items()},
    }


GUARD = "megatron/bridge/data/packing/gpt_sft.py GPTSFTPackedDataset.collate_fn"
REFERENCE = _record(
    collate=_ok({"rows 0,1": {"cu_seqlens": [[0, 4, 20]]}}),
    step=_ok({"row 0": [1, 2]}),
    census_scan=_ok({"collate": {"raise::a::0": f"{GUARD}: raise ValueError('x')"}}),
)


def _absent(name: str) -> dict[str, Any]:
    return {"function": FUNCTION, "inputs": "", "status": "absent", "why": f"{name}: ImportError: mcore"}


def test_the_defaults_decide_on_outcomes_not_on_guards() -> None:
    assert deciding(REFERENCE, None, "ref.json") == ["collate", "step"]
    assert deciding(REFERENCE, ["census.scan"], "ref.json") == ["census.scan"]
    now = copy.deepcopy(REFERENCE)
    now["observations"]["census.scan"]["value"]["collate"] = {"raise::b::0": f"{GUARD}: raise ValueError('y')"}
    assert decide(REFERENCE, now, ["collate", "step"])[0] == 0
    code, diff, why = decide(REFERENCE, now, ["census.scan"])
    assert (code, why) == (1, "changed: census.scan")
    assert diff.changes[0].details == [f"changed guard {GUARD}: raise ValueError('x') -> raise ValueError('y')"]


def test_unobservable_is_skip_and_a_change_is_bad_whatever_else() -> None:
    now = copy.deepcopy(REFERENCE)
    now["observations"]["step"] = _absent("gpt_step")
    code, diff, why = decide(REFERENCE, now, ["collate", "step"])
    assert code == 125 and not diff.changed
    assert why == "skip: cannot be observed at this commit (step absent); unchanged: collate"
    now["observations"].pop("step")
    assert decide(REFERENCE, now, ["collate", "step"])[2].startswith("skip: cannot be observed at this commit (step ")
    now["observations"]["collate"]["value"]["rows 0,1"]["cu_seqlens"][0][1] = 5
    assert decide(REFERENCE, now, ["collate", "step"])[:3:2] == (1, "changed: collate")
    assert decide(REFERENCE, REFERENCE, ["collate", "step"])[::2] == (0, "unchanged: collate, step")


def test_a_reference_without_a_value_decides_nothing() -> None:
    blind = copy.deepcopy(REFERENCE)
    blind["observations"]["step"] = _absent("gpt_step")
    assert deciding(blind, None, "ref.json") == ["collate"]
    with pytest.raises(UsageError, match=r"--only step: ref.json holds no value of it \(absent\); take as"):
        deciding(blind, ["step"], "ref.json")
    with pytest.raises(UsageError, match="--only nosuch: not in ref.json; record it there first"):
        deciding(blind, ["nosuch"], "ref.json")


def test_a_parent_that_raised_reads_as_an_outcome() -> None:
    """PR 5400's shape: the parent's collate raised on ragged rows, the child's returns a batch."""
    before = _record(collate=_ok({"rows 0,1,2": {"raised": "ValueError: expected sequence of length 4 at dim 1"}}))
    after = _record(collate=_ok({"rows 0,1,2": {"attention_mask": None, "cu_seqlens": [[0, 4, 20]]}}))
    diff = diff_records(before, after)
    (change,) = diff.changes
    assert (change.input, change.position, change.outcome) == ("rows 0,1,2", "", "raised ValueError -> returns")
    assert change.before == "raised ValueError: expected sequence of length 4 at dim 1"
    text = render_text(diff)
    assert "  outcome: raised ValueError -> returns\n" in text and "(absent)" not in text
    assert diff_records(after, before).changes[0].outcome == "returns -> raised ValueError"
    other = _record(collate=_ok({"rows 0,1,2": {"raised": "TypeError: no"}}))
    assert diff_records(before, other).changes[0].outcome == "raised ValueError -> raised TypeError"


def test_a_validate_case_one_commit_cannot_build_decides_nothing() -> None:
    def verdicts(cp0: dict[str, Any]) -> dict[str, Any]:
        base = {"config": "world 8", "verdict": "ok"}
        return _record(validate_rule_cases=_ok({"base": base, "cp0": {"config": "world 8, cp 0", **cp0}}))

    built, unbuilt = verdicts({"verdict": "ZeroDivisionError: x"}), verdicts({"status": "not_run", "why": "no field"})
    assert not diff_records(built, unbuilt).changed
    assert diff_records(built, verdicts({"verdict": "ok"})).changes[0].details == [
        "cp0 (world 8, cp 0): ZeroDivisionError: x -> ok"
    ]
