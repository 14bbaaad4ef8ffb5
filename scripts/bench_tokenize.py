"""Benchmark: ``pack`` end to end (tokenize, pack, balance, sealed write) vs Megatron-Bridge's own
``prepare_gpt_sft_packed_data`` on the same JSONL and tokenizer, each in a process of its own (wall time, tokens/s,
peak RSS), printed with the ratios.

Contenders: Megatron-Bridge's prep with its default workers (-1: serial) and with every core (it packs with
first-fit-decreasing and does not balance), ``pack`` with Megatron-Bridge's per-example tokenization
(``batched=False``), ``pack --no-balance`` (batched tokenization and best-fit decreasing only: the work
Megatron-Bridge's prep does) and ``pack`` as it runs by default (work balance and step leveling included). The
corpus is the embedded one repeated, each copy's prompts made distinct (no text repeats, so encoding each distinct
text once gains nothing from the repetition).

    uv run python scripts/bench_tokenize.py [--copies 10] [--pack-size 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def _corpus(path: Path, copies: int) -> int:
    from mbridge_seqpack.recipes.kit import embedded_data_dir

    rows = [json.loads(line) for line in (embedded_data_dir() / "training.jsonl").read_text().splitlines()]
    with open(path, "w") as out:
        for copy in range(copies):
            for row in rows:
                out.write(json.dumps({**row, "input": f"{row['input']} (variant {copy})"}) + "\n")
    return len(rows) * copies


def run_one(name: str, src: Path, work: Path, pack_size: int) -> dict[str, float]:
    """One contender in this process: its wall time and this process's peak RSS."""
    from mbridge_seqpack.packing.sequences import load_megatron_tokenizer
    from mbridge_seqpack.recipes.kit import embedded_tokenizer_dir

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
        from mbridge_seqpack.packing.pipeline import PackOptions, pack_jsonl

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
    parser.add_argument("--copies", type=int, default=10, help="copies of the embedded corpus (1,799 records each)")
    parser.add_argument("--pack-size", type=int, default=4096)
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
        records = _corpus(src, args.copies)
        for name in CONTENDERS:
            work = Path(tmp) / name
            work.mkdir()
            command = [sys.executable, __file__, "--one", name, "--src", str(src), "--work", str(work)]
            done = subprocess.run([*command, "--pack-size", str(args.pack_size)], capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    tokens = int(results["mbridge_seqpack"]["tokens"])
    ours = results["mbridge_seqpack_no_balance"]["seconds"]
    report = {
        "records": records,
        "tokens": tokens,
        "cores": cores,
        "results": results,
        "tokens_per_s": {name: tokens / r["seconds"] for name, r in results.items()},
        "time_over_pack_no_balance": {name: r["seconds"] / ours for name, r in results.items()},
    }
    for name, r in results.items():
        print(
            f"{name:30s} {r['seconds']:7.1f} s  {tokens / r['seconds']:>11,.0f} tokens/s  peak RSS "
            f"{r['peak_rss_mib']:6.0f} MiB  {r['seconds'] / ours:5.2f}x the time of pack --no-balance"
        )
    print(f"{records:,} distinct records, {tokens:,} tokens, {cores} cores")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
