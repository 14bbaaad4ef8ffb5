"""Placement as ``pack`` runs it: the lengths of a split in, the row of every sequence and its record out.

One way down, each step a function of what the one before returned:

1. ``packer.pack_lengths``: best-fit decreasing bins (a sequence longer than ``max_seq_length`` refused, or
   dropped where Megatron-Bridge's prep drops it);
2. ``balance.balance_bins``: the same number of rows, re-dealt to equal cost;
3. ``layout.RowSchedule.in_slot_order``: rows of similar cost share a step, split over the ranks by LPT;
4. ``level.level`` (with ``exchange.exchange``): a layout in, a leveled layout out;
5. ``sampler.file_layout``: each row written where the sampler reads it in its first epoch; the
   ``record.BalanceRecord`` of what was done, and the packing statistics of the rows (``PlacedRows``: all that
   ``pack`` writes of the placement, so it does not come back for more).

Every row cost in it comes from ``cost.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mbridge_seqpack.errors import InputError
from mbridge_seqpack.placement.balance import balance_bins
from mbridge_seqpack.placement.cost import row_costs
from mbridge_seqpack.placement.layout import RowSchedule, StepShape, straggler_ratio
from mbridge_seqpack.placement.level import level
from mbridge_seqpack.placement.packer import pack_lengths, packing_stats
from mbridge_seqpack.placement.record import BalanceRecord
from mbridge_seqpack.placement.sampler import file_layout, read_order, read_order_digest

__all__ = ["RowRequest", "PlacedRows", "place_rows"]


@dataclass(frozen=True)
class RowRequest:
    """What ``pack`` asks of placement (``PackOptions``' values): rows of ``shape.capacity`` tokens for
    ``shape``'s ranks, read by ``sampler`` seeded ``sampler_seed``."""

    shape: StepShape
    max_seq_length: int
    seed: int = 0
    overflow: str = "error"  # a sequence longer than max_seq_length: "error" or "drop"
    sampler: str = "batch"
    sampler_seed: int = 1234


@dataclass(frozen=True)
class PlacedRows:
    """The row of every sequence (file order, -1: dropped), what the metadata says of the rows (``rows``: the keys
    Megatron-Bridge's packed dataset reads and the packing statistics) and, for a balanced split, how it was
    balanced (``balance``, also as its metadata record)."""

    bins: np.ndarray
    rows: dict[str, Any]
    balance: BalanceRecord | None = None
    balance_entry: dict[str, Any] | None = None


def place_rows(lengths: np.ndarray, request: RowRequest, *, balance: bool, source: Any) -> PlacedRows:
    """Bins for every sequence of a split (``source`` names it in an error); with ``balance``, equal-cost rows
    leveled for the DP layout and renumbered to where the sampler reads them."""
    bins = _bins(lengths, request, source)
    if not (balance and bins.size):
        return PlacedRows(bins, _rows_entry(lengths, bins, request.shape.capacity))
    shape, seed = request.shape, request.seed
    before = row_costs(lengths, bins, int(bins.max()) + 1, shape.cost)
    result = balance_bins(lengths, bins, shape.capacity, shape.cost, seed=seed, max_per_bin=shape.max_per_bin)
    leveled = level(RowSchedule.in_slot_order(lengths, result.bins, result.num_bins, shape, seed=seed), seed=seed)
    layout = file_layout(leveled.order, request.sampler, request.sampler_seed)  # the sampler reads `order` (epoch 0)
    position = np.empty_like(layout)
    position[layout] = np.arange(layout.size)
    placed = leveled.bins >= 0
    out = np.where(placed, position[np.where(placed, leveled.bins, 0)], -1)
    record = _record(leveled, layout, before, result.balanced, result.extra_bins, request)
    return PlacedRows(out, _rows_entry(lengths, out, shape.capacity), record, record.to_dict())


def _rows_entry(lengths: np.ndarray, bins: np.ndarray, pack_size: int) -> dict[str, Any]:
    """The metadata of the rows, in the order a split's entry lists them."""
    stats = packing_stats(lengths, bins, pack_size)
    placed = bins >= 0
    return {
        # the keys Megatron-Bridge's GPTSFTPackedDataset reads for pad_cu_seqlens
        "dataset_max_seqlen": int(lengths[placed].max()),
        "max_samples_per_bin": stats.max_sequences_per_bin,
        "min_packed_seqlen": stats.min_bin_tokens,
        "pack_size": pack_size,
        "packing_factor": round(int(placed.sum()) / stats.num_bins, 2),
        "packing_efficiency": round(stats.efficiency * 100, 2),
        "num_rows": stats.num_bins,
        "stats": stats.to_dict(),
    }


def _bins(lengths: np.ndarray, request: RowRequest, source: Any) -> np.ndarray:
    """Bins for every sequence; one longer than ``max_seq_length`` is refused or, with ``overflow="drop"``,
    left out (bin -1) exactly where Megatron-Bridge's ``create_hist`` skips it."""
    pack_size, max_seq_length = request.shape.capacity, request.max_seq_length
    too_long = lengths > max_seq_length
    if too_long.any() and request.overflow == "error":
        raise InputError(
            f"{source}: {int(too_long.sum())} sequence(s) longer than {max_seq_length} tokens (the longest "
            f"{int(lengths.max())}; chat records are not truncated). Megatron-Bridge's prep drops them: pass "
            "--overflow drop to do the same (counted in the metadata), or raise --pack-size / --max-seq-length"
        )
    capped = np.where(too_long, pack_size + 1, lengths) if too_long.any() else lengths
    return pack_lengths(capped, pack_size, seed=request.seed, overflow="drop")


def _record(
    leveled: RowSchedule,
    layout: np.ndarray,
    before: np.ndarray,
    rebalanced: bool,
    extra_rows: int,
    request: RowRequest,
) -> BalanceRecord:
    """What the metadata records of the placement: the cost spread before and after, the straggler ratios as the
    sampler reads the rows in its first epoch and (mean) in epochs 1-4."""
    shape, sampler, sampler_seed = request.shape, request.sampler, request.sampler_seed
    dp, micro = shape.dp, shape.micro_batches
    costs = leveled.costs
    ratio = later = None
    if costs.size >= dp * micro:
        in_file = costs[layout]
        later_ratios = [
            straggler_ratio(in_file[read_order(layout.size, sampler, sampler_seed, epoch)], dp, micro)
            for epoch in range(1, 5)
        ]
        ratio = round(leveled.ratio, 6)  # as read in epoch 0
        later = round(float(np.mean(later_ratios)), 6)
    return BalanceRecord(
        data_parallel=dp,
        micro_batches=micro,
        cost_linear=shape.cost.linear,
        cost_attention=shape.cost.attention,
        row_cost_cv_before=round(float(before.std() / before.mean()), 6),
        row_cost_cv=round(float(costs.std() / costs.mean()), 6),
        sampler=sampler,
        sampler_seed=sampler_seed,
        read_order_sha256=read_order_digest(layout.size, sampler, sampler_seed),
        rows_rebalanced=rebalanced,
        max_sequences_per_row=shape.max_per_bin,
        extra_rows_for_cap=extra_rows,
        straggler_ratio=ratio,
        straggler_ratio_later_epochs=later,
    )
