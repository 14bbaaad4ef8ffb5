"""contract diff on records of real Megatron-Bridge commits (parent and child of three packing fixes, recorded with
``contract record --megatron-bridge``): the diff names the observation and the values at the first difference."""

from __future__ import annotations

from pathlib import Path

import pytest

from mbridge_seqpack.cli.main import main

FIXTURES = Path(__file__).with_name("contract_fixtures")


def _pair(pr: str) -> tuple[str, str]:
    return str(next(FIXTURES.glob(f"{pr}_parent_*.json"))), str(next(FIXTURES.glob(f"{pr}_child_*.json")))


@pytest.mark.parametrize(
    "pr, observation, before, after",
    [
        ("pr3926", "step.get_batch.pp_stages", "before: null", "after:  [[11, 12, 13, 14, 21, 22"),
        ("pr4675", "collate.packed.mapped_padding", "before: 1", "after:  0"),
        ("pr5470", "collate.packed.mult1", "before: (absent)", "after:  [[false, false"),
    ],
)
def test_real_changes_are_named(pr: str, observation: str, before: str, after: str, capsys) -> None:
    a, b = _pair(pr)
    assert main(["contract", "diff", a, b]) == 1
    out = capsys.readouterr().out
    assert observation in out and before in out and after in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_a_record_against_itself_is_unchanged(capsys) -> None:
    a, _ = _pair("pr4675")
    assert main(["contract", "diff", a, a]) == 0


def test_not_a_record_is_a_usage_error(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert main(["contract", "diff", str(bad), str(bad)]) == 2
    assert "not a contract record" in capsys.readouterr().err
