"""The counts the README and docs/ quote are the generator's (scripts/doc_numbers.py), and a hand-typed count that
drifts is caught."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("doc_numbers", ROOT / "scripts" / "doc_numbers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["doc_numbers"] = module
    spec.loader.exec_module(module)
    return module


def test_every_quoted_count_is_current(capsys) -> None:
    assert _generator().main(["--check"]) == 0, capsys.readouterr().out


def test_a_drifted_count_is_named_and_put_right() -> None:
    from mbridge_seqpack.rules import all_rules

    generator = _generator()
    readme = (ROOT / "README.md").read_text()
    rules = len(all_rules())
    drifted = readme.replace(f"the rule catalog: {rules} rules", f"the rule catalog: {rules + 1} rules", 1)
    assert drifted != readme
    counts = [c for c in generator.COUNTS if c.file == "README.md"]
    fixed, wrong = generator.render(drifted, counts)
    assert wrong == [f"README.md: rules is {rules + 1}, the count is {rules}"]
    assert fixed == readme


def test_a_sentence_that_no_longer_matches_is_reported() -> None:
    generator = _generator()
    counts = [c for c in generator.COUNTS if c.file == "docs/cli.md"]
    _, wrong = generator.render("nothing here", counts)
    assert wrong == [f"docs/cli.md: no sentence matches {counts[0].pattern!r}"]
