"""The packing / long-context rule catalog: the rules, their context and their runner.

``check()``, which reports on a config, is in ``report/``."""

from __future__ import annotations

from mbridge_seqpack.rules.catalog import all_rules, evaluate
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import Rule, RuleResult

__all__ = ["all_rules", "evaluate", "Rule", "RuleResult", "RuleContext"]
