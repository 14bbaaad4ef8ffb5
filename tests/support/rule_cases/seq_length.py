"""The ``seq_length.*`` rule cases (run by ``tests/rules/test_seq_length.py``)."""

from __future__ import annotations

from tests.support.rule_cases import Case, set_fields

CASES = [
    Case(
        "seq_length.model_matches_dataset",
        "unpacked_cfg",
        8,
        set_fields(dataset__seq_length=2048),
        {"model.seq_length": 4096, "dataset.seq_length": 2048},
        {"dataset.seq_length": 4096},
    ),
]
