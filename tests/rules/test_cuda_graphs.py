"""The ``cuda_graphs.*`` rules: a real ConfigContainer breaking only the rule gives exactly its violation,
and the fix repairs it (the cases: ``tests/support/rule_cases/cuda_graphs.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from mbridge_seqpack import check
from tests.support.rule_cases import SPECS, Case, breaks_and_fix_repairs
from tests.support.rule_cases.cuda_graphs import CASES, metadata_breaks, metadata_repair


@pytest.mark.parametrize("case", CASES, ids=[c.rule_id for c in CASES])
def test_rule_breaks_and_fix_repairs(case: Case, request: pytest.FixtureRequest) -> None:
    breaks_and_fix_repairs(case, request)


def test_metadata_rule_names_paths_and_repairs(packed_cfg: Any, tmp_path: Any) -> None:
    metadata_breaks(packed_cfg, tmp_path)
    (v,) = check(packed_cfg, world_size=8)
    assert v.rule_id == "cuda_graphs.pad_cu_seqlens_needs_metadata"
    assert v.fields == {
        f"{SPECS}.packed_metadata_path": None,
        f"{SPECS}.packed_train_data_path": str(tmp_path / "training_4096.idx.parquet"),
    }
    assert v.fix == (
        f"cfg.{SPECS}.packed_metadata_path = '<metadata JSON written with the pack, e.g. "
        f"{tmp_path / '4096_metadata.jsonl'}>'"
    )
    packed_cfg.dataset.offline_packing_specs.packed_metadata_path = str(tmp_path / "missing.json")
    (v,) = check(packed_cfg, world_size=8)
    assert v.rule.endswith("the file does not exist")
    metadata_repair(packed_cfg, tmp_path)
    assert check(packed_cfg, world_size=8) == []
