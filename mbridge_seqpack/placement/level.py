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
2. **Exchanges** (``exchange.ExchangePass``): the slowest rank of a step hands a sequence to its fastest (so
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

from mbridge_seqpack.placement.balance import StepShape, row_costs, slot_order, step_ratios, straggler_ratio
from mbridge_seqpack.placement.exchange import TOLERANCE, ExchangePass

__all__ = ["level_steps", "refill"]

#: rows keep their sequences of at least this fraction of the capacity; shorter ones are dealt again
FILLER_FRACTION = 1 / 16
#: exchange passes (exchange, then regroup by cost)
ROUNDS = 3


def level_steps(
    lengths: np.ndarray, bins: np.ndarray, num_bins: int, shape: StepShape, *, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Rows leveled for even steps and the order the sampler should read them in: ``(bins, order)``.

    A leveled pack is kept only if it lowers the straggler ratio of that order by at least as much as it
    raises the ratio under a reshuffle (a later epoch of the ``batch`` sampler, or ``cyclic``): moving tokens
    between rows can spread row costs, which a fresh random order of the rows feels. Otherwise ``bins`` is
    returned as it came, in ``slot_order``."""
    cost, dp, micro_batches = shape.cost, shape.dp, shape.micro_batches

    def costed(candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row costs and the slot order they give."""
        costs = row_costs(lengths, candidate, num_bins, cost)
        return costs, slot_order(costs, dp, micro_batches, seed=seed)

    def ratio(costs: np.ndarray, order: np.ndarray) -> float:
        return straggler_ratio(costs[order], dp, micro_batches)

    costs, order = costed(bins)
    if dp == 1 or num_bins < dp * micro_batches:
        return bins, order
    if not (step_ratios(costs[order], dp, micro_batches) > 1 + TOLERANCE).any():
        return bins, order  # every step within 0.1% of even already (exchange.TOLERANCE)
    before, reshuffled = ratio(costs, order), _reshuffled(costs, dp, micro_batches)
    kept: tuple[float, np.ndarray, np.ndarray] | None = None  # (gain, bins, order) of the best start so far
    for leveled in _starts(lengths, bins, num_bins, shape, order):
        leveled_order = costed(leveled)[1]
        for _ in range(ROUNDS):  # exchanges, then regroup by cost where that is better
            exchange = ExchangePass(lengths, leveled, num_bins, shape, leveled_order)
            if exchange.run() == 0:
                break
            leveled = exchange.bins
            costs, regrouped = costed(leveled)
            if ratio(costs, regrouped) <= ratio(costs, leveled_order):
                leveled_order = regrouped
        costs = row_costs(lengths, leveled, num_bins, cost)
        gain = before - ratio(costs, leveled_order)
        if (
            gain > 0
            and gain >= _reshuffled(costs, dp, micro_batches) - reshuffled
            and (kept is None or gain > kept[0])
        ):
            kept = (gain, leveled, leveled_order)
            if not (step_ratios(costs[leveled_order], dp, micro_batches) > 1 + TOLERANCE).any():
                break  # every step within the tolerance: no need of another start
    return (kept[1], kept[2]) if kept is not None else (bins, order)


def _starts(
    lengths: np.ndarray, bins: np.ndarray, num_bins: int, shape: StepShape, order: np.ndarray
) -> Iterator[np.ndarray]:
    """The packs the exchanges start from: the rows as they came, then (micro batch 1, no sequence cap) refilled,
    which gives the exchanges room where the rows are full but costs more moves."""
    yield bins
    if shape.micro_batches == 1 and shape.max_per_bin is None:
        refilled = refill(lengths, bins, num_bins, shape, order)
        if refilled is not None:
            yield refilled


def _reshuffled(costs: np.ndarray, dp: int, micro_batches: int) -> float:
    """Mean straggler ratio of the rows in 8 seeded random orders."""
    orders = (np.random.default_rng(seed).permutation(costs.size) for seed in range(8))
    return float(np.mean([straggler_ratio(costs[order], dp, micro_batches) for order in orders]))


def refill(
    lengths: np.ndarray, bins: np.ndarray, num_bins: int, shape: StepShape, order: np.ndarray
) -> np.ndarray | None:
    """Short sequences dealt again (best fit decreasing, the packer's kernel) into token targets that bring
    every row of a step (``dp`` rows of ``order``, micro batch 1) down to the step's cheapest row; the rows
    after the last full step fill to the capacity. None when that leaves a sequence without a row or a row
    empty."""
    from mbridge_seqpack.placement.packer import place

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
