"""The public-report corpus (``tests/real_reports.py``): every traced failure is rejected by exactly the rules named,
every near-miss is accepted, nothing crashes, and ``docs/real-reports.md`` is generated from it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack import check
from tests.real_reports import REPORTS, Report, render_markdown

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_docs_page_is_current() -> None:
    assert (ROOT / "docs" / "real-reports.md").read_text() == render_markdown()


@pytest.mark.parametrize(
    "report", REPORTS, ids=[f"{i:02d}-{'fails' if r.expected else 'works'}" for i, r in enumerate(REPORTS)]
)
def test_report(report: Report, request: pytest.FixtureRequest) -> None:
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    base = request.getfixturevalue("vlm_cfg" if report.base == "vlm" else "packed_cfg")
    cfg: Any = process_config_with_overrides(copy.deepcopy(base), cli_overrides=list(report.overrides))
    errors = sorted({v.rule_id for v in check(cfg, world_size=report.world) if v.severity == "error"})
    assert errors == sorted(report.expected), report.title
