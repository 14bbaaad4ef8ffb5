"""Benchmark: ``pack`` end to end (Megatron-Bridge's tokenization on every core, streamed in chunks, then the
packer, balance and sealed write) vs Megatron-Bridge's own ``prepare_gpt_sft_packed_data`` on the same JSONL and
tokenizer, one process, printed as tokens/s and the ratio.

    uv run python scripts/bench_tokenize.py [--copies 10] [--pack-size 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=10, help="copies of the embedded corpus (1,799 records each)")
    parser.add_argument("--pack-size", type=int, default=4096)
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench" / "bench_tokenize.json"))
    args = parser.parse_args()

    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.bridge.data.packing.offline import prepare_gpt_sft_packed_data

    from mbridge_seqpack.packing.pipeline import PackOptions, pack_jsonl
    from mbridge_seqpack.packing.sequences import load_megatron_tokenizer
    from mbridge_seqpack.recipes.kit import embedded_data_dir, embedded_tokenizer_dir

    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = (embedded_data_dir() / "training.jsonl").read_text()
        src = work / "train.jsonl"
        src.write_text(corpus * args.copies)
        records = corpus.count("\n") * args.copies
        tokenizer = load_megatron_tokenizer(embedded_tokenizer_dir())

        def megatron_bridge_prep(workers: int) -> float:
            start = time.perf_counter()
            prepare_gpt_sft_packed_data(
                input_path=src,
                output_path=work / f"mb_{workers}.idx.parquet",
                output_metadata_path=work / f"mb_{workers}_metadata.jsonl",
                packed_sequence_size=args.pack_size,
                tokenizer=tokenizer,
                max_seq_length=args.pack_size,
                seed=0,
                dataset_kwargs={"index_mapping_dir": str(work / f"index_{workers}")},
                pad_seq_to_mult=1,
                num_tokenizer_workers=workers,
                dataset_builder=build_gpt_sft_split,
            )
            return time.perf_counter() - start

        mb_default = megatron_bridge_prep(-1)  # its default: serial (_materialize_dataset_items, workers <= 1)
        mb_all = megatron_bridge_prep(cores)
        start = time.perf_counter()
        result = pack_jsonl(
            {"training": src},
            tokenizer=embedded_tokenizer_dir(),
            output_dir=work / "ours",
            options=PackOptions(pack_size=args.pack_size),
        )
        ours = time.perf_counter() - start
    tokens = result.splits["training"]["stats"]["total_tokens"]
    report = {
        "records": records,
        "tokens": tokens,
        "cores": cores,
        "megatron_bridge_default_s": mb_default,
        "megatron_bridge_all_cores_s": mb_all,
        "mbridge_seqpack_s": ours,
        "tokens_per_s": {
            "megatron_bridge_default": tokens / mb_default,
            "megatron_bridge_all_cores": tokens / mb_all,
            "mbridge_seqpack": tokens / ours,
        },
    }
    print(
        f"{records:,} records, {tokens:,} tokens, {cores} cores: Megatron-Bridge prep {mb_default:.1f} s "
        f"(default workers), {mb_all:.1f} s ({cores} workers); pack (tokenize + pack + balance + seal) {ours:.1f} s: "
        f"{mb_default / ours:.2f}x / {mb_all / ours:.2f}x"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
