"""Sequence lengths and Megatron-Bridge's own packed rows of them (shared by the balance and level tests)."""

from __future__ import annotations

import numpy as np

from mbridge_seqpack.placement.cost import DEFAULT_COST


def embedded_lengths() -> np.ndarray:
    """One length per embedded training record."""
    import json

    from mbridge_seqpack.recipes.building_blocks import embedded_data_dir

    # runtime lengths of the embedded corpus as the prep tokenizes it are pinned in the pack tests; here the
    # character counts / 4 stand in (the balance only needs a realistic spread)
    records = [json.loads(line) for line in (embedded_data_dir() / "training.jsonl").read_text().splitlines()]
    return np.asarray([max(1, (len(r["input"]) + len(r["output"])) // 4) for r in records], dtype=np.int64)


def megatron_bridge_rows(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Row costs in the order Megatron-Bridge's prep writes its rows (its first_fit_decreasing bins)."""
    from megatron.bridge.data.packing.algorithms import first_fit_decreasing

    rows = first_fit_decreasing(lengths.tolist(), capacity)
    return np.asarray([DEFAULT_COST.linear * sum(r) + DEFAULT_COST.attention * sum(x * x for x in r) for r in rows])
