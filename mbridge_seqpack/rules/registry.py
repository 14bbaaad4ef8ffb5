"""Rule registration: the ``@rule`` decorator, ``Rule`` and ``RuleResult`` (the catalog and runner are in
``catalog.py``, which imports every rule module).

A rule is a small function ``(ctx) -> list[Violation] | None``: ``None`` means the rule does not
apply to this config (reported as "n/a"), an empty list means it holds.

Every rule carries its severity and its evidence: ``error`` only where Megatron-Bridge / Megatron-Core
code fails for the pinned versions (crash, assert, or silently wrong training; ``evidence`` names the
file and function), ``advisory`` where only documentation or waste speaks against the config.
The ``config.types`` rule runs first: when a field the rules read has the wrong type, the other rules
are reported as "skipped" rather than run on values they cannot interpret.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, Literal

from mbridge_seqpack.errors import ERROR, SEVERITIES, UNDETERMINED, Severity, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.field_types import UNCHECKED, FieldType

__all__ = ["Rule", "RuleResult", "rule", "registered", "run_rule", "checked_field_types"]

RuleFn = Callable[[RuleContext], "list[Violation] | None"]
Status = Literal["ok", "fail", "n/a", "skipped"]


@dataclass(frozen=True)
class Rule:
    """A catalog entry: stable id, one-line statement, the checking function, severity and evidence, and the config
    fields the rule reads with the type each must hold (``reads``; a test records the reads and holds it complete)."""

    rule_id: str
    summary: str
    fn: RuleFn
    severity: Severity
    evidence: str
    reads: Mapping[str, FieldType] = field(default_factory=dict)


@dataclass(frozen=True)
class RuleResult:
    """Outcome of one rule on one config: ``status`` is "ok", "fail", "n/a" or "skipped"; an ok that rests on
    something read on trust (not computed here) names it in ``assumed``."""

    rule: Rule
    status: Status
    violations: tuple[Violation, ...] = ()
    assumed: tuple[str, ...] = ()


_CATALOG: list[Rule] = []
#: every field some registered rule reads, with its one type (two rules reading a field agree on it)
_FIELD_TYPES: dict[str, FieldType] = {}


def _declare(rule_id: str, reads: Mapping[str, FieldType]) -> None:
    for path, kind in reads.items():
        if not isinstance(kind, FieldType):
            raise RuntimeError(f"rule {rule_id!r}: reads[{path!r}] must be a FieldType (rules/field_types.py)")
        known = _FIELD_TYPES.setdefault(path, kind)
        if known is not kind:
            raise RuntimeError(
                f"rule {rule_id!r} reads {path} as {kind.expects}; another rule reads it as {known.expects}"
            )


def rule(
    rule_id: str,
    summary: str,
    *,
    severity: Severity,
    evidence: str,
    reads: Mapping[str, FieldType] | None = None,
) -> Callable[[RuleFn], RuleFn]:
    """Register ``fn`` under ``rule_id``; ids are unique and keep registration order, and the id's prefix names the
    module ``fn`` is defined in (one family, one module). ``reads``: the config fields the rule reads (dotted paths,
    ``dataset.dataset_kwargs['key']`` for a key) and the type each must hold for the rule to interpret it."""
    if severity not in SEVERITIES:
        raise RuntimeError(f"rule {rule_id!r}: severity must be one of {SEVERITIES}, got {severity!r}")
    if not evidence.strip():
        raise RuntimeError(f"rule {rule_id!r}: every rule states its evidence")

    def register(fn: RuleFn) -> RuleFn:
        module = fn.__module__.rpartition(".")[2]
        if module != rule_id.partition(".")[0]:
            raise RuntimeError(
                f"rule {rule_id!r} is registered in {fn.__module__}: a rule lives in the family module its id's "
                f"prefix names (rules/{rule_id.partition('.')[0]}.py)"
            )
        if any(r.rule_id == rule_id for r in _CATALOG):
            raise RuntimeError(f"duplicate rule id {rule_id!r}")
        _declare(rule_id, reads or {})
        _CATALOG.append(Rule(rule_id, summary, fn, severity, " ".join(evidence.split()), dict(reads or {})))
        fn.rule_id = rule_id  # type: ignore[attr-defined]
        return fn

    return register


def checked_field_types() -> dict[str, FieldType]:
    """The fields the registered rules read that have a type to check (``config.types``), by path."""
    return {path: kind for path, kind in sorted(_FIELD_TYPES.items()) if kind is not UNCHECKED}


def registered() -> list[Rule]:
    """The rules registered so far, in registration order."""
    return list(_CATALOG)


def _stamped(entry: Rule, found: Violation) -> Violation:
    """The rule's id and severity on one of its violations; a verdict the rule could not compute stays
    undetermined whatever the rule's severity (it is never an error, nor silently an OK), and an advisory whose own
    figure proves the failure (``Violation.proven``) is an error."""
    severity = UNDETERMINED if found.severity == UNDETERMINED else ERROR if found.proven else entry.severity
    return dataclasses.replace(found, rule_id=entry.rule_id, severity=severity)


def run_rule(entry: Rule, ctx: RuleContext) -> RuleResult:
    """One rule on one config: "n/a" (None), "fail" (violations, stamped with the rule's id and severity) or
    "ok"."""
    ctx.assumed.clear()
    found = entry.fn(ctx)
    if found is None:
        return RuleResult(entry, "n/a")
    if found:
        return RuleResult(entry, "fail", tuple(_stamped(entry, v) for v in found))
    return RuleResult(entry, "ok", assumed=tuple(ctx.assumed))
