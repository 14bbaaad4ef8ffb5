"""The rule catalog: every family module (one per rule-id prefix), in catalog order, and the runner.

``config.types`` runs first: when a field the rules read has the wrong type, the other rules are reported as
"skipped" rather than run on values they cannot interpret.
"""

from __future__ import annotations

from typing import Iterable

from mbridge_seqpack.rules import (  # noqa: F401  one family module per rule-id prefix, each registers its rules on import
    artifact,
    attention,
    batch,
    collate,
    config,
    cp,
    cuda_graphs,
    dataset,
    determinism,
    energon,
    equivalence,
    eval,
    fixed_width,
    fp8,
    gdn,
    gpt_sft,
    in_batch,
    launch,
    mamba,
    model,
    moe,
    mtp,
    offline,
    packing,
    pipeline,
    pretraining,
    process_groups,
    resume,
    rope,
    seq_length,
    te,
    tp_comm_overlap,
    vlm,
)
from mbridge_seqpack.rules.config import TYPES_RULE_ID
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.field_types import FieldType
from mbridge_seqpack.rules.registry import Rule, RuleResult, checked_field_types, registered, run_rule

__all__ = ["all_rules", "evaluate", "render_markdown", "FIELD_TYPES"]

#: the type each field the rules read must hold, derived from the rules' ``reads`` (what ``config.types`` checks)
FIELD_TYPES: dict[str, FieldType] = checked_field_types()


def family(entry: Rule) -> str:
    """The rule's family: its id's prefix, which is also the name of the module that registers it (the registry
    refuses any other)."""
    return entry.rule_id.partition(".")[0]


def all_rules() -> list[Rule]:
    """Every rule, in catalog order: ``config`` first (its ``config.types`` gates every other rule), then by family
    name, then as registered in the family's module (independent of which module happened to be imported first)."""
    rules = registered()
    return sorted(rules, key=lambda r: (family(r) != "config", family(r), rules.index(r)))


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
        "Generated from the registered rules (`python scripts/generate.py`; its `--check`, which the tests run,",
        "keeps it current). A rule is an `error` only where Megatron-Bridge 0.6.2 /",
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
