"""Peak memory and time of ``mbridge-seqpack verify`` on long rows (no Megatron import).

Writes a sealed synthetic pack whose rows are ``--width`` tokens wide (one row is a single sequence filling
the whole row, the others hold sequences of mixed lengths), then runs ``verify`` on it in a fresh process
and prints the wall time and the peak resident memory of that process.

    .venv/bin/python scripts/bench_verify.py --width 131072 --rows 4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def write_pack(directory: Path, width: int, rows: int, seed: int = 0) -> Path:
    from mbridge_seqpack.artifact.pack_entry import PackEntry, split_entry
    from mbridge_seqpack.artifact.store import (
        Fingerprint,
        metadata_path,
        split_paths,
        staged_directory,
        write_metadata,
        write_split,
    )
    from mbridge_seqpack.placement.cost import DEFAULT_COST
    from mbridge_seqpack.placement.layout import StepShape
    from mbridge_seqpack.placement.rows import RowRequest, place_rows
    from mbridge_seqpack.tokenization.sequences import TokenizedSequences

    rng = np.random.default_rng(seed)
    lengths = [width]  # one sequence filling a whole row (runtime length width - 1 + 1 stored token)
    while sum(lengths) < width * rows:
        lengths.append(int(rng.integers(64, width // 4)))
    lengths = np.asarray(lengths, dtype=np.int64)
    lengths[0] = width + 1  # stored tokens = runtime width + 1 (labels are shifted)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(1, 32000, offsets[-1], dtype=np.int64)
    tokens[offsets[1:] - 1] = 0  # EOS closes every sequence
    mask = np.ones(offsets[-1], dtype=np.int8)
    mask[offsets[1:] - 1] = 0
    seqs = TokenizedSequences(tokens, mask, offsets)
    placed = place_rows(
        seqs.lengths,
        RowRequest(StepShape(width, DEFAULT_COST, 1), width, overflow="drop"),
        balance=False,
        source="bench",
    )
    fp = Fingerprint(
        input_sha256="0" * 64,
        tokenizer="synthetic",
        tokenizer_sha256="0" * 64,
        eos_id=0,
        vocab_size=32000,
        dataset_kwargs="{}",
        max_seq_length=width,
        pack_size=width,
        pad_seq_to_mult=1,
        algorithm="best_fit_decreasing",
        seed=seed,
        plugin_version="bench",
        megatron_bridge_version="none",
    )
    with staged_directory(directory, overwrite=True) as staging:
        entry = split_entry("training", seqs, placed, fp.to_dict(), "drop")
        checksums = write_split(split_paths(staging, width)["training"], seqs, placed.bins, dict(entry))
        write_metadata(metadata_path(staging, width), [PackEntry.from_json({**entry, "checksums": checksums})])
    return directory


CHILD = """
import json, resource, sys, time
t = time.perf_counter()
from mbridge_seqpack.thd.verify import verify_artifact
report = verify_artifact(sys.argv[1], max_rows=int(sys.argv[2]))
print(json.dumps({"ok": report.ok, "rows": report.rows_checked, "seconds": time.perf_counter() - t,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "failures": report.failures[:3]}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=131072)
    parser.add_argument("--rows", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        pack = write_pack(Path(tmp) / "pack", args.width, args.rows)
        built = time.perf_counter() - t
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(pack), str(args.rows)], capture_output=True, text=True, check=False
        )
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        result = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"verify, rows {args.width:,} tokens wide: {result['rows']} row(s) in {result['seconds']:.1f} s, "
        f"peak RSS {result['peak_rss_mb']:.0f} MB, ok={result['ok']} (pack written in {built:.1f} s)"
    )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
