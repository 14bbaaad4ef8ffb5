"""contract diff on records of real Megatron-Bridge commits (parent and child of three packing fixes, recorded with
``contract record --megatron-bridge``): the diff names the observation and the values at the first difference."""

from __future__ import annotations

from pathlib import Path

import pytest

from mbridge_seqpack.cli.main import main
from tests.support.stderr_text import unwrap

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
    assert "not a contract record" in unwrap(capsys.readouterr().err)


@pytest.fixture(scope="module")
def installed_record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One record of the installed Megatron-Bridge, made by the command (a subprocess: the import, ~35 s here)."""
    out = tmp_path_factory.mktemp("contract") / "installed.json"
    assert main(["contract", "record", "--output", str(out)]) == 0
    return out


def test_the_installed_version_against_itself(installed_record: Path, tmp_path: Path, capsys) -> None:
    """The installed 0.6.2 recorded: against itself nothing changed (exit 0); bisect-run against it from a checkout
    that cannot be imported exits 125, which `git bisect run` skips."""
    import json

    record = json.loads(installed_record.read_text())
    assert main(["contract", "diff", str(installed_record), str(installed_record)]) == 0
    broken = tmp_path / "broken_checkout"
    (broken / "src" / "megatron" / "bridge").mkdir(parents=True)
    (broken / "src" / "megatron" / "bridge" / "__init__.py").write_text("raise ImportError('half-merged commit')\n")
    argv = ["contract", "bisect-run", "--against", str(installed_record), "--only", "collate.packed.mult1"]
    assert main([*argv, "--megatron-bridge", str(broken)]) == 125
    assert main([*argv, "--megatron-bridge", str(tmp_path)]) == 2  # not a repository root: the user's mistake
    assert record["megatron_bridge"] and "collate.packed.mult1" in record["observations"]
