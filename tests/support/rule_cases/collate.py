"""The ``collate.*`` rule cases (run by ``tests/rules/test_collate.py``)."""

from __future__ import annotations

from tests.support.rule_cases import Case, seq_lengths, set_fields

CASES = [
    Case(
        "collate.seq_length_alignment",
        "vlm_cfg",
        8,
        set_fields(model__tensor_model_parallel_size=2, model__sequence_parallel=True, **seq_lengths(4095)),
        {
            "dataset.seq_length": 4095,
            "model.context_parallel_size": 1,
            "model.tensor_model_parallel_size": 2,
            "model.sequence_parallel": True,
        },
        {"model.seq_length": 4096, "dataset.seq_length": 4096},
    ),
]
