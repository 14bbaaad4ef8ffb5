"""The fast tier (``scripts/test.sh --fast``, tests/conftest.py): a test that takes the ``megatron_bridge`` fixture is
marked slow and left out; one that imports Megatron anyway is skipped with the module it imported, never run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pytest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_fixture_marks_slow_and_the_fast_tier_skips_what_imports_megatron() -> None:
    slow = _pytest("--collect-only", "-m", "slow", "tests/cli/test_pack_summary.py")
    assert slow.stdout.splitlines()[:2] == [
        "tests/cli/test_pack_summary.py::test_loss_tokens_and_sequences_that_train_on_nothing_are_counted_and_sealed",
        "tests/cli/test_pack_summary.py::test_pack_recipe_runs_the_recipes_row_rules_on_the_pack",
    ]
    fast = _pytest("--fast", "-rs", "tests/devtools/test_census.py", "tests/cli/test_pack_summary.py")
    assert fast.returncode == 0, fast.stdout[-3000:]
    reason = "imports megatron: not in the fast tier (scripts/test.sh runs it)"
    assert f"SKIPPED [1] tests/devtools/test_census.py:35: {reason}" in fast.stdout
    last = fast.stdout.strip().splitlines()[-1]
    assert last.startswith("3 passed, 9 skipped, 2 deselected in "), last


def test_the_suite_benchmark_reads_pytests_summary_lines() -> None:
    """scripts/bench_suite.py records pytest's own counts (the warnings count, which varies, left out)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_suite", ROOT / "scripts" / "bench_suite.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    output = (
        "....\n709 passed, 299 skipped, 965 deselected, 6 warnings in 96.89s (0:01:36)\nmore\n"
        "======= 6 passed, 1 warning in 371.20s (0:06:11) =======\n"
    )
    assert bench.summaries(output) == ["709 passed, 299 skipped, 965 deselected", "6 passed"]
