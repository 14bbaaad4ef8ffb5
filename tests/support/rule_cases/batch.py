"""The ``batch.*`` rule cases (run by ``tests/rules/test_batch.py``)."""

from __future__ import annotations

from tests.support.rule_cases import Case, set_fields

CASES = [
    Case(
        "batch.world_size_divisible",
        "unpacked_cfg",
        6,
        set_fields(model__tensor_model_parallel_size=4),
        {
            "world_size": 6,
            "model.tensor_model_parallel_size": 4,
            "model.pipeline_model_parallel_size": 1,
            "model.context_parallel_size": 1,
        },
        fix="run on a multiple of 4 GPUs, or change TP/PP/CP so their product divides 6",
        repair=lambda cfg, tmp: None,
        repaired_world=8,
    ),
    Case(
        "batch.global_batch_divisible",
        "unpacked_cfg",
        8,
        set_fields(train__global_batch_size=12),
        {"train.global_batch_size": 12, "train.micro_batch_size": 1, "data_parallel_size": 8},
        {"train.global_batch_size": 16},
    ),
    Case(
        "batch.global_batch_min",
        "unpacked_cfg",
        8,
        set_fields(train__global_batch_size=4),
        {"train.global_batch_size": 4, "train.micro_batch_size": 1, "data_parallel_size": 8},
        {"train.global_batch_size": 8},
    ),
]
