"""In-code Hugging Face configs for the checkpoints Megatron-Bridge 0.6.2's recipes name.

The recipes call ``AutoBridge.from_hf_pretrained(<hub id>)``; without network the zoo answers with
``AutoBridge.from_hf_config(config_for(<hub id>))``, so every provider is built by the real bridge
for that architecture. Sizes that parallel layouts depend on (layers, heads, KV heads, experts) follow
the public model cards; anything not listed takes the ``transformers`` defaults of the model type.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HF_CONFIGS", "config_for"]


def _llama(layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int = 128256, **extra: Any) -> tuple:
    return (
        "llama",
        dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            intermediate_size=ffn,
            vocab_size=vocab,
            **extra,
        ),
    )


def _qwen(kind: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, **extra: Any) -> tuple:
    return (
        kind,
        dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            intermediate_size=ffn,
            vocab_size=151936,
            **extra,
        ),
    )


def _moe(
    kind: str, layers: int, hidden: int, heads: int, kv: int, experts: int, topk: int, moe_ffn: int, **extra: Any
) -> tuple:
    return (
        kind,
        dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            num_experts=experts,
            num_experts_per_tok=topk,
            moe_intermediate_size=moe_ffn,
            **extra,
        ),
    )


LLAMA3_8B = _llama(32, 4096, 32, 8, 14336, rope_theta=500000.0)
LLAMA3_70B = _llama(80, 8192, 64, 8, 28672, rope_theta=500000.0)

HF_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "meta-llama/Llama-3.2-1B": _llama(16, 2048, 32, 8, 8192, tie_word_embeddings=True),
    "meta-llama/Llama-3.2-3B": _llama(28, 3072, 24, 8, 8192, tie_word_embeddings=True),
    "meta-llama/Meta-Llama-3-8B": LLAMA3_8B,
    "meta-llama/Meta-Llama-3.1-8B": LLAMA3_8B,
    "meta-llama/Meta-Llama-3-70B": LLAMA3_70B,
    "meta-llama/Meta-Llama-3.1-70B": LLAMA3_70B,
    "meta-llama/Meta-Llama-3.1-405B": _llama(126, 16384, 128, 8, 53248, rope_theta=500000.0),
    "meta-llama/Llama-2-7b-hf": _llama(32, 4096, 32, 32, 11008, vocab=32000),
    "Qwen/Qwen2-0.5B": _qwen("qwen2", 24, 896, 14, 2, 4864, tie_word_embeddings=True),
    "Qwen/Qwen2-1.5B": _qwen("qwen2", 28, 1536, 12, 2, 8960, tie_word_embeddings=True),
    "Qwen/Qwen2-7B": _qwen("qwen2", 28, 3584, 28, 4, 18944),
    "Qwen/Qwen2-72B": _qwen("qwen2", 80, 8192, 64, 8, 29568),
    "Qwen/Qwen2.5-0.5B": _qwen("qwen2", 24, 896, 14, 2, 4864, tie_word_embeddings=True),
    "Qwen/Qwen2.5-1.5B": _qwen("qwen2", 28, 1536, 12, 2, 8960, tie_word_embeddings=True),
    "Qwen/Qwen2.5-7B": _qwen("qwen2", 28, 3584, 28, 4, 18944),
    "Qwen/Qwen2.5-14B": _qwen("qwen2", 48, 5120, 40, 8, 13824),
    "Qwen/Qwen2.5-32B": _qwen("qwen2", 64, 5120, 40, 8, 27648),
    "Qwen/Qwen2.5-72B": _qwen("qwen2", 80, 8192, 64, 8, 29568),
    "Qwen/Qwen3-0.6B": _qwen("qwen3", 28, 1024, 16, 8, 3072, head_dim=128, tie_word_embeddings=True),
    "Qwen/Qwen3-1.7B": _qwen("qwen3", 28, 2048, 16, 8, 6144, head_dim=128, tie_word_embeddings=True),
    "Qwen/Qwen3-4B": _qwen("qwen3", 36, 2560, 32, 8, 9728, head_dim=128, tie_word_embeddings=True),
    "Qwen/Qwen3-8B": _qwen("qwen3", 36, 4096, 32, 8, 12288, head_dim=128),
    "Qwen/Qwen3-14B": _qwen("qwen3", 40, 5120, 40, 8, 17408, head_dim=128),
    "Qwen/Qwen3-32B": _qwen("qwen3", 64, 5120, 64, 8, 25600, head_dim=128),
    "Qwen/Qwen3-30B-A3B": _moe("qwen3_moe", 48, 2048, 32, 4, 128, 8, 768, head_dim=128),
    "Qwen/Qwen3-235B-A22B": _moe("qwen3_moe", 94, 4096, 64, 4, 128, 8, 1536, head_dim=128),
    "Qwen/Qwen3-Next-80B-A3B-Instruct": ("qwen3_next", {}),
    "google/gemma-2-2b": (
        "gemma2",
        dict(
            num_hidden_layers=26,
            hidden_size=2304,
            num_attention_heads=8,
            num_key_value_heads=4,
            intermediate_size=9216,
            head_dim=256,
        ),
    ),
    "google/gemma-2-9b": (
        "gemma2",
        dict(
            num_hidden_layers=42,
            hidden_size=3584,
            num_attention_heads=16,
            num_key_value_heads=8,
            intermediate_size=14336,
            head_dim=256,
        ),
    ),
    "google/gemma-2-27b": (
        "gemma2",
        dict(
            num_hidden_layers=46,
            hidden_size=4608,
            num_attention_heads=32,
            num_key_value_heads=16,
            intermediate_size=36864,
            head_dim=128,
        ),
    ),
    "google/gemma-3-1b-pt": (
        "gemma3_text",
        dict(
            num_hidden_layers=26,
            hidden_size=1152,
            num_attention_heads=4,
            num_key_value_heads=1,
            intermediate_size=6912,
            head_dim=256,
        ),
    ),
    "zai-org/GLM-4.5": (
        "glm4_moe",
        dict(
            num_hidden_layers=92,
            hidden_size=5120,
            num_attention_heads=96,
            num_key_value_heads=8,
            n_routed_experts=160,
            num_experts_per_tok=8,
            moe_intermediate_size=1536,
            intermediate_size=12288,
            first_k_dense_replace=3,
            partial_rotary_factor=0.5,
            attention_bias=True,
            num_nextn_predict_layers=1,
            head_dim=128,
        ),
    ),
    "zai-org/GLM-4.5-Air": (
        "glm4_moe",
        dict(
            num_hidden_layers=46,
            hidden_size=4096,
            num_attention_heads=96,
            num_key_value_heads=8,
            n_routed_experts=128,
            num_experts_per_tok=8,
            moe_intermediate_size=1408,
            intermediate_size=10944,
            first_k_dense_replace=1,
            partial_rotary_factor=0.5,
            attention_bias=True,
            num_nextn_predict_layers=1,
            head_dim=128,
        ),
    ),
    "openai/gpt-oss-20b": ("gpt_oss", dict(num_hidden_layers=24, num_local_experts=32)),
    "openai/gpt-oss-120b": ("gpt_oss", dict(num_hidden_layers=36, num_local_experts=128)),
    "deepseek-ai/DeepSeek-V3": ("deepseek_v3", {}),
    "deepseek-ai/DeepSeek-V2": ("deepseek_v2", dict(num_hidden_layers=60, n_routed_experts=160)),
    "deepseek-ai/DeepSeek-V2-Lite": (
        "deepseek_v2",
        dict(
            num_hidden_layers=27,
            n_routed_experts=64,
            q_lora_rank=None,
            hidden_size=2048,
            num_attention_heads=16,
            num_key_value_heads=16,
        ),
    ),
    "moonshotai/Moonlight-16B-A3B": (
        "deepseek_v3",
        dict(
            num_hidden_layers=27,
            n_routed_experts=64,
            hidden_size=2048,
            num_attention_heads=16,
            num_key_value_heads=16,
            q_lora_rank=None,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
        ),
    ),
    "moonshotai/Kimi-K2-Instruct": (
        "deepseek_v3",
        dict(n_routed_experts=384, num_attention_heads=64, num_key_value_heads=64, n_group=1, topk_group=1),
    ),
    "allenai/OLMoE-1B-7B-0924": ("olmoe", {}),
}

# Families whose configs come from ``transformers``' defaults for the model type (sizes of the flagship).
_DEFAULTS: dict[str, tuple[str, str]] = {
    "nvidia/Nemotron-H-4B-Base-8K": ("nemotron_h", "NemotronHForCausalLM"),
    "nvidia/Nemotron-H-8B-Base-8K": ("nemotron_h", "NemotronHForCausalLM"),
    "nvidia/Nemotron-H-47B-Base-8K": ("nemotron_h", "NemotronHForCausalLM"),
    "nvidia/Nemotron-H-56B-Base-8K": ("nemotron_h", "NemotronHForCausalLM"),
    "nvidia/NVIDIA-Nemotron-Nano-9B-v2-Base": ("nemotron_h", "NemotronHForCausalLM"),
    "nvidia/NVIDIA-Nemotron-Nano-12B-v2-Base": ("nemotron_h", "NemotronHForCausalLM"),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("nemotron_h", "NemotronHForCausalLM"),
    "nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16": ("nemotron_h", "NemotronHForCausalLM"),
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16": ("nemotron_h", "NemotronHForCausalLM"),
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16": ("nemotron_h", "NemotronHForCausalLM"),
    "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16": ("nemotron_h", "NemotronHForCausalLM"),
    "Qwen/Qwen3.5-0.8B": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
    "Qwen/Qwen3.5-2B": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
    "Qwen/Qwen3.5-4B": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
    "Qwen/Qwen3.5-9B": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
    "Qwen/Qwen3.5-9B-Base": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
    "Qwen/Qwen3.5-27B": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
    "Qwen/Qwen3.5-35B-A3B": ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"),
    "Qwen/Qwen3.5-35B-A3B-Base": ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"),
    "Qwen/Qwen3.5-122B-A10B": ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"),
    "Qwen/Qwen3.5-397B-A17B": ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"),
    "Qwen/Qwen3-VL-8B-Instruct": ("qwen3_vl", "Qwen3VLForConditionalGeneration"),
    "Qwen/Qwen3-VL-30B-A3B-Instruct": ("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration"),
    "Qwen/Qwen3-VL-235B-A22B-Instruct": ("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration"),
    "Qwen/Qwen2.5-VL-3B-Instruct": ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
    "Qwen/Qwen2.5-VL-7B-Instruct": ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
    "Qwen/Qwen2.5-VL-32B-Instruct": ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
    "Qwen/Qwen2.5-VL-72B-Instruct": ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
    "Qwen/Qwen2-Audio-7B-Instruct": ("qwen2_audio", "Qwen2AudioForConditionalGeneration"),
    "Qwen/Qwen3-Omni-30B-A3B-Instruct": ("qwen3_omni_moe", "Qwen3OmniMoeForConditionalGeneration"),
    "google/gemma-3-4b-it": ("gemma3", "Gemma3ForConditionalGeneration"),
    "google/gemma-3-12b-it": ("gemma3", "Gemma3ForConditionalGeneration"),
    "google/gemma-3-27b-it": ("gemma3", "Gemma3ForConditionalGeneration"),
    "google/gemma-4-E4B-it": ("gemma4", "Gemma4ForConditionalGeneration"),
    "google/gemma-4-26B-A4B-it": ("gemma4", "Gemma4ForConditionalGeneration"),
    "zai-org/GLM-4.5V": ("glm4v_moe", "Glm4vMoeForConditionalGeneration"),
    "zai-org/GLM-5.2": ("glm_moe_dsa", "GlmMoeDsaForCausalLM"),
    "deepseek-ai/DeepSeek-V4-Flash": ("deepseek_v4", "DeepseekV4ForCausalLM"),
    "deepseek-ai/DeepSeek-V4-Pro": ("deepseek_v4", "DeepseekV4ForCausalLM"),
    "LGAI-EXAONE/EXAONE-4.0-1.2B": ("exaone4", "Exaone4ForCausalLM"),
    "LGAI-EXAONE/EXAONE-4.5-33B": ("exaone4_5", "Exaone4_5_ForConditionalGeneration"),
    "LGAI-EXAONE/K-EXAONE-236B-A23B": ("exaone_moe", "ExaoneMoeForCausalLM"),
    "mistralai/Ministral-3-3B-Instruct-2512": ("mistral3", "Mistral3ForConditionalGeneration"),
    "mistralai/Ministral-3-8B-Instruct-2512": ("mistral3", "Mistral3ForConditionalGeneration"),
    "mistralai/Ministral-3-14B-Instruct-2512": ("mistral3", "Mistral3ForConditionalGeneration"),
}
HF_CONFIGS.update({hub: (kind, {}) for hub, (kind, _) in _DEFAULTS.items()})
_YARN = {
    "rope_type": "yarn",
    "factor": 16.0,
    "original_max_position_embeddings": 65536,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
for _hub in ("deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Pro"):
    HF_CONFIGS[_hub] = ("deepseek_v4", {"rope_scaling": dict(_YARN)})
# transformers' default thinker has 28 heads and no head_dim (head dim 2048 // 28 = 73, which neither cuDNN nor
# flash-attn takes); the released model's attention is 32 heads of 128 (4 key/value heads)
HF_CONFIGS["Qwen/Qwen3-Omni-30B-A3B-Instruct"] = (
    "qwen3_omni_moe",
    {"thinker_config": {"text_config": {"num_attention_heads": 32, "head_dim": 128}}},
)


def config_for(hub_id: str) -> Any:
    """A ``transformers`` config for ``hub_id`` (KeyError when the zoo has none)."""
    from transformers import AutoConfig

    model_type, overrides = HF_CONFIGS[hub_id]
    config = AutoConfig.for_model(model_type, **overrides)
    arch = (
        _DEFAULTS[hub_id][1]
        if hub_id in _DEFAULTS
        else _ARCHITECTURES.get(model_type, type(config).__name__.replace("Config", "ForCausalLM"))
    )
    config.architectures = [arch]
    config.name_or_path = hub_id
    return config


_ARCHITECTURES = {"gemma3_text": "Gemma3ForCausalLM", "gpt_oss": "GptOssForCausalLM"}
