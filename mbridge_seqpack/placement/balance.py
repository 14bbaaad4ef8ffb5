"""Equal-cost rows: the sequences re-dealt into as many rows as best-fit decreasing used, each row as costly as
the others (the row-cost model is ``cost.py``'s).

``balance_bins`` deals the long sequences (those that carry the attention cost) longest first to the cheapest row
that still has room (cost-LPT with the token capacity; an optional cap on sequences per row) and lets the short
ones fill the gaps best fit (the packer's kernel). Equal-cost rows stay balanced under any order, so this holds
under Megatron-Bridge's shuffling samplers (``cyclic``; ``batch`` with its per-epoch shuffle; ``max_train_samples``
epoch shuffles). What orders the rows into steps (``layout.slot_order``), levels the steps (``level``,
``exchange``) and writes each row where the sampler reads it (``sampler.file_layout``) comes after, in
``rows.place_rows``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from mbridge_seqpack.placement.cost import CostModel
from mbridge_seqpack.placement.packer import place

__all__ = ["BalanceResult", "balance_bins"]


@dataclass(frozen=True)
class BalanceResult:
    """The balanced assignment (or the input one, when balancing would need more rows than allowed)."""

    bins: np.ndarray
    num_bins: int
    balanced: bool
    extra_bins: int  # rows added by the per-row sequence cap (0 without a cap)


def _deal_by_cost(
    lengths: np.ndarray, order: np.ndarray, num_bins: int, capacity: int, cost: CostModel, limit: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Cost-LPT: ``order`` (longest first) each to the cheapest of ``num_bins`` rows with room; None if one
    does not fit. Returns (row of each dealt sequence, free tokens per row, sequences per row)."""
    room = [capacity] * num_bins
    count = [0] * num_bins
    heap = [(0.0, b) for b in range(num_bins)]  # (cost so far, row)
    rows = np.empty(order.size, dtype=np.int64)
    linear, attention = cost.linear, cost.attention
    dealt = lengths[order].tolist()
    shortest = dealt[-1] if dealt else 0
    for k, length in enumerate(dealt):
        skipped = []
        while heap and (room[heap[0][1]] < length or count[heap[0][1]] >= limit):
            entry = heapq.heappop(heap)
            if room[entry[1]] >= shortest and count[entry[1]] < limit:
                skipped.append(entry)  # no room for this length, maybe for a shorter one
        if not heap or len(skipped) > MAX_SKIPPED:
            return None  # the rows are (nearly) full: this threshold will not fit, give up early
        load, b = heapq.heappop(heap)
        room[b] -= length
        count[b] += 1
        rows[k] = b
        heapq.heappush(heap, (load + linear * length + attention * length * length, b))
        for entry in skipped:
            heapq.heappush(heap, entry)
    return rows, np.asarray(room, dtype=np.int64), np.asarray(count, dtype=np.int64)


#: a dealing that skips this many full rows for one sequence is abandoned (keeps a failing attempt cheap)
MAX_SKIPPED = 256

#: sequences at least this fraction of the row are dealt by cost (0: all of them, which also evens out the
#: token fill); shorter ones fill the gaps best-fit
THRESHOLDS = (0.0, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)


def balance_bins(
    lengths: np.ndarray,
    bins: np.ndarray,
    capacity: int,
    cost: CostModel,
    *,
    seed: int = 0,
    max_per_bin: int | None = None,
) -> BalanceResult:
    """Equal-cost rows in as many rows as ``bins`` uses (the best-fit-decreasing count).

    The long sequences (those that carry the attention cost) are dealt longest first to the cheapest row
    with room; the rest fill the remaining space best-fit decreasing (the packer's own kernel, into the open
    rows). The smallest threshold for "long" that needs no extra row wins; if none does, ``bins`` is kept.
    With ``max_per_bin`` (static cu_seqlens capacity) no row holds more sequences; that may add rows,
    reported as ``extra_bins``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    placed = np.flatnonzero(bins >= 0)
    num_bins = int(bins.max()) + 1 if placed.size else 0
    if num_bins == 0:
        return BalanceResult(bins, 0, False, 0)
    seeded = placed[np.random.default_rng(seed).permutation(placed.size)]
    seeded = seeded[np.argsort(-lengths[seeded], kind="stable")]  # longest first, seeded ties
    if max_per_bin is not None:
        return _balance_with_cap(lengths, bins, seeded, num_bins, capacity, cost, max_per_bin)
    for fraction in THRESHOLDS:
        long_count = int(np.count_nonzero(lengths[seeded] >= fraction * capacity))
        dealt = _deal_by_cost(lengths, seeded[:long_count], num_bins, capacity, cost, placed.size + 1)
        if dealt is None:
            continue
        rows, room, _ = dealt
        out = np.full_like(bins, -1)
        out[seeded[:long_count]] = rows
        if place(lengths, seeded[long_count:], capacity, out, room) == num_bins:
            return BalanceResult(out, num_bins, True, 0)
    return BalanceResult(bins, num_bins, False, 0)


def _balance_with_cap(
    lengths: np.ndarray, bins: np.ndarray, seeded: np.ndarray, num_bins: int, capacity: int, cost: CostModel, cap: int
) -> BalanceResult:
    """At most ``cap`` sequences per row: deal everything by cost into the fewest rows that work, from
    max(best-fit rows, ceil(n / cap)); a cap-aware best fit if a few more rows do not help."""
    least = max(num_bins, -(-seeded.size // cap))
    for rows_count in range(least, least + 4):
        dealt = _deal_by_cost(lengths, seeded, rows_count, capacity, cost, cap)
        if dealt is not None:
            out = np.full_like(bins, -1)
            out[seeded] = dealt[0]
            used = int(out.max()) + 1
            return BalanceResult(out, used, True, used - num_bins)
    out = np.full_like(bins, -1)
    total = _fill_with_cap(
        lengths, seeded, capacity, out, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), cap
    )
    return BalanceResult(out, total, False, total - num_bins)


def _fill_with_cap(
    lengths: np.ndarray,
    seeded: np.ndarray,
    capacity: int,
    out: np.ndarray,
    room: np.ndarray,
    count: np.ndarray,
    cap: int,
) -> int:
    """Best fit (smallest room that holds it) among rows with fewer than ``cap`` sequences; new rows as needed."""
    import bisect

    free = sorted((int(r), b) for b, r in enumerate(room.tolist()) if count[b] < cap and r > 0)
    counts = count.tolist()
    total = len(counts)
    for idx, length in zip(seeded.tolist(), lengths[seeded].tolist()):
        at = bisect.bisect_left(free, (length, -1))
        if at < len(free):
            r, b = free.pop(at)
        else:
            r, b = capacity, total
            total += 1
            counts.append(0)
        out[idx] = b
        counts[b] += 1
        if counts[b] < cap and r - length > 0:
            bisect.insort(free, (r - length, b))
    return total
