"""The ``energon.*`` rule cases (run by ``tests/rules/test_energon.py``)."""

from __future__ import annotations

from tests.support.rule_cases import Case, set_fields

CASES = [
    Case(
        "energon.micro_batch_one",
        "energon_cfg",
        8,
        set_fields(train__micro_batch_size=2, dataset__micro_batch_size=2),
        {"dataset.packing_buffer_size": 64, "train.micro_batch_size": 2},
        {"train.micro_batch_size": 1, "dataset.micro_batch_size": 1},
    ),
    Case(
        "energon.exclusive_in_batch",
        "energon_cfg",
        8,
        set_fields(dataset__defer_in_batch_packing_to_step=True),
        {"dataset.packing_buffer_size": 64, "dataset.defer_in_batch_packing_to_step": True},
        {"dataset.defer_in_batch_packing_to_step": False},
    ),
    Case(
        "energon.no_mtp",
        "energon_cfg",
        8,
        set_fields(model__mtp_num_layers=2),
        {"dataset.packing_buffer_size": 64, "model.mtp_num_layers": 2},
        {"model.mtp_num_layers": None},
        also=("mtp.no_packing",),
    ),
    Case(
        "energon.no_cuda_graphs",
        "energon_cfg",
        8,
        set_fields(model__cuda_graph_impl="transformer_engine", rng__te_rng_tracker=True),
        {"dataset.packing_buffer_size": 64, "model.cuda_graph_impl": "transformer_engine"},
        {"model.cuda_graph_impl": "none"},
    ),
    Case(
        "energon.no_pipeline",
        "energon_cfg",
        8,
        set_fields(model__pipeline_model_parallel_size=2),
        {"dataset.packing_buffer_size": 64, "model.pipeline_model_parallel_size": 2},
        {"model.pipeline_model_parallel_size": 1},
    ),
    Case(
        "energon.per_token_loss",
        "energon_cfg",
        8,
        set_fields(model__calculate_per_token_loss=False, ddp__average_in_collective=True),
        {
            "dataset.packing_buffer_size": 64,
            "model.calculate_per_token_loss": False,
            "ddp.average_in_collective": True,
        },
        {"model.calculate_per_token_loss": True, "ddp.average_in_collective": False},
    ),
]
