"""The row-cost model, and the one place a row's cost is computed (``row_costs``).

A row's cost is ``linear * tokens + attention * sum(s_i ** 2)``: the matmuls grow with tokens, causal
attention with the square of each sequence's length (THD attention never crosses a boundary). A row holding
one 8k sequence costs far more attention than a row of 300 short ones, and with data parallelism every step
waits for its slowest rank (``layout.step_ratios``, ``layout.straggler_ratio``). Every other module of
``placement/`` costs rows through here; ``balance`` and ``exchange`` keep running sums in the same formula while
they deal and trade (checked against ``row_costs`` from scratch in tests/placement/test_balance.py and
tests/placement/test_level.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CostModel", "DEFAULT_COST", "row_costs"]


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
