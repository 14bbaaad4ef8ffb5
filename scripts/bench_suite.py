"""Benchmark: how long the test suite takes, per tier, on this machine, recorded for docs/development.md.

Runs ``bash scripts/test.sh --fast`` (the fast tier: nothing that needs Megatron-Bridge, Transformer Engine, Ray or a
GPU) and then ``bash scripts/test.sh`` (the whole suite: every test but the Ray ones, then those), each timed from
outside, and writes their wall seconds and pytest's summary lines to ``docs/bench/bench_suite.json`` with the
machine's core count; ``scripts/generate.py`` puts them in docs/development.md. Run it on an idle machine: the times
are what a contributor waits, and a loaded machine makes them longer. Exits 1 when a tier fails (nothing is recorded
then).

    uv run python scripts/bench_suite.py [--tier fast] [--tier full]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench" / "bench_suite.json"
#: pytest's last line: "709 passed, 299 skipped, 965 deselected, 6 warnings in 96.89s (0:01:36)"
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|errors?).*?) in [\d.]+s")
COMMANDS = {"fast": ["bash", "scripts/test.sh", "--fast"], "full": ["bash", "scripts/test.sh"]}


def summaries(output: str) -> list[str]:
    """pytest's summary lines in ``output``, without the time and the warnings count."""
    found = []
    for line in output.splitlines():
        match = SUMMARY.match(line.strip())
        if match:
            found.append(re.sub(r", \d+ warnings?", "", match.group(1)))
    return found


def run_tier(name: str) -> dict[str, object]:
    """One tier: its wall seconds, exit status and summary lines (its output is printed as it runs)."""
    begin = time.perf_counter()
    proc = subprocess.Popen(COMMANDS[name], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line)
    code = proc.wait()
    return {
        "seconds": round(time.perf_counter() - begin, 1),
        "exit": code,
        "summaries": summaries("".join(lines)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", action="append", choices=list(COMMANDS), help="default: both")
    args = parser.parse_args()
    record = json.loads(OUT.read_text()) if OUT.is_file() else {}
    for name in args.tier or list(COMMANDS):
        result = run_tier(name)
        print(f"{name}: {result['seconds']:.0f} s, exit {result['exit']}: {'; '.join(result['summaries'])}")
        if result["exit"] != 0:
            return 1
        record[name] = {**result, "cores": os.cpu_count(), "date": datetime.date.today().isoformat()}
    temporary = OUT.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, OUT)
    print(f"recorded in {OUT.relative_to(ROOT)}; run scripts/generate.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
