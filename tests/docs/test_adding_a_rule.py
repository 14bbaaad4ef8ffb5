"""docs/adding-a-rule.md's template, run: registered in a module of its prefix's name, it gives the three verdicts
on real configs, and its fix pastes back as an override that clears it."""

from __future__ import annotations

import copy
import re
import sys
import types
from pathlib import Path
from typing import Any, Iterator

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "adding-a-rule.md"


def _template() -> str:
    (block,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    return "\n".join(line.removeprefix("   ") for line in block.splitlines())


@pytest.fixture
def demo_rule() -> Iterator[Any]:
    """The template exec'd as ``mbridge_seqpack.rules.demo``; the catalog is put back afterwards."""
    from mbridge_seqpack.rules import registry

    before = list(registry._CATALOG)
    module = types.ModuleType("mbridge_seqpack.rules.demo")
    sys.modules[module.__name__] = module
    try:
        exec(compile(_template(), str(DOC), "exec"), module.__dict__)
        (entry,) = [r for r in registry.registered() if r.rule_id == "demo.pack_fits_eight_rows"]
        yield entry
    finally:
        registry._CATALOG[:] = before
        sys.modules.pop(module.__name__, None)


def test_the_template_outside_its_family_module_is_refused() -> None:
    module = types.ModuleType("mbridge_seqpack.rules.elsewhere")
    with pytest.raises(RuntimeError, match=r"lives in the family module its id's prefix names \(rules/demo.py\)"):
        exec(compile(_template(), str(DOC), "exec"), module.__dict__)


def test_the_template_runs_and_its_fix_clears_it(demo_rule: Any, packed_cfg: Any, unpacked_cfg: Any) -> None:
    from mbridge_seqpack.overrides import apply_overrides
    from mbridge_seqpack.rules.context import RuleContext
    from mbridge_seqpack.rules.registry import run_rule

    assert run_rule(demo_rule, RuleContext.build(unpacked_cfg, 8)).status == "n/a"
    assert run_rule(demo_rule, RuleContext.build(packed_cfg, 8)).status == "ok"
    small = copy.deepcopy(packed_cfg)
    small.dataset.offline_packing_specs.packed_sequence_size = 4
    result = run_rule(demo_rule, RuleContext.build(small, 8))
    (found,) = result.violations
    assert (result.status, found.rule_id, found.fields) == (
        "fail",
        "demo.pack_fits_eight_rows",
        {"dataset.offline_packing_specs.packed_sequence_size": 4},
    )
    assert found.overrides == ["dataset.offline_packing_specs.packed_sequence_size=8"]
    fixed = apply_overrides(copy.deepcopy(small), found.overrides)
    assert run_rule(demo_rule, RuleContext.build(fixed, 8)).status == "ok"
