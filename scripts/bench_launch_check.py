"""What rank 0 pays at every launch to check a pack's contents, at two pack sizes 10x apart (no Megatron import).

Writes sealed synthetic packs (as ``pack`` does), then times the check ``validate()`` runs on rank 0
(``seal_problems(contents="footer")``: size, metadata entry, the Parquet footer read and hashed; no stamp is
trusted) against a full read and hash of the same file (what ``inspect``/``verify`` do, and what the launch's
content check does in the background: ``scripts/bench_content_check.py``). The page cache is warm for both, which
favours the full hash; on a cold parallel file system it is slower still.

    .venv/bin/python scripts/bench_launch_check.py --rows 40
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_verify import write_pack  # noqa: E402

from mbridge_seqpack.artifact.pack_entry import PackEntry  # noqa: E402
from mbridge_seqpack.artifact.seal import seal_problems  # noqa: E402
from mbridge_seqpack.digests import file_sha256  # noqa: E402


def _timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(directory: Path, width: int, rows: int) -> dict[str, float]:
    write_pack(directory, width, rows)
    meta = directory / f"{width}_metadata.jsonl"
    (entry,) = json.loads(meta.read_text())
    path = directory / f"training_{width}.idx.parquet"
    info = {"fingerprint": entry["fingerprint"], "split": "training"}

    def launch() -> None:
        assert seal_problems(path, info, PackEntry.from_json(entry), meta, contents="footer") == []

    return {
        "mb": path.stat().st_size / 2**20,
        "launch_s": _timed(launch),
        "full_s": _timed(lambda: file_sha256(path), repeat=1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=131072)
    parser.add_argument("--rows", type=int, default=40, help="rows of the smaller pack (the larger has 10x)")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for rows in (args.rows, args.rows * 10):
            results.append(measure(Path(tmp) / f"pack{rows}", args.width, rows))
    print(f"{'pack':>10} {'launch check':>14} {'full sha256':>12} {'ratio':>8}")
    for r in results:
        ratio = r["full_s"] / r["launch_s"]
        print(f"{r['mb']:8.0f} MB {r['launch_s'] * 1e3:11.2f} ms {r['full_s']:10.2f} s {ratio:7.0f}x")
    growth = results[1]["launch_s"] / results[0]["launch_s"]
    full_growth = results[1]["full_s"] / results[0]["full_s"]
    print(f"launch check at 10x the size: {growth:.2f}x the time (full hash: {full_growth:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
