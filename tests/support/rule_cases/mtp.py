"""The ``mtp.*`` rule cases (run by ``tests/rules/test_mtp.py``)."""

from __future__ import annotations

from tests.support.rule_cases import CP2_LOSS, Case, set_fields

CASES = [
    Case(
        "mtp.packed_context_parallel",
        "packed_cfg",
        8,
        set_fields(**CP2_LOSS, dataset__offline_packing_specs__pad_seq_to_mult=4, model__mtp_num_layers=1),
        {"model.mtp_num_layers": 1, "model.context_parallel_size": 2, "dataset.enable_offline_packing": True},
        {"model.mtp_num_layers": None},
        also=("mtp.no_packing",),
    ),
    Case(
        "mtp.no_packing",
        "packed_cfg",
        8,
        set_fields(model__mtp_num_layers=1),
        {"model.mtp_num_layers": 1, "dataset.enable_offline_packing": True},
        {"model.mtp_num_layers": None},
        fix="cfg.model.mtp_num_layers = None (or turn packing off: cfg.dataset.enable_offline_packing = False)",
    ),
]
