"""Building blocks for packaged recipes: offline model providers and an offline SFT base config.

Megatron-Bridge's shipped recipes fetch model configs from the Hugging Face hub. These builders
use the real bridges on in-code ``transformers`` configs (``AutoBridge.from_hf_config``) or explicit
``GPTModelProvider`` sizes, so every recipe builds with no network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

__all__ = [
    "RecipeInfo",
    "recipe",
    "provider_from_hf_config",
    "llama3_8b_provider",
    "llama31_8b_provider",
    "qwen3_8b_provider",
    "small_gpt_provider",
    "sft_base",
    "vlm_sft_base",
    "qwen25_vl_3b_provider",
    "embedded_data_dir",
    "embedded_tokenizer_dir",
]

_DATA = Path(__file__).resolve().parents[1] / "data"  # mbridge_seqpack/data


def embedded_data_dir() -> Path:
    """The small SFT corpus shipped with the package (training/validation JSONL)."""
    return _DATA / "sft_sample"


def embedded_tokenizer_dir() -> Path:
    """The offline BPE tokenizer shipped with the package (``tokenizer.json``)."""
    return _DATA / "tokenizer"


@dataclass(frozen=True)
class RecipeInfo:
    """What the recipe table shows: name, what it trains, and the world size it is laid out for.

    ``context_window``: the longest sequence the pretrained model was trained for (its HF
    ``max_position_embeddings``, which Megatron-Bridge's bridges map to the provider's ``seq_length``);
    ``None`` for a model trained from scratch. ``plan`` marks longer rows.
    """

    name: str
    model: str
    mode: str
    world_size: int
    description: str
    context_window: int | None = None


def recipe(
    name: str, *, model: str, mode: str, world_size: int, description: str, context_window: int | None = None
) -> Callable:
    """Mark a function returning a ConfigContainer as a packaged recipe."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        info = RecipeInfo(name, model, mode, world_size, description, context_window)
        fn.seqpack_recipe = info  # type: ignore[attr-defined]
        return fn

    return mark


def provider_from_hf_config(hf_config: Any) -> Any:
    """Megatron provider from an in-code HF config through the registered bridge (no weights, no hub).

    Nothing is recorded on the provider beyond what the bridge sets: model-family rules read the
    provider's class and dataclass fields, which survive ``to_yaml``/``from_yaml``.
    """
    from megatron.bridge import AutoBridge

    return AutoBridge.from_hf_config(hf_config).to_megatron_provider(load_weights=False)


def _llama_config(rope_scaling: dict[str, Any] | None, max_positions: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        hidden_act="silu",
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=rope_scaling,
        tie_word_embeddings=False,
        dtype="bfloat16",
        bos_token_id=128000,
        eos_token_id=128001,
    )


LLAMA3_CONTEXT = 8192
LLAMA31_CONTEXT = 131072
QWEN3_CONTEXT = 40960
QWEN25_VL_CONTEXT = 128000


def llama3_8b_provider() -> Any:
    """Llama-3-8B sizes (32 layers, 4096 hidden, GQA 32/8, vocab 128256, RoPE base 5e5)."""
    return provider_from_hf_config(_llama_config(None, LLAMA3_CONTEXT))


def llama31_8b_provider() -> Any:
    """Llama-3.1-8B: Llama-3 sizes plus the llama3 RoPE scaling for 128k context."""
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    return provider_from_hf_config(_llama_config(scaling, LLAMA31_CONTEXT))


def qwen3_8b_provider() -> Any:
    """Qwen3-8B sizes (36 layers, 4096 hidden, FFN 12288, GQA 32/8, QK-norm, RoPE base 1e6)."""
    from transformers import Qwen3Config

    return provider_from_hf_config(
        Qwen3Config(
            architectures=["Qwen3ForCausalLM"],
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=QWEN3_CONTEXT,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            dtype="bfloat16",
        )
    )


def small_gpt_provider(seq_length: int = 4096, vocab_size: int = 8192) -> Any:
    """A ~100M-parameter GPT (12 layers, 768 hidden, RoPE, RMSNorm, SwiGLU) for single-GPU smoke runs."""
    import torch
    from megatron.bridge.models import GPTModelProvider

    return GPTModelProvider(
        num_layers=12,
        hidden_size=768,
        ffn_hidden_size=3072,
        num_attention_heads=12,
        num_query_groups=12,
        kv_channels=64,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        position_embedding_type="rope",
        add_bias_linear=False,
        share_embeddings_and_output_weights=True,
        vocab_size=vocab_size,
        seq_length=seq_length,
        bf16=True,
        params_dtype=torch.bfloat16,
    )


def sft_base(
    model: Any,
    *,
    seq_length: int,
    global_batch_size: int,
    micro_batch_size: int = 1,
    dataset_root: str | Path | None = None,
    tokenizer_model: str | Path | None = None,
    train_iters: int = 1000,
) -> Any:
    """Megatron-Bridge's SFT defaults with a local JSONL dataset and a local tokenizer (offline)."""
    from megatron.bridge.data.builders import GPTSFTDatasetConfig
    from megatron.bridge.recipes.common import _sft_common

    cfg = _sft_common()
    model.seq_length = seq_length
    cfg.model = model
    cfg.dataset = GPTSFTDatasetConfig(
        seq_length=seq_length,
        dataset_root=str(dataset_root or embedded_data_dir()),
        do_validation=True,
        do_test=False,
        dataset_kwargs={},
        seed=5678,
        dataloader_type="batch",
        num_workers=1,
    )
    cfg.tokenizer.tokenizer_model = str(tokenizer_model or embedded_tokenizer_dir())
    cfg.train.global_batch_size = global_batch_size
    cfg.train.micro_batch_size = micro_batch_size
    cfg.train.train_iters = train_iters
    return cfg


def qwen25_vl_3b_provider() -> Any:
    """Qwen2.5-VL-3B sizes (36-layer 2048-hidden LM with mRoPE, 32-block ViT) via the registered bridge."""
    from transformers import Qwen2_5_VLConfig

    text = dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        max_position_embeddings=QWEN25_VL_CONTEXT,
        rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
        tie_word_embeddings=True,
    )
    vision = dict(
        depth=32,
        hidden_size=1280,
        intermediate_size=3420,
        num_heads=16,
        out_hidden_size=2048,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=112,
        fullatt_block_indexes=[7, 15, 23, 31],
    )
    return provider_from_hf_config(
        Qwen2_5_VLConfig(
            architectures=["Qwen2_5_VLForConditionalGeneration"],
            text_config=text,
            vision_config=vision,
            **{
                k: text[k]
                for k in (
                    "vocab_size",
                    "hidden_size",
                    "num_hidden_layers",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "intermediate_size",
                    "tie_word_embeddings",
                )
            },
        )
    )


def vlm_sft_base(
    model: Any, *, seq_length: int, global_batch_size: int, micro_batch_size: int, hf_processor_path: str
) -> Any:
    """Megatron-Bridge's VLM SFT defaults with its synthetic (offline) conversation dataset."""
    from megatron.bridge.data.builders.mock_vlm_sft import MockVLMSFTDatasetConfig
    from megatron.bridge.recipes.common import _sft_common_vlm

    cfg = _sft_common_vlm()
    model.seq_length = seq_length
    cfg.model = model
    cfg.dataset = MockVLMSFTDatasetConfig(seq_length=seq_length, hf_processor_path=hf_processor_path)
    cfg.train.global_batch_size = global_batch_size
    cfg.train.micro_batch_size = micro_batch_size
    return cfg
