"""A layout of rows: which row each sequence is in and the order the sampler reads the rows in, for one step shape.

``slot_order`` gives the order: rows of similar cost share a step (global batch), each step's rows are split over
the ranks by LPT, and the steps come in a seeded random order (Megatron-Bridge's own prep writes rows in
first-fit-decreasing order: similar rows adjacent, but the longest sequences all at the start of training).
Leveling (``level.level``) and its exchanges (``exchange.exchange``) are steps that take a :class:`RowSchedule` and
return one; the row costs of a layout come from ``cost.py``, computed once per layout, and its step ratios
(slowest rank / mean rank of each step) from the functions here.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from mbridge_seqpack.placement.cost import CostModel, row_costs

__all__ = ["StepShape", "RowSchedule", "slot_order", "step_ratios", "straggler_ratio", "reshuffled_ratio"]


@dataclass(frozen=True)
class StepShape:
    """The steps rows are read in: rows of ``capacity`` tokens costed by ``cost``, ``dp`` ranks reading
    ``micro_batches`` rows each per step, at most ``max_per_bin`` sequences per row (None: no cap)."""

    capacity: int
    cost: CostModel
    dp: int
    micro_batches: int = 1
    max_per_bin: int | None = None

    @property
    def rows_per_step(self) -> int:
        return self.dp * self.micro_batches


def slot_order(costs: np.ndarray, dp: int, micro_batches: int, seed: int = 0) -> np.ndarray:
    """Row order as the sampler should read it. Rows of similar cost share a step (sorted by cost, cut into
    steps of ``dp * micro_batches``), each step is split over the ranks by LPT with ``micro_batches`` rows per
    rank (position ``j * dp + r`` is rank ``r``'s ``j``-th), and the steps come in a seeded random order."""
    n = costs.size
    per_step = dp * micro_batches
    by_cost = np.argsort(-costs, kind="stable")
    steps = []
    for start in range(0, n - n % per_step, per_step):
        rows = by_cost[start : start + per_step]
        loads = [(0.0, r) for r in range(dp)]
        taken: list[list[int]] = [[] for _ in range(dp)]
        for row in rows.tolist():  # heaviest first, to the lightest rank that still takes rows
            load, r = heapq.heappop(loads)
            taken[r].append(row)
            if len(taken[r]) < micro_batches:
                heapq.heappush(loads, (load + float(costs[row]), r))
        steps.append([taken[r][j] for j in range(micro_batches) for r in range(dp)])
    rng = np.random.default_rng(seed)
    out = [row for k in rng.permutation(len(steps)) for row in steps[k]]
    # the last, partial step holds the lightest rows (the least-filled ones), as in Megatron-Bridge's own
    # first-fit-decreasing order; a drop_last sampler skips it, and keeping these outliers out of the full
    # steps is what keeps them even (a random draw here measured 1.5-2x worse ratios on the lognormal set)
    out.extend(by_cost[n - n % per_step :].tolist())
    return np.asarray(out, dtype=np.int64)


def step_ratios(costs_in_order: np.ndarray, dp: int, micro_batches: int) -> np.ndarray:
    """Each full step's slowest rank cost / mean rank cost, rows read by the ``single`` sampler (row ``k`` of a
    step to rank ``k % dp``); empty when there is no full step or one rank."""
    per_step = dp * micro_batches
    steps = costs_in_order.size // per_step
    if steps == 0 or dp == 1:
        return np.zeros(0)
    per_rank = costs_in_order[: steps * per_step].reshape(steps, micro_batches, dp).sum(axis=1)
    return per_rank.max(axis=1) / per_rank.mean(axis=1)


def straggler_ratio(costs_in_order: np.ndarray, dp: int, micro_batches: int) -> float:
    """Mean over full steps of (slowest rank's cost / mean rank cost); 1.0 is perfect balance."""
    ratios = step_ratios(costs_in_order, dp, micro_batches)
    return float(ratios.mean()) if ratios.size else 1.0


def reshuffled_ratio(costs: np.ndarray, dp: int, micro_batches: int) -> float:
    """Mean straggler ratio of the rows in 8 seeded random orders (a later epoch of a shuffling sampler)."""
    orders = (np.random.default_rng(seed).permutation(costs.size) for seed in range(8))
    return float(np.mean([straggler_ratio(costs[order], dp, micro_batches) for order in orders]))


@dataclass(frozen=True, eq=False)
class RowSchedule:
    """Rows (``bins[i]``: the row of sequence ``i``, -1 dropped) read in ``order`` (step ``k`` holds
    ``order[k * rows_per_step :]``, row ``j`` of a step goes to rank ``j % dp``; the rows after the last full step
    are the reservoir) by ``shape``'s ranks."""

    lengths: np.ndarray
    bins: np.ndarray
    num_bins: int
    shape: StepShape
    order: np.ndarray

    @classmethod
    def in_slot_order(
        cls, lengths: np.ndarray, bins: np.ndarray, num_bins: int, shape: StepShape, *, seed: int = 0
    ) -> "RowSchedule":
        """``bins`` read in ``slot_order`` of their costs."""
        costs = row_costs(lengths, bins, num_bins, shape.cost)
        layout = cls(lengths, bins, num_bins, shape, slot_order(costs, shape.dp, shape.micro_batches, seed=seed))
        layout.__dict__["costs"] = costs  # the cached_property's slot: computed once, here
        return layout

    def with_bins(self, bins: np.ndarray, order: np.ndarray | None = None) -> "RowSchedule":
        """The same shape with other rows (and ``order``, default this one's)."""
        return RowSchedule(self.lengths, bins, self.num_bins, self.shape, self.order if order is None else order)

    def regrouped(self, *, seed: int = 0) -> "RowSchedule":
        """These rows in ``slot_order`` of their costs."""
        order = slot_order(self.costs, self.shape.dp, self.shape.micro_batches, seed=seed)
        layout = RowSchedule(self.lengths, self.bins, self.num_bins, self.shape, order)
        layout.__dict__["costs"] = self.costs
        return layout

    @cached_property
    def costs(self) -> np.ndarray:
        """Cost of every row (``cost.row_costs``)."""
        return row_costs(self.lengths, self.bins, self.num_bins, self.shape.cost)

    @property
    def ratio(self) -> float:
        """The straggler ratio as read in ``order``."""
        return straggler_ratio(self.costs[self.order], self.shape.dp, self.shape.micro_batches)

    @property
    def step_ratios(self) -> np.ndarray:
        """Each full step's slowest rank / mean rank, as read in ``order``."""
        return step_ratios(self.costs[self.order], self.shape.dp, self.shape.micro_batches)

    def reshuffled_ratio(self) -> float:
        """The straggler ratio under a reshuffle (``cost.reshuffled_ratio``)."""
        return reshuffled_ratio(self.costs, self.shape.dp, self.shape.micro_batches)
