"""Violation records and the single error type the plugin raises.

Kept free of Megatron imports so the CLI can format reports without paying ~40 s of import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Violation", "PackingConfigError", "format_assignment", "ERROR", "ADVISORY", "SEVERITIES"]

ERROR = "error"  # Megatron code fails (crash, assert, silently wrong training): the hook raises
ADVISORY = "advisory"  # documented or wasteful, no failing code: shown and warned, raised only when strict
SEVERITIES = (ERROR, ADVISORY)


def format_assignment(path: str, value: Any) -> str:
    """Render one fix as the Python statement a user would paste: ``cfg.a.b = 8``."""
    return f"cfg.{path} = {value!r}"


@dataclass(frozen=True)
class Violation:
    """One broken rule: which rule, which fields (with their current values), why, and how to fix it.

    ``assignments`` holds the machine-applicable part of the fix (dotted path under ``cfg`` -> value);
    ``fix`` is the human sentence. ``fix`` defaults to the assignments rendered as statements.
    ``severity`` is stamped from the rule's catalog entry when the rule runs.
    """

    rule_id: str
    fields: dict[str, Any]
    rule: str
    fix: str = ""
    assignments: dict[str, Any] = field(default_factory=dict)
    severity: str = ERROR

    def __post_init__(self) -> None:
        if not self.fix:
            object.__setattr__(self, "fix", "; ".join(format_assignment(k, v) for k, v in self.assignments.items()))

    @property
    def overrides(self) -> list[str]:
        """The fix as Hydra-style overrides Megatron-Bridge's recipe runner accepts (empty when not mechanical)."""
        from mbridge_seqpack.overrides import render_override

        return [render_override(path, value) for path, value in self.assignments.items()]

    def describe(self) -> str:
        """Multi-line text for one violation, as it appears inside the error message."""
        fields_text = ", ".join(f"{name}={value!r}" for name, value in self.fields.items())
        tag = self.rule_id if self.severity == ERROR else f"{self.rule_id} (advisory)"
        text = f"[{tag}] {fields_text}\n    rule: {self.rule}\n    fix:  {self.fix}"
        return text + (f"\n    override: {' '.join(self.overrides)}" if self.overrides else "")

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (values repr'd when not plain JSON scalars)."""

        def plain(value: Any) -> Any:
            if value is None or isinstance(value, (bool, int, float, str)):
                return value
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            if isinstance(value, dict):
                return {str(k): plain(v) for k, v in value.items()}
            return repr(value)

        return {
            "rule_id": self.rule_id,
            "severity": self.severity,
            "fields": plain(self.fields),
            "rule": self.rule,
            "fix": self.fix,
            "assignments": plain(self.assignments),
            "overrides": self.overrides,
        }


class PackingConfigError(ValueError):
    """Every packing / context-parallel / CUDA-graph violation of one config, raised together."""

    def __init__(self, violations: list[Violation]):
        if not violations:
            raise ValueError("PackingConfigError needs at least one violation")
        self.violations = list(violations)
        noun = "violation" if len(self.violations) == 1 else "violations"
        lines = [f"mbridge_seqpack: {len(self.violations)} packing/long-context config {noun}:"]
        lines += [f"  {v.describe()}" for v in self.violations]
        super().__init__("\n".join(lines))

    @property
    def rule_ids(self) -> list[str]:
        """The ids of the broken rules, in catalog order."""
        return [v.rule_id for v in self.violations]
