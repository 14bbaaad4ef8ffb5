"""Benchmark: the peak memory of ``pack`` does not grow with the largest record, and grows with the record count only
by the per-sequence arrays of the placement (lengths, bins, the balanced order: tens of bytes a sequence; the tokens
themselves are spilled to disk and memory-mapped).

Three runs of ``mbridge-seqpack pack`` (each a process of its own, ``--workers 1`` so the tokenization is in it; its
peak resident set read by ``wait4``): a corpus of ``--records`` prompt/answer records, one of ``--more-records``,
and the first with one line of ``--line-mb`` megabytes added, under a record limit of ``--limit-mb``
(``MBRIDGE_SEQPACK_MAX_RECORD_MB``): that line is refused by its number (exit 2) before it is read whole, so the
run's peak is that of a small process, whatever the line's size. Small sizes by default (a few minutes on a laptop,
most of it Megatron-Bridge's import); the sizes of #52: ``--more-records 10000000 --line-mb 1024``.

    uv run python scripts/bench_pack_memory.py [--records 2000] [--more-records 20000] [--line-mb 8] [--limit-mb 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the a packing sequence token rows model train loss mask attention long context data".split()


def corpus(path: Path, records: int, line_mb: float = 0.0) -> Path:
    """``records`` short prompt/answer records (written a block at a time), and a record of ``line_mb`` megabytes
    after the first when asked."""
    with open(path, "w") as out:
        block = []
        for i in range(records):
            words = [WORDS[(i * 7 + k) % len(WORDS)] for k in range(3 + i % 20)]
            block.append(json.dumps({"input": " ".join(words), "output": f"{i}"}) + "\n")
            if i == 0 and line_mb:
                out.writelines(block)
                block = []
                out.write('{"input": "')
                for _ in range(int(line_mb)):
                    out.write("x" * (1 << 20))
                out.write('", "output": "y"}\n')
            if len(block) == 10_000:
                out.writelines(block)
                block = []
        out.writelines(block)
    return path


def peak_of_pack(data: Path, output: Path, limit_mb: float) -> tuple[int, float, str]:
    """(exit status, peak resident megabytes, last line of stderr) of one ``pack`` in a process of its own."""
    argv = [sys.executable, "-m", "mbridge_seqpack", "pack", str(data), "--pack-size", "2048", "--workers", "1"]
    env = {**os.environ, "MBRIDGE_SEQPACK_MAX_RECORD_MB": str(limit_mb), "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([*argv, "--output", str(output)], stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024, " ".join(lines[-3:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--more-records", type=int, default=20_000)
    parser.add_argument("--line-mb", type=float, default=8.0)
    parser.add_argument("--limit-mb", type=float, default=4.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_pack_memory_") as work:
        tmp = Path(work)
        peaks = {}
        for name, records, line in (
            ("records", args.records, 0.0),
            ("more records", args.more_records, 0.0),
            ("one long line", args.records, args.line_mb),
        ):
            data = corpus(tmp / f"{name.replace(' ', '_')}.jsonl", records, line)
            begin = time.perf_counter()
            code, peak, said = peak_of_pack(data, tmp / f"out_{len(peaks)}", args.limit_mb)
            peaks[name] = peak
            note = f"exit {code}" + (f": {said}" if code else "")
            print(
                f"{name}: {records:,} records{f' + a {line:,.0f} MB line' if line else ''}, peak RSS {peak:,.0f} MB "
                f"in {time.perf_counter() - begin:.0f} s ({note})",
                flush=True,
            )
            expected = 2 if line > args.limit_mb else 0
            if code != expected:
                raise SystemExit(f"expected exit {expected}, got {code}")
    growth = peaks["more records"] - peaks["records"]
    print(
        f"pack peak memory: {peaks['records']:,.0f} MB at {args.records:,} records, {peaks['more records']:,.0f} MB "
        f"at {args.more_records:,} ({growth:+,.0f} MB), {peaks['one long line']:,.0f} MB with a "
        f"{args.line_mb:,.0f} MB line (refused by its line number)"
    )


if __name__ == "__main__":
    main()
