"""How a pack's rows were balanced, as its metadata records it (``BalanceRecord``), and what ``inspect`` measures
of rows as written (``BalanceReport``). Read by the artifact and the rules; costs rows through ``cost.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mbridge_seqpack.placement.cost import DEFAULT_COST, CostModel, row_costs
from mbridge_seqpack.placement.layout import straggler_ratio
from mbridge_seqpack.placement.sampler import read_order

__all__ = ["BalanceRecord", "BalanceReport", "balance_report"]


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
        """The record of an entry as a packed file's schema metadata holds it (its ``balance``)."""
        return cls.of_value((entry or {}).get("balance"))

    @classmethod
    def of_value(cls, data: Any) -> "BalanceRecord | None":
        """The record from a metadata entry's ``balance``; None for a split that was not balanced (or a malformed
        record, which the entry's seal reports)."""
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
