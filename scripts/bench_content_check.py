"""What verifying every pack byte costs, at two pack sizes (default 1 GB and 10 GB; no Megatron import).

Builds a sealed synthetic pack of 8,192-token rows in row groups of 1M tokens (the size ``pack`` writes) under
``--dir`` (default: the system temporary directory), deleted afterwards. A few distinct row groups are written
with pyarrow and joined into the full-size file with ``artifact/parquet_stitch.py`` (bytes copied, one footer), then
sealed as ``pack`` seals (``seal_tiles``: one read for the file's and every tile's sha256). Then, for each size:

- ``validate()``: the rule's O(metadata) look, ``seal_problems(contents="footer")`` (size, metadata entry, the
  footer read and hashed);
- the launch's content check (``verify_tiles``, what rank 0 runs while the model is built), with the file's pages
  evicted first (``posix_fadvise(DONTNEED)``: cold) and again warm;
- the per-row-group read: Megatron-Bridge's ``ParquetFile.read_row_group`` of the three columns its dataset reads
  against :class:`VerifiedParquetFile`'s (the tile read once, hashed, parsed from memory), on sampled groups;
- the whole-file sha256 (what a launch without the stamp cache used to pay at ``validate()``).

    .venv/bin/python scripts/bench_content_check.py --sizes-gb 1 10 --json docs/bench/bench_content_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROW = 8192
ROWS_PER_GROUP = (1 << 20) // ROW  # 128 rows: 1M tokens, as write_split cuts them
COLUMNS = ["input_ids", "seq_start_id", "loss_mask"]


def _part(path: Path, seed: int, groups: int) -> None:
    """``groups`` row groups of random 8k-token rows (token ids as a 128k-vocabulary model's)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    writer = None
    for _ in range(groups):
        tokens = rng.integers(1, 128_000, ROWS_PER_GROUP * ROW, dtype=np.int64)
        offsets = np.arange(0, tokens.size + 1, ROW, dtype=np.int64)
        starts = np.concatenate([[0, int(s)] for s in rng.integers(1, ROW, ROWS_PER_GROUP)])
        table = pa.table(
            {
                "input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(tokens)),
                "loss_mask": pa.LargeListArray.from_arrays(
                    pa.array(offsets), pa.array((tokens % 7 != 0).astype(np.int8), type=pa.int8())
                ),
                "seq_start_id": pa.LargeListArray.from_arrays(
                    pa.array(np.arange(0, 2 * ROWS_PER_GROUP + 1, 2, dtype=np.int64)), pa.array(starts)
                ),
            }
        )
        writer = writer or pq.ParquetWriter(str(path), table.schema)
        writer.write_table(table, row_group_size=ROWS_PER_GROUP)
    writer.close()


def build(directory: Path, gigabytes: float) -> tuple[Path, dict]:
    """A sealed file of about ``gigabytes`` and its metadata entry."""
    from mbridge_seqpack.artifact.pack_entry import PackEntry
    from mbridge_seqpack.artifact.parquet_stitch import stitch_parquet
    from mbridge_seqpack.artifact.row_group_seal import seal_tiles
    from mbridge_seqpack.artifact.store import ENTRY_SEAL, entry_digest, write_metadata

    directory.mkdir(parents=True, exist_ok=True)
    parts = []
    for seed in range(4):
        part = directory / f"part{seed}.parquet"
        _part(part, seed, 4)
        parts.append(part)
    per_part = parts[0].stat().st_size
    copies = max(1, round(gigabytes * (1 << 30) / per_part))
    path = directory / f"training_{ROW}.idx.parquet"
    start = time.perf_counter()
    stitch_parquet([parts[i % len(parts)] for i in range(copies)], path)
    stitched = time.perf_counter() - start
    for part in parts:
        part.unlink()
    start = time.perf_counter()
    whole, tiles = seal_tiles(path)
    sealed = time.perf_counter() - start
    entry = {
        "split": "training",
        "pack_size": ROW,
        "fingerprint": {"bench": True},
        "checksums": {"file_sha256": whole, "file_bytes": path.stat().st_size, tiles.KEY: tiles.to_dict()},
    }
    write_metadata(directory / f"{ROW}_metadata.jsonl", [PackEntry.from_json(entry)])
    entry[ENTRY_SEAL] = entry_digest(entry)
    return path, {"entry": entry, "stitch_s": stitched, "seal_s": sealed, "row_groups": tiles.row_groups}


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _best(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(path: Path, built: dict, samples: int) -> dict:
    import pyarrow.parquet as pq

    from mbridge_seqpack.artifact.pack_entry import PackEntry
    from mbridge_seqpack.artifact.row_group_seal import Tiles, verify_tiles
    from mbridge_seqpack.artifact.seal import seal_problems
    from mbridge_seqpack.artifact.verified_parquet import VerifiedParquetFile
    from mbridge_seqpack.digests import file_sha256

    entry = built["entry"]
    tiles = Tiles.of_checksums(entry["checksums"])
    meta = path.parent / f"{ROW}_metadata.jsonl"
    info = {"fingerprint": entry["fingerprint"], "split": "training"}
    size = path.stat().st_size

    def validate() -> None:
        assert seal_problems(path, info, PackEntry.from_json(entry), meta, contents="footer") == []

    out = {
        "gb": size / (1 << 30),
        "row_groups": built["row_groups"],
        "footer_kb": (tiles.size - tiles.offsets[-2]) / 1024,
        "seal_s": built["seal_s"],
        "validate_ms": _best(validate) * 1e3,
    }
    _evict(path)
    start = time.perf_counter()
    verify_tiles(path, tiles)
    out["content_check_cold_s"] = time.perf_counter() - start
    out["content_check_warm_s"] = _best(lambda: verify_tiles(path, tiles), repeat=1)
    out["whole_file_sha256_warm_s"] = _best(lambda: file_sha256(path), repeat=1)
    rng = random.Random(0)
    groups = sorted(rng.sample(range(tiles.row_groups), min(samples, tiles.row_groups)))
    plain, verified = pq.ParquetFile(str(path)), VerifiedParquetFile(path, tiles)
    for reader in (plain, verified):  # warm both (the page cache holds the file now)
        reader.read_row_group(groups[0], columns=COLUMNS)
    plain_s = _best(lambda: [plain.read_row_group(g, columns=COLUMNS) for g in groups]) / len(groups)
    verified_s = _best(lambda: [verified.read_row_group(g, columns=COLUMNS) for g in groups]) / len(groups)
    group_mb = float(np.mean([(tiles.offsets[g + 1] - tiles.offsets[g]) / (1 << 20) for g in groups]))
    out.update(
        row_group_mb=group_mb,
        megatron_read_ms=plain_s * 1e3,
        verified_read_ms=verified_s * 1e3,
        added_per_read_ms=(verified_s - plain_s) * 1e3,
    )
    verified.close()
    return out


def table(report: dict) -> str:
    """The docs/packing.md table of a recorded run (``scripts/generate.py`` renders it from the JSON)."""
    group_mb = report["results"][0]["row_group_mb"]
    lines = [
        "| pack | row groups | `validate()` (rank 0: metadata, sizes, footer) | content check, rank 0, cold / warm "
        f"page cache | whole-file sha256 | Megatron-Bridge's read of a {group_mb:.1f} MB row group | "
        "the same, verified |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        footer = f"{r['footer_kb']:.0f} kB" if r["footer_kb"] < 1000 else f"{r['footer_kb'] / 1024:.1f} MB"
        added = f"+{r['added_per_read_ms']:.1f} ms" if r["added_per_read_ms"] > 0 else "within noise"
        lines.append(
            f"| {r['gb']:.0f} GB | {r['row_groups']:,} | {r['validate_ms']:.2f} ms ({footer} footer) | "
            f"{r['content_check_cold_s']:#.3g} s / {r['content_check_warm_s']:#.3g} s | "
            f"{r['whole_file_sha256_warm_s']:#.3g} s | {r['megatron_read_ms']:.1f} ms | "
            f"{r['verified_read_ms']:.1f} ms ({added}) |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-gb", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--samples", type=int, default=24, help="row groups read per size")
    parser.add_argument("--dir", default=None, help="where the packs are built (deleted after)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = []
    for gigabytes in args.sizes_gb:
        work = Path(tempfile.mkdtemp(prefix="bench_content_check_", dir=args.dir))
        try:
            path, built = build(work, gigabytes)
            results.append(measure(path, built, args.samples))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(json.dumps(results[-1]), flush=True)
    header = (
        f"{'pack':>8} {'groups':>7} {'validate()':>11} {'check cold':>11} {'check warm':>11} {'sha256 file':>12} "
        f"{'group':>8} {'MB read':>9} {'verified':>9}"
    )
    print(header)
    for r in results:
        print(
            f"{r['gb']:6.2f}GB {r['row_groups']:7d} {r['validate_ms']:8.2f} ms {r['content_check_cold_s']:9.2f} s "
            f"{r['content_check_warm_s']:9.2f} s {r['whole_file_sha256_warm_s']:10.2f} s {r['row_group_mb']:6.2f}MB "
            f"{r['megatron_read_ms']:6.1f} ms {r['verified_read_ms']:6.1f} ms"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": os.uname().machine, "cores": os.cpu_count(),
                                               "results": results}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
