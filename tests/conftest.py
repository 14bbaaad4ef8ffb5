"""Shared fixtures: real Megatron-Bridge ConfigContainers built offline.

Megatron-Bridge's import (~40 s on CPU) is paid once per session, on first use.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped on CPU")
    # remembered digests (digests.py) go to a directory of this run, not the user's ~/.cache
    cache = tempfile.mkdtemp(prefix="mbridge_seqpack_cache_")
    os.environ["MBRIDGE_SEQPACK_CACHE_DIR"] = cache
    config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # scripts/test.sh runs these in a process of their own (-m ray_cluster)
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray_cluster)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_environment():
    """``runtime_config_update`` exports a recipe's ``env_vars`` into ``os.environ``; keep tests independent."""
    from tests.zoo.harness import restored_environ

    with restored_environ():
        yield


@pytest.fixture(scope="session")
def megatron_bridge():
    """Import Megatron-Bridge's config module once, muting its import-time warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.bridge.training.config as config_module
    return config_module


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for every test that packs on one (two CPUs, as a 2-core CI machine has), started
    once: its tokenizing workers import Megatron-Bridge once for all of them. Idle workers are kept (Ray's default
    kills all but num_cpus of them after 1 s), so each pack's driver and tasks find them warm. The object store is
    held to 1 GiB (Ray's default maps 30% of the machine's memory; these tests put a few MB in it)."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    system = {"num_workers_soft_limit": 8, "idle_worker_killing_time_threshold_ms": 600_000}
    ray.init(
        num_cpus=2,
        object_store_memory=1 << 30,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _system_config=system,
    )
    yield ray
    ray.shutdown()


@pytest.fixture
def packed_cfg(megatron_bridge):
    """Small GPT, GPT SFT offline packed at 4096, global batch 16: valid at world size 8."""
    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import OfflinePacking
    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

    cfg = sft_base(small_gpt_provider(4096), seq_length=4096, global_batch_size=16)
    return apply(cfg, OfflinePacking(pack_size=4096))


@pytest.fixture
def unpacked_cfg(megatron_bridge):
    """Small GPT, GPT SFT without packing, global batch 16: valid at world size 8."""
    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

    return sft_base(small_gpt_provider(4096), seq_length=4096, global_batch_size=16)


@pytest.fixture
def vlm_cfg(megatron_bridge):
    """Small GPT with Megatron-Bridge's mock VLM dataset, in-batch packed, micro batch 2, global 16."""
    from megatron.bridge.data.builders.mock_vlm_sft import MockVLMSFTDatasetConfig

    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

    cfg = sft_base(small_gpt_provider(4096), seq_length=4096, global_batch_size=16, micro_batch_size=2)
    cfg.dataset = MockVLMSFTDatasetConfig(
        seq_length=4096, hf_processor_path="local/processor", enable_in_batch_packing=True
    )
    return cfg


@pytest.fixture
def qwen3vl_cfg(megatron_bridge):
    """A small Qwen3-VL provider (its finalize() turns per-token loss on at CP>1) with Megatron-Bridge's mock VLM
    dataset, in-batch packed, micro batch 2, global 16."""
    from megatron.bridge.data.builders.mock_vlm_sft import MockVLMSFTDatasetConfig
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLModelProvider

    from mbridge_seqpack.recipes.building_blocks import sft_base

    provider = Qwen3VLModelProvider(
        num_layers=2, hidden_size=128, num_attention_heads=4, ffn_hidden_size=256, seq_length=4096, vocab_size=1024
    )
    cfg = sft_base(provider, seq_length=4096, global_batch_size=16, micro_batch_size=2)
    cfg.dataset = MockVLMSFTDatasetConfig(
        seq_length=4096, hf_processor_path="local/processor", enable_in_batch_packing=True
    )
    return cfg


@pytest.fixture
def gemma2_cfg(packed_cfg):
    """The packed base with a small Gemma-2 provider (its layer spec uses Gemma-2's own core attention)."""
    from megatron.bridge.models.gemma.gemma2_provider import Gemma2ModelProvider

    packed_cfg.model = Gemma2ModelProvider(
        num_layers=2,
        hidden_size=256,
        num_attention_heads=4,
        num_query_groups=4,
        ffn_hidden_size=512,
        kv_channels=64,
        vocab_size=1024,
        seq_length=4096,
    )
    return packed_cfg


@pytest.fixture
def energon_cfg(megatron_bridge):
    """Small GPT with an Energon dataset using online packing, valid at world size 8."""
    from megatron.bridge.data.builders.energon import EnergonDatasetConfig, QwenVLEnergonTaskEncoderConfig

    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

    cfg = sft_base(small_gpt_provider(4096), seq_length=4096, global_batch_size=16)
    cfg.dataset = EnergonDatasetConfig(
        path="/data/energon",
        seq_length=4096,
        micro_batch_size=1,
        task_encoder=QwenVLEnergonTaskEncoderConfig(hf_processor_path="local/proc"),
        packing_buffer_size=64,
    )
    cfg.model.calculate_per_token_loss = True
    cfg.ddp.average_in_collective = False
    return cfg


@pytest.fixture
def pretrain_cfg(megatron_bridge):
    """Small GPT on Megatron-Bridge's pretraining defaults (mock GPTDataset data, NullTokenizer), seq 4096, global
    batch 16: valid at world size 8."""
    from megatron.bridge.recipes.common import _pretrain_common

    from mbridge_seqpack.recipes.building_blocks import small_gpt_provider

    cfg = _pretrain_common()
    cfg.model = small_gpt_provider(4096)
    cfg.tokenizer.tokenizer_type = "NullTokenizer"
    cfg.tokenizer.tokenizer_model = None
    cfg.tokenizer.vocab_size = 8192
    cfg.dataset.seq_length = 4096
    cfg.train.global_batch_size = 16
    cfg.train.micro_batch_size = 1
    cfg.train.train_iters = 1000
    return cfg


@pytest.fixture
def hybrid_cfg(packed_cfg):
    """The packed base with a small Mamba + attention HybridModelProvider, is_hybrid_model=True as Megatron-Bridge's
    Nemotron-H bridge sets it."""
    from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider

    packed_cfg.model = HybridModelProvider(
        hybrid_layer_pattern="M*M-",
        hidden_size=256,
        num_attention_heads=4,
        mamba_num_heads=8,
        mamba_head_dim=32,
        vocab_size=1024,
        seq_length=4096,
        is_hybrid_model=True,
    )
    return packed_cfg


@pytest.fixture
def qwen3omni_cfg(vlm_cfg):
    """The vlm base (in-batch packed, micro batch 2) with a small Qwen3OmniModelProvider."""
    from megatron.bridge.models.qwen_omni.qwen3_omni_provider import Qwen3OmniModelProvider

    vlm_cfg.model = Qwen3OmniModelProvider(
        num_layers=2, hidden_size=128, num_attention_heads=4, ffn_hidden_size=256, seq_length=4096, vocab_size=1024
    )
    return vlm_cfg
