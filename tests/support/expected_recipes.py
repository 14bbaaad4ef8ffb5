"""The recipes the package ships, by name (the recipe and packaging tests compare against it)."""

from __future__ import annotations

EXPECTED_RECIPES = [
    "llama31_8b_sft_128k_cp8",
    "llama31_8b_sft_32k_cp2",
    "llama31_8b_sft_64k_cp4",
    "llama3_8b_sft_packed_8k",
    "llama3_8b_sft_packed_8k_cuda_graphs",
    "qwen25_vl_3b_sft_in_batch_4k",
    "qwen3_8b_sft_16k_cp2",
    "small_gpt_smoke_4k",
]
