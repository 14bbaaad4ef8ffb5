"""The ``tp_comm_overlap.*`` rules: a real ConfigContainer breaking only the rule gives exactly its violation,
and the fix repairs it (the cases: ``tests/support/rule_cases/tp_comm_overlap.py``)."""

from __future__ import annotations

import pytest

from tests.support.rule_cases import Case, breaks_and_fix_repairs
from tests.support.rule_cases.tp_comm_overlap import CASES


@pytest.mark.parametrize("case", CASES, ids=[c.rule_id for c in CASES])
def test_rule_breaks_and_fix_repairs(case: Case, request: pytest.FixtureRequest) -> None:
    breaks_and_fix_repairs(case, request)
