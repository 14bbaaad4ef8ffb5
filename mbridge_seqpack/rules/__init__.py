"""The packing / long-context rule catalog and ``check()``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mbridge_seqpack.errors import Violation
from mbridge_seqpack.rules.catalog import all_rules, evaluate
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import Rule, RuleResult

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["check", "all_rules", "evaluate", "Rule", "RuleResult", "RuleContext"]


def check(cfg: ConfigContainer, world_size: int | None = None) -> list[Violation]:
    """Run every rule on ``cfg`` (no Megatron-Bridge validation) and return the violations found."""
    ctx = RuleContext.build(cfg, world_size)
    return [v for result in evaluate(ctx) for v in result.violations]
