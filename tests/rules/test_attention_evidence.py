"""The attention rules against the code that fails: Gemma-2's and Megatron-Core's own core attention refuse packed
input and CP, Transformer Engine refuses windowed ring attention and uneven a2a heads, Megatron-Core refuses
deterministic mode without the TE variable. Each test runs the real installed code on CPU."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import torch

from mbridge_seqpack import check

pytestmark = pytest.mark.slow


def _ids(cfg: Any, world: int = 8) -> list[str]:
    return sorted({v.rule_id for v in check(cfg, world_size=world) if v.severity == "error"})


def _packed_params() -> Any:
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=5, max_seqlen_kv=5)


@pytest.mark.evidence("model.core_attention_packing")
def test_gemma2_attention_raises_on_packed_rows_and_the_rule_says_so(gemma2_cfg: Any) -> None:
    from megatron.bridge.models.gemma.gemma2_provider import Gemma2FlexDotProductAttention

    spec = gemma2_cfg.model.transformer_layer_spec(gemma2_cfg.model)
    core = spec.submodules.self_attention.submodules.core_attention
    assert core is Gemma2FlexDotProductAttention
    attention = Gemma2FlexDotProductAttention.__new__(Gemma2FlexDotProductAttention)
    torch.nn.Module.__init__(attention)
    qkv = torch.zeros(8, 1, 2, 4)
    with pytest.raises(ValueError, match="Packed sequence is not supported by DotProductAttention"):
        attention.forward(qkv, qkv, qkv, None, packed_seq_params=_packed_params())
    (v,) = [v for v in check(gemma2_cfg, world_size=8) if v.severity == "error"]
    assert v.rule_id == "model.core_attention_packing"
    assert v.fields == {"core attention": "Gemma2FlexDotProductAttention", "dataset.enable_offline_packing": True}
    assert v.overrides == ["dataset.enable_offline_packing=false", "dataset.offline_packing_specs=null"]


@pytest.mark.evidence("model.core_attention_cp")
def test_gemma2_attention_refuses_cp_when_built(gemma2_cfg: Any) -> None:
    from megatron.bridge.models.gemma.gemma2_provider import Gemma2DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    model = copy.deepcopy(gemma2_cfg.model)
    model.context_parallel_size = 2
    with pytest.raises(ValueError, match="Context parallelism is only supported by TEDotProductAttention"):
        Gemma2DotProductAttention(model, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    gemma2_cfg.model.context_parallel_size = 2
    assert "model.core_attention_cp" in _ids(gemma2_cfg)


@pytest.mark.evidence("model.core_attention_packing")
def test_megatron_core_local_attention_refuses_packed_rows(packed_cfg: Any) -> None:
    from megatron.bridge.models.gpt_provider import local_layer_spec
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    attention = DotProductAttention.__new__(DotProductAttention)
    torch.nn.Module.__init__(attention)
    qkv = torch.zeros(8, 1, 2, 4)
    with pytest.raises(AssertionError, match="Packed sequence is not supported by DotProductAttention"):
        attention.forward(qkv, qkv, qkv, None, packed_seq_params=_packed_params())
    packed_cfg.model.transformer_layer_spec = local_layer_spec
    assert _ids(packed_cfg) == ["model.core_attention_packing"]


@pytest.mark.evidence("cp.sliding_window_comm_type")
def test_transformer_engine_refuses_windowed_ring_attention(packed_cfg: Any) -> None:
    """TE's own dispatcher asserts before any kernel runs; the rule fires for p2p and not for all_gather."""
    import torch.distributed as dist
    from transformer_engine.pytorch.attention.dot_product_attention.context_parallel import (
        attn_forward_func_with_cp,
    )

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        q = torch.zeros(8, 1, 2, 4)
        with pytest.raises(AssertionError, match="does not support sliding window attention with cp_comm_type='p2p'"):
            attn_forward_func_with_cp(
                True, q, q, q, None, None, 8, 8, None, None, 0.0, dist.group.WORLD, [0], None, "p2p",
                qkv_format="sbhd", attn_mask_type="causal", window_size=(512, 0), use_fused_attention=True,
            )  # fmt: skip
    finally:
        if created:
            dist.destroy_process_group()
    packed_cfg.model.window_size = (512, 0)
    packed_cfg.model.attention_dropout = 0.0  # TE's FusedAttention takes windows without dropout only
    packed_cfg.model.context_parallel_size = 2
    packed_cfg.model.calculate_per_token_loss = True
    packed_cfg.ddp.average_in_collective = False
    packed_cfg.dataset.offline_packing_specs.pad_seq_to_mult = 4
    assert _ids(packed_cfg) == ["cp.sliding_window_comm_type"]
    packed_cfg.model.cp_comm_type = "all_gather"
    assert _ids(packed_cfg) == []


@pytest.mark.evidence("determinism.te_attention_env")
def test_deterministic_mode_needs_the_te_variable_before_the_model_is_built(packed_cfg: Any) -> None:
    packed_cfg.model.deterministic_mode = True
    packed_cfg.model.cross_entropy_loss_fusion = False
    saved = os.environ.pop("NVTE_ALLOW_NONDETERMINISTIC_ALGO", None)
    try:
        assert _ids(packed_cfg) == ["determinism.te_attention_env"]
        os.environ["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] = "0"
        assert _ids(packed_cfg) == []
        os.environ.pop("NVTE_ALLOW_NONDETERMINISTIC_ALGO")
        packed_cfg.env_vars = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}  # runtime_config_update exports these first
        assert _ids(packed_cfg) == []
        os.environ["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] = "1"  # ... with os.environ.setdefault: a launch value stays
        from megatron.bridge.training.config import apply_environment_variables

        apply_environment_variables(packed_cfg)
        assert os.environ["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "1"
        assert _ids(packed_cfg) == ["determinism.te_attention_env"]
    finally:
        os.environ.pop("NVTE_ALLOW_NONDETERMINISTIC_ALGO", None)
        if saved is not None:
            os.environ["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] = saved
