"""Benchmark: ``pack`` end to end (tokenize, pack, balance, sealed write) vs Megatron-Bridge's own
``prepare_gpt_sft_packed_data`` on the same JSONL and tokenizer, each in a process of its own (wall time, tokens/s,
peak RSS), printed with the ratios; then every pack is checked to hold exactly the sequences of Megatron-Bridge's
(tokens and loss mask, byte for byte).

Contenders: Megatron-Bridge's prep with its default workers (-1: serial) and with every core (it packs with
first-fit-decreasing and does not balance), ``pack`` with Megatron-Bridge's per-example tokenization
(``batched=False``), ``pack --no-balance`` (batched tokenization and best-fit decreasing only: the work
Megatron-Bridge's prep does) and ``pack`` as it runs by default (work balance and step leveling included). The
corpus is the embedded one repeated, 56 copies by default (100,744 records), each copy's prompts and answers made
distinct (no text repeats, so encoding each distinct text once gains nothing); ``--answers repeated`` keeps every
answer as it is in each copy (answers shared across examples, which the pack encodes once).

    uv run python scripts/bench_tokenize.py [--copies 56] [--pack-size 4096] [--answers repeated --out F]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONTENDERS = (
    "megatron_bridge_default",
    "megatron_bridge_all_cores",
    "mbridge_seqpack_per_example",
    "mbridge_seqpack_no_balance",
    "mbridge_seqpack",
)


def _corpus(path: Path, copies: int, answers: str = "distinct") -> int:
    """The embedded corpus ``copies`` times, every prompt made distinct; every answer too, or (``repeated``) each
    answer the same in every copy (answers shared across examples: the pack encodes each distinct text once)."""
    from mbridge_seqpack.recipes.kit import embedded_data_dir

    rows = [json.loads(line) for line in (embedded_data_dir() / "training.jsonl").read_text().splitlines()]
    with open(path, "w") as out:
        for copy in range(copies):
            for row in rows:
                variant = f" (variant {copy})"
                answer = row["output"] + variant if answers == "distinct" else row["output"]
                out.write(json.dumps({**row, "input": row["input"] + variant, "output": answer}) + "\n")
    return len(rows) * copies


def _sequence_digests(path: Path) -> collections.Counter:
    """The multiset of sequences (tokens and stored loss mask, as int64 / int8 bytes) a packed parquet file holds."""
    import pyarrow.parquet as pq

    table = pq.read_table(str(path), columns=["input_ids", "loss_mask", "seq_start_id"])
    flat = {name: table.column(name).combine_chunks() for name in ("input_ids", "loss_mask", "seq_start_id")}
    tokens = flat["input_ids"].values.to_numpy(zero_copy_only=False).astype(np.int64)
    mask = flat["loss_mask"].values.to_numpy(zero_copy_only=False).astype(np.int8)
    row_starts = flat["input_ids"].offsets.to_numpy()
    starts_per_row = np.diff(flat["seq_start_id"].offsets.to_numpy())
    starts = flat["seq_start_id"].values.to_numpy().astype(np.int64) + np.repeat(row_starts[:-1], starts_per_row)
    ends = np.append(starts[1:], 0)
    ends[np.cumsum(starts_per_row) - 1] = row_starts[1:]  # a row's last sequence ends with the row
    return collections.Counter(
        hashlib.sha256(tokens[s:e].tobytes() + mask[s:e].tobytes()).digest() for s, e in zip(starts, ends)
    )


def run_one(name: str, src: Path, work: Path, pack_size: int) -> dict[str, float]:
    """One contender in this process: its wall time and this process's peak RSS."""
    from mbridge_seqpack.recipes.kit import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    tokenizer = load_megatron_tokenizer(embedded_tokenizer_dir())
    cores = len(os.sched_getaffinity(0))
    start = time.perf_counter()
    tokens = 0
    if name.startswith("megatron_bridge"):
        from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
        from megatron.bridge.data.packing.offline import prepare_gpt_sft_packed_data

        prepare_gpt_sft_packed_data(
            input_path=src,
            output_path=work / "mb.idx.parquet",
            output_metadata_path=work / "mb_metadata.jsonl",
            packed_sequence_size=pack_size,
            tokenizer=tokenizer,
            max_seq_length=pack_size,
            seed=0,
            dataset_kwargs={"index_mapping_dir": str(work / "index")},
            pad_seq_to_mult=1,
            num_tokenizer_workers=-1 if name == "megatron_bridge_default" else cores,
            dataset_builder=build_gpt_sft_split,
        )
    else:
        from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl

        result = pack_jsonl(
            {"training": src},
            tokenizer=embedded_tokenizer_dir(),
            output_dir=work / "ours",
            options=PackOptions(pack_size=pack_size, balance=name != "mbridge_seqpack_no_balance"),
            batched=name != "mbridge_seqpack_per_example",
        )
        tokens = result.splits["training"]["stats"]["total_tokens"]
    seconds = time.perf_counter() - start
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, children)
    return {"seconds": seconds, "peak_rss_mib": peak / 1024, "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=56, help="copies of the embedded corpus (1,799 records each)")
    parser.add_argument("--pack-size", type=int, default=4096)
    parser.add_argument(
        "--answers",
        choices=("distinct", "repeated"),
        default="distinct",
        help="make every answer distinct too, or keep each answer the same in every copy",
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "bench_tokenize.json"))
    parser.add_argument("--one", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, Path(args.src), Path(args.work), args.pack_size)))
        return

    cores = len(os.sched_getaffinity(0))
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "train.jsonl"
        records = _corpus(src, args.copies, args.answers)
        for name in CONTENDERS:
            work = Path(tmp) / name
            work.mkdir()
            command = [sys.executable, __file__, "--one", name, "--src", str(src), "--work", str(work)]
            done = subprocess.run([*command, "--pack-size", str(args.pack_size)], capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        theirs = _sequence_digests(Path(tmp) / "megatron_bridge_all_cores" / "mb.idx.parquet")
        identical = {
            name: _sequence_digests(next((Path(tmp) / name / "ours").glob("training_*.idx.parquet"))) == theirs
            for name in CONTENDERS
            if name.startswith("mbridge_seqpack")
        }
    if not all(identical.values()):
        raise SystemExit(f"the packs hold other sequences than Megatron-Bridge's prep: {identical}")
    tokens = int(results["mbridge_seqpack"]["tokens"])
    ours = results["mbridge_seqpack_no_balance"]["seconds"]
    report = {
        "records": records,
        "answers": args.answers,
        "tokens": tokens,
        "cores": cores,
        "results": results,
        "same_sequences_as_megatron_bridge": identical,
        "tokens_per_s": {name: tokens / r["seconds"] for name, r in results.items()},
        "time_over_pack_no_balance": {name: r["seconds"] / ours for name, r in results.items()},
        "megatron_bridge_all_cores_over": {
            name: results["megatron_bridge_all_cores"]["seconds"] / r["seconds"] for name, r in results.items()
        },
    }
    for name, r in results.items():
        print(
            f"{name:30s} {r['seconds']:7.1f} s  {tokens / r['seconds']:>11,.0f} tokens/s  peak RSS "
            f"{r['peak_rss_mib']:6.0f} MiB  {r['seconds'] / ours:5.2f}x the time of pack --no-balance, "
            f"{report['megatron_bridge_all_cores_over'][name]:5.2f}x Megatron-Bridge's speed (all cores)"
        )
    print(f"{records:,} distinct records, {tokens:,} tokens, {cores} cores; every pack holds exactly the sequences")
    print("(tokens and loss mask, byte for byte) of Megatron-Bridge's prep")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
