"""The ``vlm.*`` rule cases (run by ``tests/rules/test_vlm.py``)."""

from __future__ import annotations

from typing import Any

from tests.support.rule_cases import Case


def _qwen3_omni(cfg: Any, tmp_path: Any) -> None:
    from megatron.bridge.models.qwen_omni.qwen3_omni_provider import Qwen3OmniModelProvider

    cfg.model = Qwen3OmniModelProvider(
        num_layers=2, hidden_size=128, num_attention_heads=4, ffn_hidden_size=256, seq_length=4096, vocab_size=1024
    )


CASES = [
    Case(
        "vlm.collate_refuses_packing",
        "vlm_cfg",
        8,
        _qwen3_omni,
        {"model": "Qwen3OmniModelProvider", "dataset.enable_in_batch_packing": True},
        {"dataset.enable_in_batch_packing": False},
    ),
]
