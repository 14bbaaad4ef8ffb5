"""The benchmark scripts that import the plugin's internals run, at a small size: a refactor that moves what they
import breaks a test, not the next benchmark run (scripts/bench_verify.py once imported a function that was gone)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("script", "args", "last_line"),
    [
        (
            "bench_verify.py",
            ["--width", "1024", "--rows", "2"],
            "verify, rows 1,024 tokens wide: 2 row(s) in ",
        ),  # ok=True
        ("bench_launch_check.py", ["--width", "1024", "--rows", "2"], "launch check at 10x the size: "),
    ],
)
def test_a_pack_benchmark_runs_at_a_small_size(script: str, args: list[str], last_line: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith(last_line)
    assert "ok=False" not in done.stdout and ("ok=True" in done.stdout) == (script == "bench_verify.py")
