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
    comm,
    cuda_graphs,
    energon,
    equivalence,
    families,
    in_batch,
    layers,
    lifecycle,
    models,
    moe,
    offline,
    parallelism,
    precision,
    prep,
    pretraining,
    process_groups,
    rope,
    schedules,
    sft_kwargs,
    ssm,
    types,
    values,
)
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import Rule, RuleResult, registered, run_rule
from mbridge_seqpack.rules.types import TYPES_RULE_ID

__all__ = ["all_rules", "evaluate", "render_markdown"]


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
    pretraining,
    comm,
    families,
    equivalence,
    lifecycle,
    values,
    prep,
    ssm,
    rope,
    moe,
    schedules,
    sft_kwargs,
    layers,
    process_groups,
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


def render_markdown() -> str:
    """``docs/rules.md``: the catalog as data says it (id, severity, statement, module, evidence)."""
    rules = all_rules()
    errors = sum(r.severity == "error" for r in rules)
    lines = [
        "# The rule catalog",
        "",
        "Generated from the registered rules (`python -m mbridge_seqpack.rules.catalog > docs/rules.md`);",
        "`tests/test_rules.py` checks it is current. A rule is an `error` only where Megatron-Bridge 0.6.2 /",
        "Megatron-Core 0.19.2 / Transformer Engine code fails for the config (crash, assert, or silently wrong",
        "training), with the file and function named in its evidence; with only documentation or waste behind it,",
        "it is an `advisory` (shown by `check`, warned by the hook, raised only with `install(strict=True)`).",
        "Each violation carries its own fix (a Python statement, the assignments as data, and Hydra-style",
        "overrides); `mbridge-seqpack check --fix` resolves them jointly.",
        "",
        f"{len(rules)} rules: {errors} errors, {len(rules) - errors} advisories, in the order they run.",
        "",
        "| id | severity | rule | module |",
        "|---|---|---|---|",
    ]
    for r in rules:
        module = r.fn.__module__.rsplit(".", 1)[-1]
        lines.append(f"| `{r.rule_id}` | {r.severity} | {r.summary.replace('|', '/')} | `rules/{module}.py` |")
    lines += ["", "## Evidence", ""]
    for r in rules:
        lines += [f"- **`{r.rule_id}`** ({r.severity}): {r.evidence}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
