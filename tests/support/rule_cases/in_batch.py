"""The ``in_batch.*`` rule cases (run by ``tests/rules/test_in_batch.py``)."""

from __future__ import annotations

from tests.support.rule_cases import Case, set_fields

CASES = [
    Case(
        "in_batch.micro_batch_gt_one",
        "vlm_cfg",
        8,
        set_fields(train__micro_batch_size=1),
        {"train.micro_batch_size": 1, "dataset.enable_in_batch_packing": True},
        {"train.micro_batch_size": 2},
    ),
    Case(
        "in_batch.no_cuda_graphs",
        "vlm_cfg",
        8,
        set_fields(model__cuda_graph_impl="transformer_engine", rng__te_rng_tracker=True),
        {"dataset.enable_in_batch_packing": True, "model.cuda_graph_impl": "transformer_engine"},
        {"model.cuda_graph_impl": "none"},
    ),
]
