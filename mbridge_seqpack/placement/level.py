"""Step leveling: move tokens between rows so that the ranks of each step finish together.

``slot_order`` puts rows of similar cost in one step, and for fixed row costs that grouping is already the
best. What is left comes from the rows themselves. With micro batch 1 (global batch = DP, as in
Megatron-Bridge's H100 SFT recipes at DP 8), a step whose rows hold sequences of 7,959 and 7,855 tokens, each
filled to the capacity, has one rank ~0.3% slower than the others, and the step that holds the one
under-filled row of a pack waits for its seven full rows. Evening such steps out needs spare tokens where the
attention is heaviest, and a full pack has its spare tokens in a few rows only. Two stages, each kept only if
it lowers the straggler ratio:

1. **Refill** (micro batch 1; tried when exchanges on the rows as they came leave a step beyond the tolerance):
   every row keeps its sequences of at least 1/16 of the capacity; the shorter ones are dealt again, best fit
   decreasing, into per-row token targets that bring each row of a step down to the step's cheapest. What does
   not fit goes to the rows of the trailing partial step, a reservoir that a ``drop_last`` sampler skips and
   the ratio does not count.
2. **Exchanges** (``exchange.exchange``): the slowest rank of a step hands a sequence to its fastest (so
   the deficit of an under-filled row is spread inside its step in a few dozen moves); where that is done,
   it trades a piece for shorter ones with a row that has room, or the fastest takes a longer one, each trade
   kept only when the summed step ratios drop; then the rows are regrouped by cost and the pass runs again.

Rows stay within the capacity (and the per-row sequence cap), none empties, and their number never changes,
so leveling costs no extra bins. Only steps more than 0.1% from even are worked on (``exchange.TOLERANCE``):
below that the gain is lost in a GPU step's own jitter, and its search took seconds. The leveled pack is kept
only where its gain in the designed order is at least its loss under a reshuffle (later epochs of the ``batch``
sampler), which spread row costs can cause.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from mbridge_seqpack.placement.cost import row_costs
from mbridge_seqpack.placement.exchange import TOLERANCE, exchange
from mbridge_seqpack.placement.layout import RowSchedule, StepShape
from mbridge_seqpack.placement.packer import place

__all__ = ["level", "level_steps", "refill"]

#: rows keep their sequences of at least this fraction of the capacity; shorter ones are dealt again
FILLER_FRACTION = 1 / 16
#: exchange passes (exchange, then regroup by cost)
ROUNDS = 3


def level(layout: RowSchedule, *, seed: int = 0) -> RowSchedule:
    """``layout`` (rows in their slot order) leveled for even steps: the rows and the order the sampler should
    read them in.

    A leveled layout is kept only if it lowers the straggler ratio of its order by at least as much as it
    raises the ratio under a reshuffle (a later epoch of the ``batch`` sampler, or ``cyclic``): moving tokens
    between rows can spread row costs, which a fresh random order of the rows feels. Otherwise ``layout`` is
    returned as it came."""
    shape = layout.shape
    if shape.dp == 1 or layout.num_bins < shape.rows_per_step:
        return layout
    if not (layout.step_ratios > 1 + TOLERANCE).any():
        return layout  # every step within 0.1% of even already (exchange.TOLERANCE)
    before, reshuffled = layout.ratio, layout.reshuffled_ratio()
    kept: tuple[float, RowSchedule] | None = None  # (gain, layout) of the best start so far
    for start in _starts(layout):
        leveled = start.regrouped(seed=seed)
        for _ in range(ROUNDS):  # exchanges, then regroup by cost where that is better
            exchanged = exchange(leveled)
            if exchanged is leveled:
                break
            regrouped = exchanged.regrouped(seed=seed)
            leveled = regrouped if regrouped.ratio <= exchanged.ratio else exchanged
        gain = before - leveled.ratio
        if gain > 0 and gain >= leveled.reshuffled_ratio() - reshuffled and (kept is None or gain > kept[0]):
            kept = (gain, leveled)
            if not (leveled.step_ratios > 1 + TOLERANCE).any():
                break  # every step within the tolerance: no need of another start
    return kept[1] if kept is not None else layout


def level_steps(
    lengths: np.ndarray, bins: np.ndarray, num_bins: int, shape: StepShape, *, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`level` of ``bins`` in their slot order, as ``(bins, order)``."""
    leveled = level(RowSchedule.in_slot_order(lengths, bins, num_bins, shape, seed=seed), seed=seed)
    return leveled.bins, leveled.order


def _starts(layout: RowSchedule) -> Iterator[RowSchedule]:
    """The layouts the exchanges start from: the rows as they came, then (micro batch 1, no sequence cap) refilled,
    which gives the exchanges room where the rows are full but costs more moves."""
    yield layout
    shape = layout.shape
    if shape.micro_batches == 1 and shape.max_per_bin is None:
        refilled = refill(layout.lengths, layout.bins, layout.num_bins, shape, layout.order)
        if refilled is not None:
            yield layout.with_bins(refilled)


def refill(
    lengths: np.ndarray, bins: np.ndarray, num_bins: int, shape: StepShape, order: np.ndarray
) -> np.ndarray | None:
    """Short sequences dealt again (best fit decreasing, the packer's kernel) into token targets that bring
    every row of a step (``dp`` rows of ``order``, micro batch 1) down to the step's cheapest row; the rows
    after the last full step fill to the capacity. None when that leaves a sequence without a row or a row
    empty."""
    capacity, cost, dp = shape.capacity, shape.cost, shape.dp
    steps = order.size // dp
    costs = row_costs(lengths, bins, num_bins, cost)
    tokens = np.bincount(bins[bins >= 0], weights=lengths[bins >= 0], minlength=num_bins).astype(np.int64)
    target = np.full(num_bins, capacity, dtype=np.int64)  # the reservoir rows fill up
    grid = order[: steps * dp].reshape(steps, dp)
    step_costs = costs[grid]
    shave = np.floor((step_costs - step_costs.min(axis=1, keepdims=True)) / cost.linear).astype(np.int64)
    target[grid] = tokens[grid] - shave
    filler = (bins >= 0) & (lengths < FILLER_FRACTION * capacity)
    kept = np.bincount(bins[(bins >= 0) & ~filler], weights=lengths[(bins >= 0) & ~filler], minlength=num_bins)
    space = np.maximum(target - kept.astype(np.int64), 0)
    pool = np.flatnonzero(filler)
    pool = pool[np.argsort(-lengths[pool], kind="stable")]
    out = np.where(filler, -1, bins)
    if place(lengths, pool, capacity, out, space) > num_bins:  # some did not meet a target: any room left
        spilled = pool[out[pool] >= num_bins]
        out[spilled] = -1
        placed = out >= 0
        used = np.bincount(out[placed], weights=lengths[placed], minlength=num_bins).astype(np.int64)
        if place(lengths, spilled, capacity, out, capacity - used) > num_bins:
            return None
    if np.bincount(out[out >= 0], minlength=num_bins).min() == 0:
        return None
    return out
