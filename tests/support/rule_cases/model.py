"""The ``model.*`` rule cases (run by ``tests/rules/test_model.py``)."""

from __future__ import annotations

from typing import Any

from tests.support.rule_cases import CP2_LOSS, SPECS, Case, set_fields


def _gdn(cfg: Any, tmp_path: Any) -> None:
    cfg.model.experimental_attention_variant = "gated_delta_net"


def _qwen35_vl(cfg: Any, tmp_path: Any) -> None:
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider

    cfg.model = Qwen35VLModelProvider(num_layers=4, hidden_size=256, num_attention_heads=4, seq_length=4096)


def _local_attention(cfg: Any, tmp_path: Any) -> None:
    from megatron.bridge.models.gpt_provider import local_layer_spec

    cfg.model.transformer_layer_spec = local_layer_spec


CASES = [
    Case(
        "model.offline_packing_opt_out",
        "packed_cfg",
        8,
        _gdn,
        {"model": "GPTModelProvider", "model family": "Qwen3-Next", "dataset.enable_offline_packing": True},
        {"dataset.enable_offline_packing": False, SPECS: None},
    ),
    Case(
        "model.in_batch_packing_opt_out",
        "vlm_cfg",
        8,
        _qwen35_vl,
        {"model": "Qwen35VLModelProvider", "model family": "Qwen3.5-VL", "dataset.enable_in_batch_packing": True},
        {"dataset.enable_in_batch_packing": False},
    ),
    Case(
        "model.core_attention_packing",
        "packed_cfg",
        8,
        _local_attention,
        {"core attention": "DotProductAttention", "dataset.enable_offline_packing": True},
        {"dataset.enable_offline_packing": False, "dataset.offline_packing_specs": None},
    ),
    Case(
        "model.core_attention_cp",
        "unpacked_cfg",
        8,
        lambda cfg, tmp: (_local_attention(cfg, tmp), set_fields(**CP2_LOSS)(cfg, tmp)),
        {"core attention": "DotProductAttention", "model.context_parallel_size": 2},
        {"model.context_parallel_size": 1},
    ),
]
