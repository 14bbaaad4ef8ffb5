"""The ``batch.*`` rules: a real ConfigContainer breaking only the rule gives exactly its violation,
and the fix repairs it (the cases: ``tests/support/rule_cases/batch.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from mbridge_seqpack import check
from tests.support.rule_cases import Case, breaks_and_fix_repairs
from tests.support.rule_cases.batch import CASES


@pytest.mark.parametrize("case", CASES, ids=[c.rule_id for c in CASES])
def test_rule_breaks_and_fix_repairs(case: Case, request: pytest.FixtureRequest) -> None:
    breaks_and_fix_repairs(case, request)


def test_world_size_must_be_positive(packed_cfg: Any) -> None:
    with pytest.raises(ValueError, match=r"world_size must be a positive integer, got 0; pass e.g. world_size=8"):
        check(packed_cfg, world_size=0)


def test_world_size_defaults_to_environment(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "32")
    (v,) = check(packed_cfg)  # DP 32 > global batch 16
    assert v.rule_id == "batch.global_batch_min"
    assert v.fields["data_parallel_size"] == 32
