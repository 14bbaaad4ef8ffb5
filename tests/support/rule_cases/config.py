"""The ``config.*`` rule cases (run by ``tests/rules/test_config.py``)."""

from __future__ import annotations

from tests.support.rule_cases import Case, set_fields

CASES = [
    Case(
        "config.types",
        "packed_cfg",
        8,
        set_fields(model__tensor_model_parallel_size="1"),
        {"model.tensor_model_parallel_size": "1", "type": "str"},
        {"model.tensor_model_parallel_size": 1},
    ),
]
