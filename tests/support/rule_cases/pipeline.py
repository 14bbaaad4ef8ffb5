"""The ``pipeline.*`` rule cases (run by ``tests/rules/test_pipeline.py``)."""

from __future__ import annotations

from tests.support.rule_cases import Case, set_fields

CASES = [
    Case(
        "pipeline.variable_shapes_interleaved_pp2",
        "vlm_cfg",
        8,
        set_fields(model__pipeline_model_parallel_size=2, model__virtual_pipeline_model_parallel_size=2),
        {
            "model.pipeline_model_parallel_size": 2,
            "model.virtual_pipeline_model_parallel_size": 2,
            "dataset.enable_in_batch_packing": True,
        },
        {"model.virtual_pipeline_model_parallel_size": None},
    ),
]
