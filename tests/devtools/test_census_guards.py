"""Issue #38 item 4: a mechanism the census calls guarded is reported by one of its guarding rules. Each guarded
mechanism of devtools/census/silent.py has a config (tests/support/census_cases.py) under which the real rules run
and at least one rule the census names for it returns a violation; a guard that returns early for the mechanism's
config (as moe.router_counts_padding does for packed rows) fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from devtools.census.silent import Mechanism, all_mechanisms
from mbridge_seqpack.config_paths import set_path
from tests.support.census_cases import CASES, CensusCase

ROOT = Path(__file__).resolve().parents[2]
GUARDED = {m.name: m for m in all_mechanisms() if m.verdict.cls == "guarded"}


def _reported(case: CensusCase, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The rule ids that return a violation for the case's config (the real catalog, at the case's world size)."""
    from mbridge_seqpack import check

    cfg = request.getfixturevalue(case.base)
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    for path, value in case.values.items():
        set_path(cfg, path, value)
    if case.change is not None:
        case.change(cfg)
    return {v.rule_id for v in check(cfg, world_size=case.world)}


def uncaught(mechanism: Mechanism, reported: set[str]) -> str | None:
    """Why the census's guard claim fails for this config, or None: one of its guarding rules reported it."""
    if set(mechanism.verdict.rules) & reported:
        return None
    return (
        f"{mechanism.name!r} is listed as guarded by {', '.join(mechanism.verdict.rules)}, but none of them reports "
        f"its config (reported: {', '.join(sorted(reported)) or 'nothing'})"
    )


def test_every_guarded_mechanism_has_a_case() -> None:
    assert sorted(CASES) == sorted(GUARDED)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_guarding_rule_reports_the_mechanism(
    name: str, megatron_bridge: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    mechanism, case = GUARDED[name], CASES[name]
    if case.proven_by:  # the config needs files: the named test builds it and runs the guarding rule on it
        file, test = case.proven_by.split("::")
        text = (ROOT / file).read_text()
        body = re.search(rf"^def {test}\(.*?(?=^def |\Z)", text, re.S | re.M)
        assert body is not None, case.proven_by
        assert any(f'"{rule}"' in body.group(0) for rule in mechanism.verdict.rules), case.proven_by
        return
    assert uncaught(mechanism, _reported(case, request, monkeypatch)) is None


def test_a_guard_that_returns_early_fails(
    megatron_bridge: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The census before the fix: the packed-row router mechanism guarded by moe.router_counts_padding alone, a rule
    that returns early whenever packing is on (rules/moe.py). The same check fails it."""
    import dataclasses

    mechanism = GUARDED["MoE router counts padding tokens"]
    before = dataclasses.replace(
        mechanism, verdict=dataclasses.replace(mechanism.verdict, rules=("moe.router_counts_padding",))
    )
    reported = _reported(CASES[mechanism.name], request, monkeypatch)
    assert "equivalence.router_padding" in reported and "moe.router_counts_padding" not in reported
    assert uncaught(mechanism, reported) is None
    assert uncaught(before, reported) == (
        "'MoE router counts padding tokens' is listed as guarded by moe.router_counts_padding, but none of them "
        "reports its config (reported: equivalence.router_padding)"
    )
