"""Offline packing: the bin packer, tokenization of JSONL SFT data and self-describing artifacts.

Nothing here imports Megatron-Bridge.
"""

from mbridge_seqpack.packing.packer import PackingStats, pack_lengths, packing_stats

__all__ = ["pack_lengths", "packing_stats", "PackingStats"]
