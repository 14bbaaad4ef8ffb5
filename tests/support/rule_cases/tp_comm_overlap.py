"""The ``tp_comm_overlap.*`` rule cases (run by ``tests/rules/test_tp_comm_overlap.py``)."""

from __future__ import annotations

from tests.support.rule_cases import KW, TP2_SP, Case, set_fields

CASES = [
    Case(
        "tp_comm_overlap.token_count",
        "packed_cfg",
        8,
        set_fields(**TP2_SP, model__tp_comm_overlap=True),
        {
            "model.tp_comm_overlap": True,
            "model.seq_length": 4096,
            "train.micro_batch_size": 1,
            "model.context_parallel_size": 1,
        },
        {KW: True},
    ),
    Case(
        "tp_comm_overlap.token_count",
        "pretrain_cfg",
        8,
        set_fields(
            **TP2_SP,
            model__tp_comm_overlap=True,
            validation__eval_micro_batch_size=2,
            validation__eval_global_batch_size=32,
        ),
        {
            "model.tp_comm_overlap": True,
            "model.seq_length": 4096,
            "train.micro_batch_size": 1,
            "validation.eval_micro_batch_size": 2,
        },
        {"validation.eval_micro_batch_size": 1},
    ),
]
