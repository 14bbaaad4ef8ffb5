"""Work-balanced packs: rows of equal cost, arranged so every data-parallel rank is equally busy each step.

A row's cost is ``linear * tokens + attention * sum(s_i ** 2)``: the matmuls grow with tokens, causal
attention with the square of each sequence's length (THD attention never crosses a boundary). A row holding
one 8k sequence costs far more attention than a row of 300 short ones, and with data parallelism every step
waits for its slowest rank.

Two levers, both without extra rows:

1. ``balance_bins`` re-deals the sequences into the same number of rows, longest first, each to the
   cheapest row that still has room (cost-LPT with the token capacity; an optional cap on sequences per row).
   Equal-cost rows stay balanced under any order, so this holds under Megatron-Bridge's shuffling samplers
   (``cyclic``; ``batch`` with its per-epoch shuffle; ``max_train_samples`` epoch shuffles).
2. ``slot_order`` lays the rows out so that rows of similar cost share a step (global batch) and each step's
   rows are split over the ranks by LPT; the steps come in a seeded random order (Megatron-Bridge's own prep
   writes rows in first-fit-decreasing order: similar rows adjacent, but the longest sequences all at the
   start of training). ``file_layout`` writes that layout where the sampler will read it: in file order for
   the ``single`` sampler, through the inverse of the seeded permutation of Megatron-Bridge's ``batch``
   sampler (the SFT datasets' default) for its first epoch. Later epochs of the ``batch`` sampler, and the
   ``cyclic`` sampler, read the rows in another random order, where equal-cost rows (lever 1) are what holds.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mbridge_seqpack.errors import UsageError

__all__ = [
    "CostModel",
    "BalanceResult",
    "balance_bins",
    "slot_order",
    "straggler_ratio",
    "step_ratios",
    "row_costs",
    "SAMPLERS",
    "read_order",
    "read_order_digest",
    "file_layout",
    "StepShape",
    "BalanceRecord",
    "BalanceReport",
    "balance_report",
]


@dataclass(frozen=True)
class CostModel:
    """Per-row work: ``linear`` per token plus ``attention`` per within-sequence token pair (forward FLOPs
    per layer; only their ratio matters for balance)."""

    linear: float
    attention: float

    @classmethod
    def from_shape(
        cls,
        hidden: int,
        ffn_hidden: int,
        num_heads: int,
        num_query_groups: int | None = None,
        kv_channels: int | None = None,
        gated_mlp: bool = True,
    ) -> "CostModel":
        """Transformer layer: QKV + output projections and the MLP (3 matrices when gated) as 2 FLOPs per
        weight per token; causal attention (QK^T and AV over half the square) as 2 * heads * head_dim."""
        head_dim = kv_channels or hidden // num_heads
        groups = num_query_groups or num_heads
        projections = hidden * head_dim * (2 * num_heads + 2 * groups)
        mlp = (3 if gated_mlp else 2) * hidden * ffn_hidden
        return cls(linear=2.0 * (projections + mlp), attention=2.0 * num_heads * head_dim)

    @classmethod
    def from_provider(cls, model: Any) -> "CostModel":
        """From a Megatron-Bridge model provider (``hidden_size``, ``ffn_hidden_size``, heads, groups)."""
        return cls.from_shape(
            hidden=model.hidden_size,
            ffn_hidden=model.ffn_hidden_size or 4 * model.hidden_size,
            num_heads=model.num_attention_heads,
            num_query_groups=getattr(model, "num_query_groups", None),
            kv_channels=getattr(model, "kv_channels", None),
            gated_mlp=bool(getattr(model, "gated_linear_unit", True)),
        )


#: Llama-3-8B's shape, for packs made without a recipe
DEFAULT_COST = CostModel.from_shape(hidden=4096, ffn_hidden=14336, num_heads=32, num_query_groups=8)


def row_costs(lengths: np.ndarray, bins: np.ndarray, num_bins: int, cost: CostModel) -> np.ndarray:
    """Cost of every row (bins ``-1`` are dropped sequences)."""
    placed = bins >= 0
    lengths = lengths[placed].astype(np.float64)
    return cost.linear * np.bincount(bins[placed], weights=lengths, minlength=num_bins) + cost.attention * np.bincount(
        bins[placed], weights=lengths * lengths, minlength=num_bins
    )


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
    from mbridge_seqpack.placement.packer import place

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


#: how Megatron-Bridge's samplers read a packed split (``dataset.dataloader_type``): ``batch`` (its SFT
#: datasets' default, ``MegatronPretrainingBatchSampler``) reads a seeded permutation that changes every epoch;
#: ``single`` reads in file order. Both hand position ``j`` of a global batch to DP rank ``j % dp``.
SAMPLERS = ("batch", "single")


def read_order(rows: int, sampler: str, seed: int, epoch: int = 0) -> np.ndarray:
    """File rows in the order the sampler reads them in ``epoch``. ``batch`` as Megatron-Bridge's
    ``MegatronPretrainingBatchSampler.__iter__`` (shuffle on): ``torch.randperm`` with a generator seeded
    ``seed + epoch`` (``seed`` is ``dataset.seed``)."""
    if sampler == "single":
        return np.arange(rows, dtype=np.int64)
    if sampler != "batch":
        raise UsageError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    import torch

    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(rows, generator=generator).numpy().astype(np.int64)


def read_order_digest(rows: int, sampler: str, seed: int) -> str:
    """sha256 of the epoch-0 read order: the ``batch`` sampler's permutation comes from this process's torch,
    and a training environment whose torch permutes otherwise would read the rows in another order."""
    import hashlib

    return hashlib.sha256(read_order(rows, sampler, seed).astype("<i8").tobytes()).hexdigest()


def file_layout(order: np.ndarray, sampler: str, seed: int) -> np.ndarray:
    """Which row to write at each file index so that the sampler reads ``order`` in its first epoch."""
    layout = np.empty_like(order)
    layout[read_order(order.size, sampler, seed)] = order
    return layout


@dataclass(frozen=True)
class StepShape:
    """What leveling works within: rows of ``capacity`` tokens costed by ``cost``, ``dp`` ranks reading
    ``micro_batches`` rows each per step, at most ``max_per_bin`` sequences per row (None: no cap)."""

    capacity: int
    cost: CostModel
    dp: int
    micro_batches: int = 1
    max_per_bin: int | None = None

    @property
    def rows_per_step(self) -> int:
        return self.dp * self.micro_batches


@dataclass(frozen=True)
class BalanceRecord:
    """How ``pack`` balanced and laid out a split's rows: the ``balance`` of its metadata entry, as written and read.

    A pack made before the sampler was recorded was laid out in file order (``single``, no seed or read order).
    """

    data_parallel: int
    micro_batches: int
    cost_linear: float
    cost_attention: float
    row_cost_cv_before: float
    row_cost_cv: float
    sampler: str = "single"
    sampler_seed: int | None = None
    read_order_sha256: str | None = None
    rows_rebalanced: bool = False
    max_sequences_per_row: int | None = None
    extra_rows_for_cap: int = 0
    # None: fewer rows than one step (data_parallel * micro_batches), so no step to balance
    straggler_ratio: float | None = None
    straggler_ratio_later_epochs: float | None = None  # epochs 1-4 of the batch sampler, as read

    @property
    def cost(self) -> CostModel:
        return CostModel(float(self.cost_linear), float(self.cost_attention))

    def to_text(self) -> str:
        """``pack``'s line for it."""
        ratio = self.straggler_ratio
        shown = f"{ratio:.4f}" if ratio is not None else "n/a (fewer rows than one step)"
        if ratio is not None and self.sampler == "batch":
            shown += (
                f" as the batch sampler (seed {self.sampler_seed}) reads epoch 0, "
                f"{self.straggler_ratio_later_epochs:.4f} in epochs 1-4"
            )
        cap = f", {self.extra_rows_for_cap} extra row(s) for the cap" if self.extra_rows_for_cap else ""
        return (
            f"work balance (DP {self.data_parallel}, {self.micro_batches} row(s) per rank per step): modeled "
            f"straggler ratio {shown}, row cost spread {self.row_cost_cv:.1%} (was {self.row_cost_cv_before:.1%})"
            + cap
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BalanceRecord":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    @classmethod
    def of_entry(cls, entry: Mapping[str, Any] | None) -> "BalanceRecord | None":
        """The record of a metadata entry; None for a split that was not balanced (or a malformed record, which
        the entry's seal reports)."""
        data = (entry or {}).get("balance")
        if not isinstance(data, Mapping):
            return None
        try:
            return cls.from_dict(data)
        except TypeError:
            return None


@dataclass(frozen=True)
class BalanceReport:
    """The modeled straggler ratio of written rows: as the recorded sampler reads them, under a shuffling sampler,
    and for the rows in Megatron-Bridge's own write order read the same way (``inspect``)."""

    data_parallel: int
    micro_batches: int
    read_by: str
    as_read: float
    shuffled: float
    megatron_bridge_order: float
    row_cost_cv: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_text(self) -> str:
        return (
            f"modeled straggler ratio at DP {self.data_parallel}, {self.micro_batches} row(s) per rank per step: "
            f"{self.as_read:.4f} as {self.read_by} reads it, {self.shuffled:.4f} under a shuffling sampler, "
            f"{self.megatron_bridge_order:.4f} for Megatron-Bridge's own rows read the same way; row cost spread "
            f"{self.row_cost_cv:.1%}"
        )


def balance_report(
    lengths: np.ndarray, row_of_seq: np.ndarray, rows: int, recorded: BalanceRecord | None
) -> BalanceReport | None:
    """The straggler ratios of rows as written (``lengths`` per sequence, ``row_of_seq`` its row), with the layout
    and cost model the pack recorded (Llama-3-8B's, DP 8, file order for a pack without a record). Megatron-Bridge's
    first-fit-decreasing prep writes the rows longest first sequence first. None: not one full step (e.g. a small
    validation split), nothing to balance."""
    dp, micro = (recorded.data_parallel, recorded.micro_batches) if recorded else (8, 1)
    if rows < dp * micro:
        return None
    cost = recorded.cost if recorded else DEFAULT_COST
    costs = row_costs(lengths, row_of_seq, rows, cost)
    longest = np.zeros(rows, dtype=np.int64)
    np.maximum.at(longest, row_of_seq, lengths)
    tokens = np.bincount(row_of_seq, weights=lengths, minlength=rows)
    ffd_order = np.lexsort((-tokens, -longest))
    shuffled = [straggler_ratio(costs[np.random.default_rng(s).permutation(rows)], dp, micro) for s in range(16)]
    sampler = recorded.sampler if recorded else "single"
    seed = int(recorded.sampler_seed or 0) if recorded else 0
    read = read_order(rows, sampler, seed)
    return BalanceReport(
        data_parallel=dp,
        micro_batches=micro,
        read_by=f"the batch sampler (seed {seed}, epoch 0)" if sampler == "batch" else "the sequential sampler",
        as_read=round(straggler_ratio(costs[read], dp, micro), 6),
        shuffled=round(float(np.mean(shuffled)), 6),
        megatron_bridge_order=round(straggler_ratio(costs[ffd_order][read], dp, micro), 6),
        row_cost_cv=round(float(costs.std() / costs.mean()), 6) if rows else 0.0,
    )
