"""The ``attention.*`` rule cases (run by ``tests/rules/test_attention.py``)."""

from __future__ import annotations

import os
from typing import Any, Callable

from tests.support.rule_cases import SPECS, Case, in_turn


def _env(**values: str) -> Callable[[Any, Any], None]:
    """Environment variables the launch has (the conftest fixture restores the environment after each test)."""

    def mutate(cfg: Any, tmp_path: Any) -> None:
        os.environ.update(values)

    return mutate


def _flash_over_padded_rows(cfg: Any, tmp_path: Any) -> None:
    """FlashAttention asked for over padded rows: FlashAttention 2 refuses THD with padding between sequences."""
    from megatron.core.transformer.enums import AttnBackend

    cfg.model.attention_backend = AttnBackend.flash
    cfg.dataset.offline_packing_specs.pad_seq_to_mult = 4


CASES = [
    Case(
        "attention.backend_available",
        "packed_cfg",
        8,
        in_turn(_env(MBRIDGE_SEQPACK_GPU_ARCH="sm90"), _flash_over_padded_rows),
        {
            "layers": "all 12 layers",
            "model.attention_backend": "AttnBackend.flash",
            f"{SPECS}.pad_seq_to_mult": 4,
            "pad_between_seqs": True,
            "env NVTE_FUSED_ATTN": "0",
            "env NVTE_UNFUSED_ATTN": "0",
            "target": "sm90",
        },
    ),
    Case(
        "attention.backend_env_conflict",
        "packed_cfg",
        8,
        _env(MBRIDGE_SEQPACK_GPU_ARCH="sm90", NVTE_FUSED_ATTN="0"),
        {"model.attention_backend": "AttnBackend.auto", "env NVTE_FUSED_ATTN": "0"},
        {"model.attention_backend": "auto"},
    ),
]
