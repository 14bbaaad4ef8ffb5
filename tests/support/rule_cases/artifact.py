"""The ``artifact.*`` rule cases (run by ``tests/rules/test_artifact.py``)."""

from __future__ import annotations

from tests.support.rule_cases import SPECS, Case, set_fields

CASES = [
    Case(
        "artifact.fingerprint_mismatch",
        "pack_cfg",
        8,
        set_fields(dataset__offline_packing_specs__pad_seq_to_mult=1),
        lambda cfg, tmp_path: {
            f"{SPECS}.packed_train_data_path": cfg.dataset.offline_packing_specs.packed_train_data_path,
            "artifact pad_seq_to_mult": 4,
            f"{SPECS}.pad_seq_to_mult": 1,
        },
        {f"{SPECS}.pad_seq_to_mult": 4},
        also=("artifact.fingerprint_mismatch",),  # the validation split's file, the same way
    ),
    Case(
        "artifact.balance_layout",
        "pack_cfg",
        8,
        set_fields(dataset__seed=5678),
        {"pack sampler_seed": 1234, "dataset.seed": 5678},
        {"dataset.seed": 1234},
    ),
]
