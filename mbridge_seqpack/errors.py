"""Violation records and the plugin's one error family.

Every error the plugin raises on purpose is a :class:`SeqpackError` (a ``ValueError``): a config that breaks a rule
(:class:`PackingConfigError`), bad input or usage (:class:`UsageError`; ``InputError`` for data files,
``ArtifactError`` for packs, ``StaticShapeOverflowError`` / ``StaticShapeMismatchError`` at run time). Each message
names the field, file or flag and the fix. The command line prints these and exits 1 (a config that breaks a rule)
or 2; any other exception is a bug and is shown as one. Kept free of Megatron imports so the CLI can format reports
without paying ~40 s of import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Violation",
    "SeqpackError",
    "UsageError",
    "ArtifactError",
    "InputError",
    "PackingConfigError",
    "format_assignment",
    "os_reason",
    "ERROR",
    "ADVISORY",
    "UNDETERMINED",
    "SEVERITIES",
    "Severity",
]

Severity = Literal["error", "advisory", "undetermined"]

ERROR: Severity = "error"  # Megatron code fails (crash, assert, silently wrong training): the hook raises
ADVISORY: Severity = "advisory"  # documented or wasteful, no failing code: shown and warned, raised only when strict
#: a computed verdict whose deciding code could not run here (a TE kernel, cuDNN's device query, a parallel size the
#: CPU world lacks, a feature with no probe): never shown as OK; warned like an advisory, raised when strict. A rule
#: of either severity may return one (``Violation(..., severity=UNDETERMINED, not_run="...")``); run_rule keeps it.
UNDETERMINED: Severity = "undetermined"
SEVERITIES = (ERROR, ADVISORY)  # what a rule's catalog entry may declare


def format_assignment(path: str, value: Any) -> str:
    """Render one fix as the Python statement a user would paste: ``cfg.a.b = 8``."""
    return f"cfg.{path} = {value!r}"


@dataclass(frozen=True)
class Violation:
    """One broken rule: which rule, which fields (with their current values), why, and how to fix it.

    ``assignments`` holds the machine-applicable part of the fix (dotted path under ``cfg`` -> value);
    ``fix`` is the human sentence. ``fix`` defaults to the assignments rendered as statements.
    ``rule_id`` and ``severity`` are stamped from the rule's catalog entry when the rule runs (``run_rule``), so a
    rule never restates its own id.
    """

    fields: dict[str, Any]
    rule: str
    fix: str = ""
    assignments: dict[str, Any] = field(default_factory=dict)
    severity: Severity = ERROR
    rule_id: str = ""
    not_run: str = ""  # for an UNDETERMINED verdict: what could not be run here, so nothing was computed
    #: for an advisory rule's finding whose own figure proves the failure (a need beyond any machine): that figure;
    #: run_rule then stamps it an error whatever the rule's catalog severity
    proven: str = ""

    def __post_init__(self) -> None:
        if self.severity == UNDETERMINED and not self.not_run:
            raise TypeError("an undetermined verdict says what was not run (not_run=...)")
        if not self.fix:
            object.__setattr__(self, "fix", "; ".join(format_assignment(k, v) for k, v in self.assignments.items()))

    @property
    def overrides(self) -> list[str]:
        """The fix as Hydra-style overrides Megatron-Bridge's recipe runner accepts (empty when not mechanical)."""
        from mbridge_seqpack.override_text import render_override

        return [render_override(path, value) for path, value in self.assignments.items()]

    def describe(self, width: int = 98) -> str:
        """Multi-line text for one violation, as it appears inside the error message (indented by 2 there): at most
        ``width`` columns, continuation lines under their label; overrides are never split inside one."""
        from mbridge_seqpack.textout import wrap

        fields_text = ", ".join(f"{name}={value!r}" for name, value in self.fields.items())
        tag = self.rule_id if self.severity == ERROR else f"{self.rule_id} ({self.severity})"
        lines = wrap(f"[{tag}] {fields_text}", hang="      ", width=width)
        lines += wrap(self.rule, "    rule: ", hang=" " * 10, width=width)
        if self.not_run:
            lines += wrap(self.not_run, "    not run: ", hang=" " * 13, width=width)
        if self.proven:
            lines += wrap(self.proven, "    proven: ", hang=" " * 12, width=width)
        lines += wrap(self.fix, "    fix:  ", hang=" " * 10, width=width)
        if self.overrides:
            lines += _pack_words(self.overrides, "    override: ", " " * 14, width)
        return "\n".join(lines)

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
            "not_run": self.not_run,
            "proven": self.proven,
            "assignments": plain(self.assignments),
            "overrides": self.overrides,
        }


def _pack_words(words: list[str], indent: str, hang: str, width: int) -> list[str]:
    """``words`` joined by spaces into lines of at most ``width`` (a longer word gets a line of its own)."""
    lines, line, placed = [], indent, False
    for word in words:
        if placed and len(line) + 1 + len(word) > width:
            lines.append(line)
            line, placed = hang, False
        line, placed = f"{line}{' ' if placed else ''}{word}", True
    return [*lines, line]


class SeqpackError(ValueError):
    """The base of every error the plugin raises on purpose: something the user can fix, said with the fix."""


class UsageError(SeqpackError):
    """A bad argument, option, name or value given to the plugin (its API, its command line, a recipe name)."""


class ArtifactError(SeqpackError):
    """A packed artifact that is missing, incomplete, corrupted, mixed or stale (``artifact.store`` re-exports it;
    defined here so every packing module, the tile seal included, raises the one class)."""


class InputError(SeqpackError):
    """Bad user input (file, line, field, value and the fix in the message); the CLI prints it, no traceback.
    (``tokenization.sequences`` re-exports it; defined here so every step of ``pack`` raises the one class.)"""


class PackingConfigError(SeqpackError):
    """Every packing / context-parallel / CUDA-graph violation of one config, raised together."""

    def __init__(self, violations: list[Violation]):
        if not violations:
            raise TypeError("PackingConfigError needs at least one violation")
        self.violations = list(violations)
        noun = "violation" if len(self.violations) == 1 else "violations"
        lines = [f"mbridge_seqpack: {len(self.violations)} packing/long-context config {noun}:"]
        lines += [f"  {v.describe()}" for v in self.violations]
        super().__init__("\n".join(lines))

    @property
    def rule_ids(self) -> list[str]:
        """The ids of the broken rules, in catalog order."""
        return [v.rule_id for v in self.violations]


def os_reason(exc: OSError) -> str:
    """Why an ``OSError`` happened, in words: its ``strerror``, or its text where a library raised one without an
    errno (numpy's ``tofile`` on a full disk: "N requested and M written"; pyarrow's), never "None"."""
    if exc.strerror:
        return str(exc.strerror)
    if exc.errno is not None:
        import os

        return os.strerror(exc.errno)
    return str(exc) or type(exc).__name__
