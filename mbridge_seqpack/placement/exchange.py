"""Exchanges of sequences between rows that lower the summed straggler ratio of a fixed layout of steps.

The layout is the order the sampler reads the rows in: step ``k`` holds rows ``order[k * dp * micro :]``, row
``j`` of a step goes to rank ``j % dp``; the rows after the last full step are the reservoir (no ratio counts
them). Worst step first:

- **spread**: the slowest rank of the step hands one sequence to its fastest, the one nearest half their gap;
  tried first, it evens out an under-filled row inside its own step;
- **give**: a row of the slowest rank hands one or two of its sequences to a row with room (in a step of
  similar cost, or the reservoir) and takes back a shorter one, up to three short ones from the reservoir, or
  nothing;
- **take**: a row of the fastest rank with room takes a longer sequence from a row of a step of similar cost
  (or the reservoir), handing back one of its own or nothing.

A spread never slows the step's slowest rank. Every give and take candidate is scored by the exact change of
the two steps' ratios; the best is applied if it lowers their sum. Rows stay within the capacity and the
per-row sequence cap, and none empties. :func:`exchange` is the step: a :class:`~layout.RowSchedule` in, one out.
"""

from __future__ import annotations

import heapq
import itertools
from functools import lru_cache

import numpy as np

from mbridge_seqpack.placement.cost import row_costs
from mbridge_seqpack.placement.layout import RowSchedule, StepShape

__all__ = ["ExchangePass", "exchange"]

#: steps on each side (in order of cost) whose rows a step trades with
WINDOW = 32
#: a row offers combinations of up to three of this many of its shortest sequences (reservoir rows) or gives
#: pairs of them
SHORTEST = 24
#: a move must lower the summed ratios by more than this
MIN_GAIN = 1e-12
#: a step whose slowest rank is within this fraction of the mean is left as it is: 0.1% of a step is below the
#: run-to-run spread of a GPU step and far below the cost model's own error, and chasing it costs seconds per
#: thousand rows (the mean step ratio of a 100k-example pack moved from 1.000014 to 1.000009 in 7 s)
TOLERANCE = 1e-3
#: candidates scored per row and try; beyond this an even stride of them (rows of hundreds of sequences)
MAX_SCORED = 10_000


@lru_cache(maxsize=None)
def _combinations(count: int, sizes: tuple[int, ...]) -> np.ndarray:
    """Index combinations of ``sizes`` elements out of ``count``, padded with -1 to the largest size."""
    width = max(sizes)
    rows = [c + (-1,) * (width - len(c)) for k in sizes for c in itertools.combinations(range(count), k)]
    return np.asarray(rows, dtype=np.int64).reshape(-1, width)


