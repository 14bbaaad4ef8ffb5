"""The registry (``rules/registry.py``): a rule is refused outside the module its id's prefix names."""

from __future__ import annotations

from typing import Any

import pytest


def test_a_rule_outside_its_family_module_is_refused() -> None:
    from mbridge_seqpack.errors import ERROR
    from mbridge_seqpack.rules.registry import registered, rule

    def misplaced(ctx: Any) -> None:
        return None

    misplaced.__module__ = "mbridge_seqpack.rules.offline"
    before = registered()
    with pytest.raises(
        RuntimeError, match=r"'cp.misplaced' is registered in mbridge_seqpack.rules.offline.*rules/cp.py"
    ):
        rule("cp.misplaced", "A rule in the wrong module.", severity=ERROR, evidence="none needed")(misplaced)
    assert registered() == before
