"""Benchmark: mbridge_seqpack's PackedCollator vs Megatron-Bridge 0.6.2's packed collate_fn, one process.

Packs the embedded corpus (repeated to make long rows), builds Megatron-Bridge's own packed Parquet
dataset over it, and times both collates on the same items (fixed width, static cu_seqlens, per-sequence
alignment 8: the CUDA-graph + CP configuration).

    uv run python scripts/bench_collate.py [--pack-size 8192] [--repeat 8]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pack-size", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=8, help="copies of the corpus (more rows)")
    parser.add_argument("--micro-batches", type=int, default=3, help="timing passes over all rows")
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
        from megatron.bridge.training.tokenizers.config import TokenizerConfig
        from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

        from mbridge_seqpack.artifact.collate import PackedCollator
        from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
        from mbridge_seqpack.recipes.kit import embedded_data_dir, embedded_tokenizer_dir

        with tempfile.TemporaryDirectory() as tmp:
            corpus = Path(tmp) / "train.jsonl"
            corpus.write_text((embedded_data_dir() / "training.jsonl").read_text() * args.repeat)
            n = args.pack_size
            pack_jsonl(
                {"training": corpus},
                tokenizer=embedded_tokenizer_dir(),
                output_dir=Path(tmp) / "packed",
                options=PackOptions(pack_size=n, pad_seq_to_mult=8),
            )
            art = Path(tmp) / "packed"
            tok = build_tokenizer(
                TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(embedded_tokenizer_dir()))
            )
            dataset = build_gpt_sft_split(
                art / f"training_{n}.idx.parquet",
                tokenizer=tok,
                seq_length=n,
                memmap_workers=1,
                seed=1,
                packed_sequence_size=n,
                pack_metadata_path=art / f"{n}_metadata.jsonl",
                pad_cu_seqlens=True,
                pad_seq_to_mult=8,
                dataset_kwargs={"pad_to_max_length": True},
            )
            items = [dataset[i] for i in range(len(dataset))]
            ours = PackedCollator(
                max_seq_length=n,
                eos_id=tok.eos_id,
                pad_to_max_length=True,
                pad_seq_to_mult=8,
                pad_cu_seqlens=True,
                pack_metadata=json.loads((art / f"{n}_metadata.jsonl").read_text()),
            )

            def run(fn) -> float:
                start = time.perf_counter()
                for _ in range(args.micro_batches):
                    for item in items:
                        fn([item])
                return time.perf_counter() - start

            mb_t, our_t = run(dataset.collate_fn), run(ours)
    calls = args.micro_batches * len(items)
    print(f"collate of {len(items)} packed rows of {n} tokens (micro batch 1, {calls} calls)")
    print(f"  megatron-bridge GPTSFTPackedParquetDataset.collate_fn: {mb_t:.3f}s ({mb_t / calls * 1e3:.2f} ms/row)")
    print(f"  mbridge_seqpack PackedCollator:                        {our_t:.3f}s ({our_t / calls * 1e3:.2f} ms/row)")
    print(f"  speedup: {mb_t / our_t:.1f}x")


if __name__ == "__main__":
    main()
