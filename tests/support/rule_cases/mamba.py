"""The ``mamba.*`` rule cases (run by ``tests/rules/test_mamba.py``)."""

from __future__ import annotations

from typing import Any

from tests.support.rule_cases import Case


def _hybrid_mamba(cfg: Any, tmp_path: Any) -> None:
    """A small Mamba + attention hybrid provider as a user builds it (is_hybrid_model left at its False default)."""
    from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider

    cfg.model = HybridModelProvider(
        hybrid_layer_pattern="M*M-",
        hidden_size=256,
        num_attention_heads=4,
        mamba_num_heads=8,
        mamba_head_dim=32,
        vocab_size=1024,
        seq_length=4096,
    )


CASES = [
    Case(
        "mamba.packing_needs_hybrid",
        "packed_cfg",
        8,
        _hybrid_mamba,
        {"model": "HybridModelProvider", "model.is_hybrid_model": False, "dataset.enable_offline_packing": True},
        {"model.is_hybrid_model": True},
    ),
]
