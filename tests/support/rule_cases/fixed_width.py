"""The ``fixed_width.*`` rule cases (run by ``tests/rules/test_fixed_width.py``)."""

from __future__ import annotations

from tests.support.rule_cases import KW, Case, set_fields

CASES = [
    Case(
        "fixed_width.gpt_sft_pipeline",
        "unpacked_cfg",
        8,
        set_fields(model__pipeline_model_parallel_size=2, dataset__dataloader_type="single"),
        {KW: False, "model.pipeline_model_parallel_size": 2, "dataset.dataloader_type": "single"},
        {KW: True},
    ),
    Case(
        "fixed_width.gpt_sft_experts",
        "unpacked_cfg",
        8,
        set_fields(model__expert_model_parallel_size=2, model__num_moe_experts=4),
        {KW: False, "model.expert_model_parallel_size": 2},
        {KW: True},
    ),
]
