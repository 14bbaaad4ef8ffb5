"""The rule catalog: every rule module, imported in catalog order, and the runner.

``config.types`` runs first: when a field the rules read has the wrong type, the other rules are reported as
"skipped" rather than run on values they cannot interpret.
"""

from __future__ import annotations

from typing import Iterable

from mbridge_seqpack.rules import (  # each module registers its rules on import
    artifacts,
    attention,
    batch,
    cuda_graphs,
    energon,
    in_batch,
    models,
    offline,
    parallelism,
    precision,
    types,
)
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import Rule, RuleResult, registered, run_rule
from mbridge_seqpack.rules.types import TYPES_RULE_ID

__all__ = ["all_rules", "evaluate"]


#: the catalog order: by module as listed above (whatever imported a module first), then as registered there
MODULE_ORDER = (
    types,
    parallelism,
    attention,
    offline,
    precision,
    in_batch,
    batch,
    cuda_graphs,
    models,
    energon,
    artifacts,
)


def all_rules() -> list[Rule]:
    """Every rule, in catalog order (independent of which rule module happened to be imported first)."""
    rank = {module.__name__: index for index, module in enumerate(MODULE_ORDER)}
    rules = registered()
    return sorted(rules, key=lambda r: (rank.get(r.fn.__module__, len(rank)), rules.index(r)))


def evaluate(ctx: RuleContext, rules: Iterable[Rule] | None = None) -> list[RuleResult]:
    """Run the rules on ``ctx``, ``config.types`` first; a rule's own crash is a bug, so it propagates."""
    chosen = list(rules if rules is not None else all_rules())
    types_entry = next((r for r in all_rules() if r.rule_id == TYPES_RULE_ID), None)
    typed = run_rule(types_entry, ctx) if types_entry is not None else None
    results = []
    for entry in chosen:
        if entry.rule_id == TYPES_RULE_ID:
            results.append(typed)
        elif typed is not None and typed.status == "fail":
            results.append(RuleResult(entry, "skipped"))
        else:
            results.append(run_rule(entry, ctx))
    return results
