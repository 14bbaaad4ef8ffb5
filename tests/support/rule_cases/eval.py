"""The ``eval.*`` rule cases (run by ``tests/rules/test_eval.py``)."""

from __future__ import annotations

from tests.support.rule_cases import SPECS, Case, set_fields

CASES = [
    Case(
        "eval.packed_split_rows",
        "pack_cfg",
        8,
        set_fields(validation__eval_iters=1),
        lambda cfg, tmp_path: {
            f"{SPECS}.packed_val_data_path": cfg.dataset.offline_packing_specs.packed_val_data_path,
            "validation rows": 2,
            "validation.eval_global_batch_size": 8,
            "dataset.dataloader_type": "batch",
        },
        {"validation.eval_iters": 0},
    ),
]
