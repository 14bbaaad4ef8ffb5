"""Benchmark: how long the command line takes to say something and to finish, beside a bare ``import megatron.bridge``
in the same run (Megatron-Bridge's import is the floor of every command that needs it).

Commands: ``--help``, ``check small_gpt_smoke_4k`` and ``pack`` of the embedded corpus x10 (every text distinct,
17,990 records, 4k rows), each run as the console script runs it, in a fresh process, for every source tree given
(``--tree NAME=DIR``; e.g. the code before a change, exported with ``git archive``, and the checkout). Rounds are
interleaved (every contender once per round, in a rotated order) so that a machine shared with others loads all
of them alike; the report gives medians of wall time, of the time to the first line on stderr, and of CPU time
(user + system, which the load of other processes changes much less). ``--pycache DIR`` adds the bare import and
``check`` with bytecode cached there (``PYTHONPYCACHEPREFIX``; the first round fills it).

    uv run python scripts/bench_startup.py --tree before=/tmp/before --tree after=. [--rounds 3] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = "import sys; from mbridge_seqpack.cli import main; sys.exit(main())"
BARE = "import warnings; warnings.simplefilter('ignore'); import megatron.bridge"


def _corpus(path: Path, copies: int) -> int:
    """The embedded corpus ``copies`` times, every prompt and answer made distinct (as bench_tokenize.py does)."""
    rows = [
        json.loads(line)
        for line in (ROOT / "mbridge_seqpack" / "data" / "sft_sample" / "training.jsonl").read_text().splitlines()
    ]
    with open(path, "w") as out:
        for copy in range(copies):
            for row in rows:
                variant = f" (variant {copy})"
                record = {**row, "input": row["input"] + variant, "output": row["output"] + variant}
                out.write(json.dumps(record) + "\n")
    return len(rows) * copies


def run(argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, object]:
    """One process: wall time, time to its first stderr line, CPU time, exit code and its stderr lines."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    threading.Thread(target=process.stdout.read, daemon=True).start()  # type: ignore[union-attr]
    lines: list[str] = []
    first = None
    for line in process.stderr:  # type: ignore[union-attr]
        if first is None:
            first = time.perf_counter() - start
        lines.append(line.rstrip("\n"))
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "first_stderr_line_s": first,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "rc": process.returncode,
        "stderr_lines": len(lines),
        "first_stderr_line": lines[0][:200] if lines else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=DIR: a source tree to put on PYTHONPATH")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--copies", type=int, default=10, help="copies of the embedded corpus for pack")
    parser.add_argument("--pycache", default=None, help="also time the import and check with bytecode cached here")
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "bench_startup.json"))
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.tree)

    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        work = Path(tmp)
        corpus = work / "x.jsonl"
        records = _corpus(corpus, args.copies)
        base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MBRIDGE_SEQPACK_MODE")}
        contenders: dict[str, tuple[list[str], dict[str, str]]] = {
            "import megatron.bridge": ([sys.executable, "-c", BARE], base)
        }
        cached = None
        if args.pycache:
            cached = {k: v for k, v in base.items() if k != "PYTHONDONTWRITEBYTECODE"}
            cached["PYTHONPYCACHEPREFIX"] = str(Path(args.pycache).resolve())
            contenders["import megatron.bridge, bytecode cached"] = ([sys.executable, "-c", BARE], cached)
        for name, directory in trees.items():
            env = {**base, "PYTHONPATH": str(Path(directory).resolve())}
            cli = [sys.executable, "-c", CLI]
            contenders[f"{name}: --help"] = ([*cli, "--help"], env)
            contenders[f"{name}: check"] = ([*cli, "check", "small_gpt_smoke_4k"], env)
            out = str(work / f"pack_{name}")
            contenders[f"{name}: pack"] = (
                [*cli, "pack", str(corpus), "--pack-size", "4096", "--output", out, "--overwrite"],
                env,
            )
            if cached is not None:
                contenders[f"{name}: check, bytecode cached"] = (
                    [*cli, "check", "small_gpt_smoke_4k"],
                    {**cached, "PYTHONPATH": env["PYTHONPATH"]},
                )
        names = list(contenders)
        for name in names:  # fill the bytecode cache (not timed)
            if name.endswith("bytecode cached") and name != "import megatron.bridge, bytecode cached":
                run(*contenders[name], work)
        runs: dict[str, list[dict[str, object]]] = {name: [] for name in names}
        loads = []
        for index in range(args.rounds):
            order = names[index % len(names) :] + names[: index % len(names)]
            for name in order:
                argv, env = contenders[name]
                loads.append(os.getloadavg()[0])
                result = run(argv, env, work)
                if result["rc"] != 0:
                    raise SystemExit(f"{name} failed (rc {result['rc']}): {result['first_stderr_line']}")
                runs[name].append(result)
                print(
                    f"round {index + 1} {name:45s} wall {result['wall_s']:6.1f} s  first line "
                    f"{result['first_stderr_line_s'] or float('nan'):6.2f} s  cpu {result['cpu_s']:6.1f} s  "
                    f"{result['stderr_lines']} stderr lines",
                    flush=True,
                )

    def median(name: str, key: str) -> float | None:
        values = [r[key] for r in runs[name] if r[key] is not None]
        return statistics.median(values) if values else None  # type: ignore[arg-type]

    summary = {
        name: {key: median(name, key) for key in ("wall_s", "first_stderr_line_s", "cpu_s", "stderr_lines")}
        | {"first_stderr_line": runs[name][0]["first_stderr_line"]}
        for name in names
    }
    report = {
        "records": records,
        "rounds": args.rounds,
        "cores": len(os.sched_getaffinity(0)),
        "load_average_1min": {"min": min(loads), "max": max(loads), "median": statistics.median(loads)},
        "python_dont_write_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
        "median": summary,
        "runs": runs,
    }
    cores = report["cores"]
    print(f"\nmedians of {args.rounds} rounds, load average {min(loads):.1f}-{max(loads):.1f} on {cores} cores")
    for name, row in summary.items():
        first = row["first_stderr_line_s"]
        print(
            f"{name:45s} wall {row['wall_s']:6.1f} s  first stderr line "
            f"{'-' if first is None else f'{first:6.2f} s'}  cpu {row['cpu_s']:6.1f} s  "
            f"stderr lines {row['stderr_lines']:.0f}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
