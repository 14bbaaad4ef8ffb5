"""The rule catalog: registration, ordering and the runner.

A rule is a small function ``(ctx) -> list[Violation] | None``: ``None`` means the rule does not
apply to this config (reported as "n/a"), an empty list means it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from mbridge_seqpack.errors import Violation
from mbridge_seqpack.rules.context import RuleContext

__all__ = ["Rule", "RuleResult", "rule", "all_rules", "evaluate"]

RuleFn = Callable[[RuleContext], "list[Violation] | None"]


@dataclass(frozen=True)
class Rule:
    """A catalog entry: stable id, one-line statement, the checking function."""

    rule_id: str
    summary: str
    fn: RuleFn


@dataclass(frozen=True)
class RuleResult:
    """Outcome of one rule on one config: ``status`` is "ok", "fail" or "n/a"."""

    rule: Rule
    status: str
    violations: tuple[Violation, ...] = ()


_CATALOG: list[Rule] = []


def rule(rule_id: str, summary: str) -> Callable[[RuleFn], RuleFn]:
    """Register ``fn`` under ``rule_id``; ids are unique and keep registration order."""

    def register(fn: RuleFn) -> RuleFn:
        if any(r.rule_id == rule_id for r in _CATALOG):
            raise RuntimeError(f"duplicate rule id {rule_id!r}")
        _CATALOG.append(Rule(rule_id, summary, fn))
        fn.rule_id = rule_id  # type: ignore[attr-defined]
        return fn

    return register


def all_rules() -> list[Rule]:
    """Every registered rule, in catalog order."""
    from mbridge_seqpack.rules import catalog  # noqa: F401  (registers on import)

    return list(_CATALOG)


def evaluate(ctx: RuleContext, rules: Iterable[Rule] | None = None) -> list[RuleResult]:
    """Run every rule on ``ctx``; a rule's own crash is a bug, so it propagates."""
    results = []
    for entry in rules if rules is not None else all_rules():
        found = entry.fn(ctx)
        if found is None:
            results.append(RuleResult(entry, "n/a"))
        elif found:
            results.append(RuleResult(entry, "fail", tuple(found)))
        else:
            results.append(RuleResult(entry, "ok"))
    return results
