"""Every count the README and docs/ quote, computed from what it counts, written into the text (``--check``: say
which differ and exit 1, writing nothing; ``tests/project/test_doc_numbers.py`` runs it). A count typed by hand
drifts the first time a rule, a report or a recipe is added; here each is a pattern of the sentence that carries it.

    .venv/bin/python scripts/doc_numbers.py [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package and tests, whatever is installed


@cache
def _rules() -> dict[str, int]:
    from mbridge_seqpack.rules import all_rules

    rules = all_rules()
    return {
        "rules": len(rules),
        "errors": sum(1 for r in rules if r.severity == "error"),
        "advisories": sum(1 for r in rules if r.severity == "advisory"),
    }


@cache
def _census() -> dict[str, int]:
    from devtools.census.files import PATH_FILES

    sites = json.loads((ROOT / "devtools" / "census" / "inventory.json").read_text())["sites"]
    return {"sites": sum(len(found) for found in sites.values()), "files": len(PATH_FILES)}  # files on the path


@cache
def _reports() -> dict[str, int]:
    from tests.support.real_reports import REPORTS

    return {
        "reports": len({r.url for r in REPORTS}),
        "failures": sum(1 for r in REPORTS if r.expected),
        "near_misses": sum(1 for r in REPORTS if not r.expected),
    }


@cache
def _zoo() -> dict[str, int]:
    shipped = json.loads((ROOT / "tests" / "zoo" / "expected.json").read_text())["shipped"]
    return {
        "recipes": len(shipped),
        "not_built": sum(1 for v in shipped.values() if str(v.get("megatron", "")).startswith("not built")),
    }


@cache
def _runner() -> dict[str, int]:
    return {"cases": len(json.loads((ROOT / "tests" / "recipes" / "runner_fixes.json").read_text())["cases"])}


@dataclass(frozen=True)
class Count:
    """One sentence that quotes counts: ``pattern`` has a group per count, named by the key of ``source()``."""

    file: str
    pattern: str
    source: Callable[[], dict[str, int]]


COUNTS = (
    Count(
        "README.md",
        r"the rule catalog: (?P<rules>\d+) rules \((?P<errors>\d+) errors, (?P<advisories>\d+) advisories\)",
        _rules,
    ),
    Count("README.md", r"Transformer Engine \((?P<sites>\d+) sites, each mapped", _census),
    Count(
        "README.md",
        r"(?P<reports>\d+) public reports \((?P<failures>\d+) failures, (?P<near_misses>\d+) near-misses\), "
        r"Megatron-Bridge's (?P<recipes>\d+) recipes",
        lambda: {**_reports(), **_zoo()},
    ),
    Count("docs/evidence.md", r"from (?P<reports>\d+) public bug reports", _reports),
    Count("docs/evidence.md", r"`ConfigContainer`: (?P<failures>\d+) failures, each rejected", _reports),
    Count("docs/evidence.md", r"and (?P<near_misses>\d+) working near-misses", _reports),
    Count("docs/evidence.md", r"TE \((?P<sites>\d+) sites in\s+(?P<files>\d+) files\)", _census),
    Count("docs/evidence.md", r"The (?P<not_built>\d+) recipes not built", _zoo),
    Count("docs/cli.md", r"On those (?P<cases>\d+) cases, with the runner", _runner),
)


def render(text: str, counts: list[Count]) -> tuple[str, list[str]]:
    """``text`` with every count of ``counts`` put right, and what was wrong (or not found)."""
    wrong = []
    for count in counts:
        match = re.search(count.pattern, text)
        if match is None:
            wrong.append(f"{count.file}: no sentence matches {count.pattern!r}")
            continue
        values = count.source()
        spans = sorted(((match.span(name), str(values[name]), name) for name in match.groupdict()), reverse=True)
        for (start, end), value, name in spans:
            if text[start:end] != value:
                wrong.append(f"{count.file}: {name} is {text[start:end]}, the count is {value}")
                text = text[:start] + value + text[end:]
    return text, wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a count differs; write nothing")
    args = parser.parse_args(argv)
    problems = []
    for name in sorted({c.file for c in COUNTS}):
        path = ROOT / name
        before = path.read_text()
        after, wrong = render(before, [c for c in COUNTS if c.file == name])
        problems += wrong
        if not args.check and after != before:
            path.write_text(after)
    for problem in problems:
        print(problem)
    return 1 if args.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
