"""The ``fp8.*`` rule cases (run by ``tests/rules/test_fp8.py``)."""

from __future__ import annotations

from tests.support.rule_cases import KW, SPECS, TP2_SP, Case, set_fields

CASES = [
    Case(
        "fp8.packed_tokens_per_rank",
        "packed_cfg",
        8,
        set_fields(
            mixed_precision="bf16_with_mxfp8_mixed", model__tensor_model_parallel_size=2, model__sequence_parallel=True
        ),
        {
            f"{SPECS}.packed_sequence_size": 4096,
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 16,
            KW: False,
            "model.context_parallel_size": 1,
            "model.tensor_model_parallel_size": 2,
            "model.sequence_parallel": True,
        },
        {"dataset.dataset_kwargs.pad_seq_length_to_mult": 64},
    ),
    Case(
        "fp8.packed_tokens_per_rank",
        "packed_cfg",
        8,
        set_fields(mixed_precision="bf16_with_nvfp4_mixed", **TP2_SP),
        {
            f"{SPECS}.packed_sequence_size": 4096,
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 16,
            KW: False,
            "model.context_parallel_size": 1,
            "model.tensor_model_parallel_size": 2,
            "model.sequence_parallel": True,
        },
        {"dataset.dataset_kwargs.pad_seq_length_to_mult": 32},
    ),
]
