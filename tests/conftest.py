"""Shared fixtures: real Megatron-Bridge ConfigContainers built offline.

Megatron-Bridge's import (~40 s on CPU) is paid once per session, on first use.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import warnings

import pytest

#: what the fast tier (``scripts/test.sh --fast``) never imports: Megatron (40-60 s a process) and Transformer Engine
HEAVY = ("megatron", "transformer_engine")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="the fast tier: no test that needs Megatron-Bridge (marked slow, asking for the megatron_bridge "
        "fixture, or importing it: skipped where it does)",
    )


class _NoHeavyImports:
    """In the fast tier, an import of Megatron or Transformer Engine skips the test (or module) that makes it: which
    tests need them is found by running them, never listed by hand."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname.split(".")[0] in HEAVY:
            raise pytest.skip.Exception(
                f"imports {fullname}: not in the fast tier (scripts/test.sh runs it)", allow_module_level=True
            )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped on CPU")
    if config.getoption("--fast"):
        sys.meta_path.insert(0, _NoHeavyImports())
    # remembered digests (digests.py) go to a directory of this run, not the user's ~/.cache
    cache = tempfile.mkdtemp(prefix="mbridge_seqpack_cache_")
    os.environ["MBRIDGE_SEQPACK_CACHE_DIR"] = cache
    config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # scripts/test.sh runs these in a process of their own (-m ray_cluster)
        fixtures = getattr(item, "fixturenames", ())
        if "ray_cluster" in fixtures:
            item.add_marker(pytest.mark.ray_cluster)
        if "megatron_bridge" in fixtures:  # slow from the fixture, never by hand
            item.add_marker(pytest.mark.slow)
    if config.getoption("--fast"):
        fast = [i for i in items if not any(m in i.keywords for m in ("slow", "ray_cluster", "gpu"))]
        config.hook.pytest_deselected(items=[i for i in items if i not in fast])
        items[:] = fast
        return
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


@pytest.fixture(scope="session")
def small_pack(tmp_path_factory, megatron_bridge):
    """A real pack on disk, for the rules that read one: the embedded corpus's training split and its first 94
    validation records (2 rows) packed at 4096 (pad_seq_to_mult 4) by ``pack``."""
    from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
    from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir

    out = tmp_path_factory.mktemp("small_pack") / "pack"
    data = embedded_data_dir()
    inputs = {}
    for split, records in (("training", None), ("validation", 94)):
        inputs[split] = out.parent / f"{split}.jsonl"
        lines = (data / f"{split}.jsonl").read_text().splitlines(keepends=True)[:records]
        inputs[split].write_text("".join(lines))
    pack_jsonl(
        inputs,
        tokenizer=embedded_tokenizer_dir(),
        output_dir=out,
        options=PackOptions(pack_size=4096, pad_seq_to_mult=4),
    )
    return out


@pytest.fixture
def pack_cfg(packed_cfg, small_pack):
    """The packed base reading ``small_pack`` as it was laid out (alignment 4, global batch 8, sampler seed 1234) with
    no evaluation: valid at world size 8."""
    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    specs.packed_train_data_path = str(small_pack / "training_4096.idx.parquet")
    specs.packed_val_data_path = str(small_pack / "validation_4096.idx.parquet")
    specs.packed_metadata_path = str(small_pack / "4096_metadata.jsonl")
    packed_cfg.validation.eval_iters = 0
    packed_cfg.train.global_batch_size, packed_cfg.dataset.seed = 8, 1234  # DP 8 x 1 row, seed 1234: as packed
    return packed_cfg
