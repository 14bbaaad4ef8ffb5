"""The report of one check: every rule's verdict, the layout derived, what stood in or was assumed, and its text and
JSON forms (no Megatron import at module load). ``check()`` returns it, the command line prints it, the hook logs
it: one object, so the three say the same."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator

__all__ = ["CheckReport", "derived_values", "packing_mode", "state_of"]


def packing_mode(ctx: Any) -> str:
    """A short name for how sequences reach the model."""
    if ctx.offline_packing:
        return "offline packed"
    if ctx.in_batch_packing:
        return "in-batch packed"
    if ctx.energon_packing:
        return "energon online packed"
    return "unpacked"


def derived_values(ctx: Any) -> dict[str, Any]:
    """DP, alignment, row width and token slots per optimizer step for one config."""
    topo = ctx.topology
    specs = ctx.specs
    row = specs.packed_sequence_size if specs is not None else ctx.model.seq_length
    gbs = ctx.train.global_batch_size
    return {
        "world_size": topo.world_size,
        "tp": topo.tp,
        "pp": topo.pp,
        "cp": topo.cp,
        "ep": topo.ep,
        "dp": topo.data_parallel,
        "sequence_parallel": topo.sequence_parallel,
        "mode": packing_mode(ctx),
        "alignment_multiple": topo.alignment,
        "row_length": row,
        "micro_batch_size": ctx.train.micro_batch_size,
        "global_batch_size": gbs,
        # None where either is unset (a config Megatron-Bridge's own validate() refuses later): never a crash here
        "token_slots_per_step": row * gbs if isinstance(row, int) and isinstance(gbs, int) else None,
    }


def state_of(result: Any) -> str:
    """One rule's verdict: ``ok``, ``assumed`` (it holds if what it read on trust holds: ``result.assumed``),
    ``violation`` (an error or advisory), ``undetermined`` (its deciding code could not run here; never an ok),
    ``n/a`` or ``skipped``."""
    if result.status == "fail":
        severities = {v.severity for v in result.violations}
        return "undetermined" if severities == {"undetermined"} else "violation"
    if result.status == "ok" and result.assumed:
        return "assumed"
    return result.status


@dataclass
class CheckReport:
    """Everything one check found. Iterating it (or ``len``, indexing) gives the violations, as ``check()`` always
    returned them."""

    target: str
    derived: dict[str, Any]
    results: list[Any]
    megatron_error: str | None = None
    megatron_ran: bool = False
    #: every check of Megatron-Bridge's validate() that fails, its first being ``megatron_error``'s (the CLI: its own
    #: run stops at the first; ``analysis/megatron_validate.py`` collects the rest)
    megatron_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    contents: str | None = None  # what the pack check verified now and what the launch verifies (offline packs)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.violations)

    def __len__(self) -> int:
        return len(self.violations)

    def __getitem__(self, index: int) -> Any:
        return self.violations[index]

    def __eq__(self, other: object) -> bool:
        """Equal to a list (or tuple) of the same violations, as ``check()``'s list was (``check(cfg) == []``)."""
        if isinstance(other, (list, tuple)):
            return self.violations == list(other)
        if isinstance(other, CheckReport):
            return vars(self) == vars(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as the list was

    def verdicts(self) -> list[dict[str, Any]]:
        """Each rule's verdict as data: id, state (``state_of``), severities found, what was assumed or not run."""
        return [
            {
                "rule_id": r.rule.rule_id,
                "state": state_of(r),
                "severities": sorted({v.severity for v in r.violations}),
                "assumed": list(r.assumed),
                "not_run": [v.not_run for v in r.violations if v.not_run],
            }
            for r in self.results
        ]

    @property
    def assumed(self) -> list[dict[str, Any]]:
        """The rules that hold only if what they read on trust holds, with what that is."""
        trusting = [r for r in self.results if state_of(r) == "assumed"]
        return [{"rule_id": r.rule.rule_id, "assumed": list(r.assumed)} for r in trusting]

    @property
    def violations(self) -> list[Any]:
        return [v for r in self.results for v in r.violations]

    @property
    def errors(self) -> list[Any]:
        return [v for v in self.violations if v.severity == "error"]

    @property
    def undetermined(self) -> list[Any]:
        """Verdicts whose deciding code could not run here: never counted as OK, never as a failure."""
        return [v for v in self.violations if v.severity == "undetermined"]

    @property
    def ok(self) -> bool:
        """No error-level violation and Megatron-Bridge's own validation passed (advisories and undetermined
        verdicts are shown, not failed: the result line says which verdicts were not determined)."""
        return not self.errors and self.megatron_error is None

    def to_json(self) -> str:
        return json.dumps(
            {
                "target": self.target,
                "ok": self.ok,
                "determined": not self.undetermined,
                "undetermined": self.undetermined_mechanisms(),
                "assumed": self.assumed,
                "verdicts": self.verdicts(),
                "derived": self.derived,
                "rules": [
                    {"rule_id": r.rule.rule_id, "status": r.status, "violations": [v.to_dict() for v in r.violations]}
                    for r in self.results
                ],
                "violations": [v.to_dict() for v in self.violations],
                "contents": self.contents,
                "notes": self.notes,  # what the text prints as note: lines (what stood in, the runner's fixes)
                "megatron_bridge_validate": None
                if not self.megatron_ran
                else (
                    {
                        "ok": self.megatron_error is None,
                        "error": self.megatron_error,
                        "errors": self.megatron_errors or ([self.megatron_error] if self.megatron_error else []),
                    }
                ),
            },
            indent=2,
        )

    @staticmethod
    def _layout_lines(d: dict[str, Any]) -> list[str]:
        from mbridge_seqpack.textout import wrap

        dp = d["dp"] if d["dp"] is not None else "n/a (world size does not divide)"
        lines = wrap(
            f"world={d['world_size']} TP={d['tp']} PP={d['pp']} CP={d['cp']} EP={d['ep']} DP={dp} "
            f"SP={'on' if d['sequence_parallel'] else 'off'}",
            "  layout   ",
            hang=" " * 11,
        )
        lines += wrap(
            f"{d['mode']}, row {d['row_length']} tokens, THD alignment multiple {d['alignment_multiple']}",
            "  packing  ",
            hang=" " * 11,
        )
        slots = d["token_slots_per_step"]
        lines += wrap(
            f"micro {d['micro_batch_size']}, global {d['global_batch_size']}, token slots per step "
            + (f"{slots:,} ({d['row_length']} x {d['global_batch_size']})" if slots is not None else "not known"),
            "  batch    ",
            hang=" " * 11,
        )
        return lines

    def to_text(self, show_all: bool = False) -> str:
        """The report for people, at most 100 columns (long values wrap under their label): the verdict first,
        then the rules that found something (every rule with ``show_all``), then one line counting the rest."""
        from mbridge_seqpack.textout import wrap

        d = self.derived
        lines = [self.result_line(), f"mbridge-seqpack check: {self.target}"]
        if not d:  # a field of the wrong type: config.types reports it, nothing can be derived
            lines.append("  layout   not derived: a field has the wrong type (see config.types below)")
        else:
            lines += self._layout_lines(d)
        shown = [r for r in self.results if show_all or r.violations]
        if shown:
            lines.append("rules:" if show_all else "rules that found something:")
        for r in shown:
            lines += _rule_lines(r)
        lines.append(self.count_line())
        mechanisms = self.undetermined_mechanisms()
        if mechanisms:  # each on one line: what a "NOT DETERMINED" result was not able to run here
            lines.append(f"not determined here ({len(mechanisms)}):")
            for m in mechanisms:
                lines += wrap(f"{m['rule_id']}: {m['not_run']}", "  ", hang="    ")
        trusted = self.assumptions()
        if trusted:  # each assumption once, with the rules whose ok rests on it
            lines.append(f"assumed, not computed here ({len(trusted)}):")
            for assumption, rule_ids in trusted.items():
                lines += wrap(f"{assumption} ({', '.join(rule_ids)})", "  ", hang="    ")
        if self.contents is not None:
            lines += wrap(self.contents, "pack contents: ", hang="  ")
        if self.megatron_ran:
            status = "ok" if self.megatron_error is None else f"FAILED: {self.megatron_error}"
            lines += wrap(status, "megatron-bridge validate(): ", hang="  ")
            for later in self.megatron_errors[1:]:  # the checks its validate() stops before
                lines += wrap(f"also FAILED: {later}", "  ", hang="    ")
        for note in self.notes:
            lines += wrap(note, "note: ", hang="  ")
        return "\n".join(lines)

    def undetermined_mechanisms(self) -> list[dict[str, str]]:
        """One entry per verdict not determined here: the rule and what could not run (a TE kernel, cuDNN's device
        query, a parallel size the CPU world lacks, a capture run that stopped)."""
        return [
            {"rule_id": r.rule.rule_id, "not_run": v.not_run}
            for r in self.results
            for v in r.violations
            if v.severity == "undetermined"
        ]

    def assumptions(self) -> dict[str, list[str]]:
        """Each thing read on trust, with the rules whose ok rests on it (in catalog order)."""
        found: dict[str, list[str]] = {}
        for r in self.results:
            if state_of(r) == "assumed":
                for assumption in r.assumed:
                    found.setdefault(assumption, []).append(r.rule.rule_id)
        return found

    def count_line(self) -> str:
        """``98 rules: 93 ok, 2 assumed, 3 n/a``: every rule, by status (a rule listed above counts once, under its
        mark; an ok that rests on an assumption counts as assumed)."""
        counts: dict[str, int] = {}
        for r in self.results:
            if r.status == "fail":
                label = _FAIL_WORDS[_fail_mark(r)]
            else:
                label = _STATUS_WORDS[state_of(r) if r.status == "ok" else r.status]
            counts[label] = counts.get(label, 0) + 1
        order = [*_FAIL_WORDS.values(), *_STATUS_WORDS.values()]
        parts = [f"{counts[label]} {label}" for label in order if label in counts]
        return f"{len(self.results)} rules: {', '.join(parts)}"

    def result_line(self) -> str:
        """``result: ...``: OK only when every verdict was computed and none failed."""
        n, unknown = len(self.errors), len(self.undetermined)
        advisories = len(self.violations) - n - unknown
        notes = [f"{advisories} advisory"] if advisories else []
        notes += [f"{unknown} not determined here"] if unknown else []
        notes += [f"{len(self.assumed)} assumed"] if self.assumed else []
        note = f" ({', '.join(notes)})" if notes else ""
        if not self.ok:
            failed = "" if self.megatron_error is None else ", Megatron-Bridge validation failed"
            return f"result: {n} violation(s){note}{failed}"
        return f"result: OK{note}" if not unknown else f"result: NOT DETERMINED, no violation found{note}"


_STATUS_WORDS = {"ok": "ok", "assumed": "assumed", "n/a": "n/a", "skipped": "skipped"}
_FAIL_WORDS = {"FAIL": "failed", "UND?": "not determined", "ADV ": "advisory"}


def _rule_lines(r: Any) -> list[str]:
    """One rule's mark and id, then each violation's fields, reason, what did not run and fix."""
    from mbridge_seqpack.textout import wrap

    mark = {"ok": "ok  ", "assumed": "asm ", "fail": _fail_mark(r), "n/a": "n/a ", "skipped": "skip"}[
        state_of(r) if r.status == "ok" else r.status
    ]
    lines = [f"  {mark} {r.rule.rule_id}"]
    if r.violations:
        lines += wrap(r.rule.summary, " " * 7)
    for v in r.violations:
        fields = ", ".join(f"{k}={val!r}" for k, val in v.fields.items())
        shown = [("fields:", fields), ("why:", v.rule)] + ([("not run:", v.not_run)] if v.not_run else [])
        for label, text in (*shown, ("fix:", v.fix)):
            lines += wrap(text, f"       {label:<10}", hang=" " * 17)
        if v.overrides:
            lines += wrap(" ".join(v.overrides), f"       {'override:':<10}", hang=" " * 17)
    return lines


def _fail_mark(result: Any) -> str:
    """FAIL for an error, UND? for a verdict not computed here, ADV for an advisory."""
    severities = {v.severity for v in result.violations}
    if "error" in severities:
        return "FAIL"
    return "UND?" if "undetermined" in severities else "ADV "
