"""The ``dataset.*`` rule cases (run by ``tests/rules/test_dataset.py``)."""

from __future__ import annotations

from tests.support.rule_cases import Case, seq_lengths, set_fields

CASES = [
    Case(
        "dataset.create_attention_mask",
        "pretrain_cfg",
        8,
        set_fields(**seq_lengths(32768)),
        {
            "dataset.create_attention_mask": True,
            "dataset.seq_length": 32768,
            "dataset.num_workers": 2,
            "blend datasets": 1,
            "host GiB per node": 144.0,
        },
        {"dataset.create_attention_mask": False},
    ),
]
