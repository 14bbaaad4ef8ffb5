"""Benchmark: mbridge_seqpack's packer vs Megatron-Bridge 0.6.2's, in one process, same inputs.

1. Bin packing only: ``pack_lengths`` vs ``first_fit_decreasing`` on 100k and 1M lognormal lengths
   (capacity 8192), with bin counts and the lower bound ceil(sum / capacity).
2. Packing plus row building: ``pack_lengths`` + ``build_rows`` (Arrow columns) vs
   ``create_packing_strategy`` + ``fill_packing_strategy`` on 100k tokenized sequences.

    uv run python scripts/bench_packer.py [--sizes 100000,1000000] [--fill-size 100000]
"""

from __future__ import annotations

import argparse
import os
import collections
import time
import warnings

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")  # Megatron-Bridge's fill_packing_strategy progress bars


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--fill-size", type=int, default=100000)
    parser.add_argument("--capacity", type=int, default=8192)
    args = parser.parse_args()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.bridge.data.packing.algorithms import (
            create_packing_strategy,
            fill_packing_strategy,
            first_fit_decreasing,
        )
    from mbridge_seqpack.packing import pack_lengths, packing_stats
    from mbridge_seqpack.packing.artifact import build_rows
    from mbridge_seqpack.packing.sequences import TokenizedSequences

    cap = args.capacity
    rng = np.random.default_rng(0)
    print(f"1) bin packing, lengths lognormal(6, 1) clipped to [8, {cap}], capacity {cap}")
    print(f"   {'n':>9}  {'megatron-bridge FFD':>20}  {'mbridge_seqpack':>16}  {'speedup':>8}  "
          f"{'bins MB':>8}  {'bins ours':>9}  {'lower bound':>11}")
    for n in [int(x) for x in args.sizes.split(",")]:
        lengths = np.clip(rng.lognormal(6, 1, n).astype(np.int64), 8, cap)
        as_list = lengths.tolist()
        mb_bins, mb_t = timed(first_fit_decreasing, as_list, cap)
        ours, our_t = timed(pack_lengths, lengths, cap, seed=0)
        stats = packing_stats(lengths, ours, cap)
        print(f"   {n:>9,}  {mb_t:>19.3f}s  {our_t:>15.3f}s  {mb_t / our_t:>7.1f}x  {len(mb_bins):>8,}  "
              f"{stats.num_bins:>9,}  {stats.lower_bound:>11,}")

    n = args.fill_size
    fill_cap = 2048
    lengths = np.clip(rng.lognormal(5, 1, n).astype(np.int64), 8, fill_cap)  # runtime lengths
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths + 1, out=offsets[1:])
    tokens = rng.integers(3, 30000, int(offsets[-1])).astype(np.int32)
    mask = np.ones(tokens.size, dtype=np.int8)
    print(f"\n2) packing + row building, {n:,} sequences, lengths lognormal(5, 1) clipped to [8, {fill_cap}], "
          f"capacity {fill_cap}")
    seqs = TokenizedSequences(tokens, mask, offsets)

    def ours_end_to_end():
        bins = pack_lengths(seqs.lengths, fill_cap, seed=0)
        return build_rows(seqs, bins)

    def mb_end_to_end():
        dataset = [{"input_ids": tokens[offsets[i]:offsets[i + 1]].tolist(),
                    "loss_mask": [True] * int(offsets[i + 1] - offsets[i])} for i in range(n)]
        histogram = np.bincount(lengths, minlength=fill_cap + 1).tolist()
        sequences: dict[int, list] = collections.defaultdict(list)  # create_hist's structure
        for item in dataset:
            sequences[len(item["input_ids"]) - 1].append(item)
        start = time.perf_counter()
        assignments, _ = create_packing_strategy(histogram, fill_cap, "first_fit_decreasing")
        fill_packing_strategy(assignments, sequences, fill_cap, 0)
        return time.perf_counter() - start

    mb_t = mb_end_to_end()  # times only create + fill, not building its input dicts
    _, our_t = timed(ours_end_to_end)
    print(f"   megatron-bridge create_packing_strategy + fill_packing_strategy: {mb_t:.3f}s")
    print(f"   mbridge_seqpack pack_lengths + build_rows:                        {our_t:.3f}s")
    print(f"   speedup: {mb_t / our_t:.1f}x")


if __name__ == "__main__":
    main()