def _windows(low: np.ndarray, high: np.ndarray, centre: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidate pairs (i, j) for j in [low[i], high[i]) of a sorted array. Past ``MAX_SCORED`` pairs in all, each
    window shrinks to its share around ``centre[i]`` (the amount that would even the step out best lies near its
    middle), so a try never materializes millions of pairs (rows of hundreds of short sequences)."""
    sizes = np.maximum(high - low, 0)
    if sizes.sum() > MAX_SCORED:
        share = max(1, MAX_SCORED // sizes.size)
        low = np.maximum(low, np.minimum(centre - share // 2, high - share))
        high = np.minimum(high, low + share)
        sizes = np.maximum(high - low, 0)
    total = int(sizes.sum())
    first = np.repeat(np.arange(sizes.size), sizes)
    return first, np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes) + np.repeat(low, sizes)


def _thinned(first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most ``MAX_SCORED`` candidate pairs, an even stride of them."""
    if first.size <= MAX_SCORED:
        return first, second
    keep = np.linspace(0, first.size - 1, MAX_SCORED).astype(np.int64)
    return first[keep], second[keep]


class ExchangePass:
    """One round of exchanges over a fixed layout; ``run()`` applies them to ``bins``."""

    def __init__(
        self, lengths: np.ndarray, bins: np.ndarray, num_bins: int, shape: StepShape, order: np.ndarray
    ) -> None:
        capacity, cost, dp = shape.capacity, shape.cost, shape.dp
        self.lengths = lengths.astype(np.float64)
        self.bins = bins.copy()
        self.linear, self.attention = cost.linear, cost.attention
        self.dp = dp
        self.most = shape.max_per_bin if shape.max_per_bin is not None else len(bins) + 1
        per_step = shape.rows_per_step
        self.steps = order.size // per_step
        self.members: list[list[int]] = [[] for _ in range(num_bins)]
        for piece in np.flatnonzero(bins >= 0).tolist():
            self.members[bins[piece]].append(piece)
        placed = bins >= 0
        self.count = np.bincount(bins[placed], minlength=num_bins)  # sequences per row
        self.room = capacity - np.bincount(bins[placed], weights=lengths[placed], minlength=num_bins).astype(np.int64)
        self.unit = np.full(num_bins, -1, dtype=np.int64)  # step * dp + rank, -1 for the reservoir
        position = np.arange(self.steps * per_step)
        self.unit[order[: self.steps * per_step]] = (position // per_step) * dp + position % dp
        self.rows_of_step = order[: self.steps * per_step].reshape(self.steps, per_step)
        self.reservoir = order[self.steps * per_step :]
        costs = row_costs(lengths, bins, num_bins, cost)
        self.load = np.zeros(self.steps * dp)
        np.add.at(self.load, self.unit[self.unit >= 0], costs[self.unit >= 0])
        self.by_step = self.load.reshape(self.steps, dp)  # a view: updates to load show here
        self.total = self.by_step.sum(axis=1)  # each step's work, kept current by _apply
        self.ratio = self.by_step.max(axis=1) / (self.total / dp)
        self.top = np.argsort(-self.by_step, axis=1)[:, :3]
        self.step_by_mean = np.argsort(self.by_step.mean(axis=1), kind="stable")
        self.rank_by_mean = np.empty(self.steps, dtype=np.int64)
        self.rank_by_mean[self.step_by_mean] = np.arange(self.steps)

    # --- the objective ---------------------------------------------------------------------------------------

    def _max_without(self, units: np.ndarray, other: np.ndarray | None = None) -> np.ndarray:
        """Largest load in each unit's step, leaving out the unit (and ``other``, of the same step)."""
        step = units // self.dp
        candidates = self.top[step] + (step * self.dp)[:, None]
        keep = candidates != units[:, None]
        if other is not None:
            keep &= candidates != other[:, None]
        found = self.load[candidates[np.arange(units.size), np.argmax(keep, axis=1)]]
        return np.where(keep.any(axis=1), found, 0.0)  # 0: no other unit in the step (DP 2, both left out)

    def _change(self, givers: np.ndarray, takers: np.ndarray, amount: np.ndarray) -> np.ndarray:
        """Change of the summed step ratios when unit ``givers`` hands ``amount`` of work to unit ``takers``
        (-1: the reservoir). Negative is better."""
        dp = self.dp
        out = np.zeros(amount.shape)
        same = np.where(givers >= 0, givers // dp, -1) == np.where(takers >= 0, takers // dp, -2)
        for units, sign in ((givers, -1.0), (takers, 1.0)):
            alone = (units >= 0) & ~same
            if alone.any():
                unit, step, moved = units[alone], units[alone] // dp, sign * amount[alone]
                new_max = np.maximum(self.load[unit] + moved, self._max_without(unit))
                out[alone] += new_max / ((self.total[step] + moved) / dp) - self.ratio[step]
        if same.any():
            giver, taker, moved = givers[same], takers[same], amount[same]
            step = giver // dp
            new_max = np.maximum(self.load[giver] - moved, self.load[taker] + moved)
            new_max = np.maximum(new_max, self._max_without(giver, taker))
            change = new_max / (self.total[step] / dp) - self.ratio[step]
            out[same] = np.where(giver == taker, 0.0, change)  # rows of one rank: its load does not change
        return out

    def _work(self, tokens: np.ndarray, squares: np.ndarray) -> np.ndarray:
        return self.linear * tokens + self.attention * squares

    # --- candidates ------------------------------------------------------------------------------------------

    def _nearby(self, step: int) -> np.ndarray:
        at = int(self.rank_by_mean[step])
        return self.rows_of_step[self.step_by_mean[max(0, at - WINDOW) : at + WINDOW + 1]].ravel()

    def _shortest(self, row: int) -> np.ndarray:
        pieces = np.asarray(self.members[row], dtype=np.int64)
        return pieces[np.argsort(self.lengths[pieces], kind="stable")[:SHORTEST]]

    def _picks(self, table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(count, tokens, sum of squares) of each row of piece indices (-1 pads)."""
        values = np.where(table >= 0, self.lengths[np.maximum(table, 0)], 0.0)
        return (table >= 0).sum(axis=1), values.sum(axis=1), (values * values).sum(axis=1)

    def _offers(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What rows with room hand back for a give: nothing, one sequence, or (reservoir rows) two or three
        of their shortest. Returns (row of each offer, piece indices padded with -1 to width 3)."""
        rows = rows[self.room[rows] > 0]
        owners, tables = [rows], [np.full((rows.size, 3), -1, dtype=np.int64)]
        single = self._pieces_of(rows)
        if single.size:
            owners.append(self.bins[single])
            tables.append(np.column_stack([single, np.full((single.size, 2), -1)]))
        for row in rows[self.unit[rows] < 0].tolist():
            shortest = self._shortest(row)
            combos = _combinations(shortest.size, (2, 3))
            if combos.size:
                owners.append(np.full(combos.shape[0], row))
                tables.append(np.where(combos >= 0, shortest[np.maximum(combos, 0)], -1))
        return np.concatenate(owners), np.concatenate(tables)

    def _pieces_of(self, rows: np.ndarray) -> np.ndarray:
        """The sequences of ``rows`` (ascending index), found through ``bins`` at numpy speed."""
        wanted = np.zeros(len(self.members), dtype=bool)
        wanted[rows] = True
        return np.flatnonzero(wanted[np.maximum(self.bins, 0)] & (self.bins >= 0))

    def _gives(self, row: int) -> np.ndarray:
        """What a row can give: each of its sequences, or two of its shortest (width 2, -1 pads)."""
        pieces = np.asarray(self.members[row], dtype=np.int64)
        shortest = self._shortest(row)
        pairs = _combinations(shortest.size, (2,))
        singles = np.column_stack([pieces, np.full(pieces.size, -1)])
        if not pairs.size:
            return singles
        return np.concatenate([singles, shortest[pairs]])

    def _best_give(self, step: int) -> tuple[float, tuple | None]:
        giver = step * self.dp + int(self.by_step[step].argmax())
        spread = (self.load[giver] - self.by_step[step].min()) / self.linear + 1.0
        rows_of_step = self.rows_of_step[step]
        best: tuple[float, tuple | None] = (-MIN_GAIN, None)
        all_owners, all_table = self._offers(np.concatenate([self._nearby(step), self.reservoir]))
        all_picks = self._picks(all_table)
        by_tokens = np.argsort(all_picks[1], kind="stable")
        all_owners, all_table = all_owners[by_tokens], all_table[by_tokens]
        all_picks = tuple(values[by_tokens] for values in all_picks)
        for x in rows_of_step[self.unit[rows_of_step] == giver].tolist():
            other = all_owners != x  # a row does not trade with itself
            owners, table = all_owners[other], all_table[other]
            if not owners.size:
                continue
            taken, offered, offered_sq = (values[other] for values in all_picks)
            pieces = self.members[x]
            gives = self._gives(x)
            given, give_tokens, give_sq = self._picks(gives)
            # offers worth between 1 and `spread` tokens less than what is given
            low = np.searchsorted(offered, give_tokens - spread, side="left")
            high = np.searchsorted(offered, give_tokens - 1, side="right")
            g, o = _windows(low, high, np.searchsorted(offered, give_tokens - spread / 2))
            if not g.size:
                continue
            moved = give_tokens[g] - offered[o]
            ok = moved <= self.room[owners[o]]
            ok &= ~((given[g] == len(pieces)) & (taken[o] == 0))  # the giver keeps a sequence
            ok &= len(pieces) - given[g] + taken[o] <= self.most
            ok &= self.count[owners[o]] + given[g] - taken[o] <= self.most
            g, o = _thinned(g[ok], o[ok])
            if not g.size:
                continue
            amount = self._work(give_tokens[g] - offered[o], give_sq[g] - offered_sq[o])
            change = self._change(np.full(g.size, giver), self.unit[owners[o]], amount)
            k = int(np.argmin(change))
            if change[k] < best[0]:
                best = (float(change[k]), (x, gives[g[k]], int(owners[o[k]]), table[o[k]]))
        return best

    def _best_take(self, step: int) -> tuple[float, tuple | None]:
        taker = step * self.dp + int(self.by_step[step].argmin())
        spread = (self.by_step[step].max() - self.load[taker]) / self.linear + 1.0
        rows_of_step = self.rows_of_step[step]
        best: tuple[float, tuple | None] = (-MIN_GAIN, None)
        for z in rows_of_step[self.unit[rows_of_step] == taker].tolist():
            if self.room[z] <= 0:
                continue
            sources = np.concatenate([self._nearby(step), self.reservoir])
            pieces = self._pieces_of(sources[sources != z])
            if not pieces.size:
                continue
            pieces = pieces[np.argsort(self.lengths[pieces], kind="stable")]
            source, taken = self.bins[pieces], self.lengths[pieces]
            own = np.asarray(self.members[z] + [-1], dtype=np.int64)
            own_tokens = np.where(own >= 0, self.lengths[np.maximum(own, 0)], 0.0)
            # sequences longer than what is handed back by 1 to min(room, spread) tokens
            reach = min(float(self.room[z]), spread)
            low = np.searchsorted(taken, own_tokens, side="right")
            high = np.searchsorted(taken, own_tokens + reach, side="right")
            g, o = _windows(low, high, np.searchsorted(taken, own_tokens + reach / 2))
            nothing_back = g == own.size - 1
            ok = ~nothing_back | (self.count[source[o]] > 1)  # a source that only gives keeps a sequence
            ok &= ~nothing_back | (len(self.members[z]) < self.most)
            g, o = _thinned(g[ok], o[ok])
            if not g.size:
                continue
            moved = taken[o] - own_tokens[g]
            amount = self._work(moved, taken[o] ** 2 - own_tokens[g] ** 2)
            change = self._change(self.unit[source[o]], np.full(g.size, taker), amount)
            k = int(np.argmin(change))
            if change[k] < best[0]:
                best = (float(change[k]), (int(source[o[k]]), pieces[o[k] : o[k] + 1], z, own[g[k] : g[k] + 1]))
        return best

    def _best_spread(self, step: int) -> tuple | None:
        """One sequence from the slowest rank of the step to its fastest, the one that best halves their gap
        without reaching it (so the step's slowest rank never gets slower), or None. This evens out the deficit
        of an under-filled row inside its own step in a few dozen cheap moves. Left to the scored search, whose
        objective is flat while several ranks tie for the slowest, it cascaded through neighbouring steps
        (220 trades, 2-9 s, for one row 70% empty in a 100k-example pack)."""
        loads = self.by_step[step]
        giver, taker = int(loads.argmax()), int(loads.argmin())
        gap = loads[giver] - loads[taker]
        if gap <= 0:
            return None
        rows = self.rows_of_step[step]
        ranks = self.unit[rows] - step * self.dp
        best: tuple[float, tuple | None] = (0.0, None)
        takers = [z for z in rows[ranks == taker].tolist() if self.room[z] > 0 and self.count[z] < self.most]
        for x in rows[ranks == giver].tolist():
            if self.count[x] < 2 or not takers:
                continue
            pieces = np.asarray(self.members[x], dtype=np.int64)
            amount = self._work(self.lengths[pieces], self.lengths[pieces] ** 2)
            for z in takers:
                # half the drop of the two loads' squares: positive only for a move short of the gap
                score = np.where(self.lengths[pieces] <= self.room[z], amount * (gap - amount), 0.0)
                k = int(np.argmax(score))
                if score[k] > best[0]:
                    best = (float(score[k]), (x, pieces[k : k + 1], z, np.empty(0, dtype=np.int64)))
        return best[1]

    # --- applying ---------------------------------------------------------------------------------------------

    def _apply(self, x: int, gives: np.ndarray, y: int, takes: np.ndarray) -> set[int]:
        """Row ``x`` hands ``gives`` to row ``y`` and takes ``takes`` back; returns the steps touched."""
        touched = set()
        moves = [(p, x, y) for p in gives.tolist() if p >= 0] + [(p, y, x) for p in takes.tolist() if p >= 0]
        for piece, source, target in moves:
            length = self.lengths[piece]
            work = self.linear * length + self.attention * length * length
            self.bins[piece] = target
            self.members[source].remove(piece)
            self.members[target].append(piece)
            self.count[source] -= 1
            self.count[target] += 1
            self.room[source] += int(length)
            self.room[target] -= int(length)
            for row, sign in ((source, -1.0), (target, 1.0)):
                if self.unit[row] >= 0:
                    self.load[self.unit[row]] += sign * work
                    touched.add(int(self.unit[row] // self.dp))
        for step in touched:
            self.total[step] = self.by_step[step].sum()
            self.ratio[step] = self.by_step[step].max() / (self.total[step] / self.dp)
            self.top[step] = np.argsort(-self.by_step[step])[:3]
        return touched

    def run(self) -> int:
        """Exchanges, worst step first (a spread where one is left, else the best give or take), until no step
        beyond ``TOLERANCE`` improves (at most 4 tries per step on average); returns how many."""
        heap = [(1.0 - self.ratio[k], k) for k in range(self.steps)]
        heapq.heapify(heap)
        stuck: set[int] = set()
        tries = applied = 0
        while heap and tries < 4 * self.steps + 100:
            negative_excess, step = heapq.heappop(heap)
            if step in stuck or negative_excess != 1.0 - self.ratio[step] or negative_excess >= -TOLERANCE:
                continue
            tries += 1
            move = self._best_spread(step)
            if move is None:
                move = min(self._best_give(step), self._best_take(step), key=lambda found: found[0])[1]
            if move is None:
                stuck.add(step)
                continue
            for touched in self._apply(*move):
                stuck.discard(touched)
                heapq.heappush(heap, (1.0 - self.ratio[touched], touched))
            applied += 1
        return applied


def exchange(layout: RowSchedule) -> RowSchedule:
    """One pass of exchanges over ``layout``'s order: a layout of the exchanged rows in the same order, or
    ``layout`` itself when no exchange lowers the summed step ratios."""
    trades = ExchangePass(layout.lengths, layout.bins, layout.num_bins, layout.shape, layout.order)
    if trades.run() == 0:
        return layout
    return layout.with_bins(trades.bins)
