"""The ``packing.*`` rule cases (run by ``tests/rules/test_packing.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.support.rule_cases import Case, set_fields


def _both_packing_flags(cfg: Any, tmp_path: Any) -> None:
    """A custom SFT dataset config that carries both packing switches, both on."""
    from megatron.bridge.data.builders import GPTSFTDatasetConfig

    @dataclass(kw_only=True)
    class HybridSFT(GPTSFTDatasetConfig):
        enable_in_batch_packing: bool = False

    old = cfg.dataset
    cfg.dataset = HybridSFT(
        seq_length=4096,
        dataset_root=old.dataset_root,
        enable_offline_packing=True,
        offline_packing_specs=old.offline_packing_specs,
        enable_in_batch_packing=True,
    )


CASES = [
    Case(
        "packing.modes_exclusive",
        "packed_cfg",
        8,
        _both_packing_flags,
        {"dataset.enable_offline_packing": True, "dataset.enable_in_batch_packing": True},
        {"dataset.enable_in_batch_packing": False},
        also=("in_batch.micro_batch_gt_one",),
        repair=set_fields(dataset__enable_in_batch_packing=False),
    ),
]
