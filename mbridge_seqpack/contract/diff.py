"""``contract diff``: what changed between two records, observation by observation, as a reviewer reads it: the
function, the input, and the values before and after at the first position they differ; census sites added,
removed or changed (file and function); ``validate()`` verdicts that flipped, with the config."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from mbridge_seqpack.textout import WIDTH, wrap

__all__ = ["Change", "Diff", "diff_records", "first_difference", "render_text", "render_json"]

_END = "(absent)"


@dataclass
class Change:
    observation: str
    function: str
    kind: str  # "value", "status", "census", "verdicts", "missing"
    inputs: str = ""
    input: str = ""  # the observation's sub-input (the value's first key) where it has some
    position: str = ""
    before: Any = None
    after: Any = None
    details: list[str] = field(default_factory=list)


@dataclass
class Diff:
    a: str
    b: str
    notes: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def first_difference(a: Any, b: Any, path: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], Any, Any] | None:
    """(path, before, after) at the first position ``a`` and ``b`` differ (dict keys in sorted order, list
    elements in order; a key or element one side lacks reads as ``(absent)``), or None when equal."""
    if a == b:
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return (*path, key), a.get(key, _END), b.get(key, _END)
            found = first_difference(a[key], b[key], (*path, key))
            if found:
                return found
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            if i >= len(a) or i >= len(b):
                return (*path, i), a[i] if i < len(a) else _END, b[i] if i < len(b) else _END
            found = first_difference(a[i], b[i], (*path, i))
            if found:
                return found
    return path, a, b


def _position(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _site_parts(key: str) -> tuple[str, str, str, str, str]:
    file, qualname, kind, digest, occurrence = key.split("::")
    return file, qualname, kind, digest, occurrence


def _census(name: str, head: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> Change | None:
    """Sites by (file, function, kind, occurrence): a new text digest is a changed site, the rest added/removed."""

    def by_place(sites: dict[str, str]) -> dict[tuple[str, str, str, str], tuple[str, str]]:
        out = {}
        for key, excerpt in sites.items():
            file, qualname, kind, digest, occurrence = _site_parts(key)
            out[(file, qualname, kind, occurrence)] = (digest, excerpt)
        return out

    before, after = by_place(a.get("sites", {})), by_place(b.get("sites", {}))
    lines = []
    for place in sorted(set(before) | set(after)):
        file, qualname, kind, _ = place
        if place not in after:
            lines.append(f"removed {file} {qualname} [{kind}]: {before[place][1]}")
        elif place not in before:
            lines.append(f"added {file} {qualname} [{kind}]: {after[place][1]}")
        elif before[place][0] != after[place][0]:
            lines.append(f"changed {file} {qualname} [{kind}]: {before[place][1]} -> {after[place][1]}")
    for gone in sorted(set(a.get("files_missing", [])) ^ set(b.get("files_missing", []))):
        lines.append(f"{'file gone' if gone in b.get('files_missing', []) else 'file back'} {gone}")
    if not lines:
        return None
    return Change(name, head["function"], "census", inputs=head["inputs"], details=lines)


def _verdicts(name: str, head: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> Change | None:
    lines = []
    for case in sorted(set(a) | set(b)):
        x, y = a.get(case, {}), b.get(case, {})
        was, now = x.get("verdict", x.get("status", _END)), y.get("verdict", y.get("status", _END))
        if was != now:
            lines.append(f"{case} ({(y or x).get('config', '')}): {was} -> {now}")
    if not lines:
        return None
    return Change(name, head["function"], "verdicts", inputs=head["inputs"], details=lines)


def diff_records(a: dict[str, Any], b: dict[str, Any], *, a_name: str = "A", b_name: str = "B") -> Diff:
    """Every observation of either record that differs (observations only one record has are listed as missing
    unless one record was made with ``--only``)."""
    out = Diff(a_name, b_name)
    if a.get("observations_version") != b.get("observations_version"):
        out.notes.append(
            f"the records hold observation set v{a.get('observations_version')} and v{b.get('observations_version')}"
            ": an input may differ, not only the behaviour"
        )
    oa, ob = a["observations"], b["observations"]
    for name in sorted(set(oa) | set(ob)):
        x, y = oa.get(name), ob.get(name)
        if x is None or y is None:
            if not (a.get("only") or b.get("only")):
                head = x or y
                out.changes.append(
                    Change(
                        name,
                        head["function"],
                        "missing",
                        before="recorded" if x else _END,
                        after="recorded" if y else _END,
                    )
                )
            continue
        head = {"function": y.get("function", x.get("function", "")), "inputs": y.get("inputs", x.get("inputs", ""))}
        if x.get("status") != y.get("status"):
            out.changes.append(
                Change(
                    name,
                    head["function"],
                    "status",
                    inputs=head["inputs"],
                    before=x.get("status") + (f" ({x['why']})" if x.get("why") else ""),
                    after=y.get("status") + (f" ({y['why']})" if y.get("why") else ""),
                )
            )
            continue
        if x.get("status") != "ok" or x.get("value") == y.get("value"):
            continue
        if name == "census.scan":
            change = _census(name, head, x["value"], y["value"])
        elif name.startswith("validate."):
            change = _verdicts(name, head, x["value"], y["value"])
        else:
            path, before, after = first_difference(x["value"], y["value"])  # type: ignore[misc]
            sub = str(path[0]) if path and isinstance(x["value"], dict) else ""
            change = Change(
                name, head["function"], "value", inputs=head["inputs"], input=sub,
                position=_position(path[1:] if sub else path), before=before, after=after,
            )  # fmt: skip
        if change is not None:
            out.changes.append(change)
    return out


def _short(value: Any, width: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[: width - 3] + "..."


def render_text(diff: Diff, *, width: int = WIDTH) -> str:
    """The diff in ``width`` columns; the first line says whether anything changed."""
    lines = [
        f"{len(diff.changes)} observation{'s' if len(diff.changes) != 1 else ''} changed"
        if diff.changed
        else "no change: every observation of both records is the same"
    ]
    lines += wrap(f"A: {diff.a}", hang="   ", width=width) + wrap(f"B: {diff.b}", hang="   ", width=width)
    for note in diff.notes:
        lines += wrap(f"note: {note}", hang="      ", width=width)
    for c in diff.changes:
        lines.append("")
        lines += wrap(f"{c.observation}  ({c.function})", hang="    ", width=width)
        if c.inputs:
            lines += wrap(f"inputs: {c.inputs}", "  ", hang="          ", width=width)
        if c.kind in ("value", "status", "missing"):
            if c.input:
                lines += wrap(f"input: {c.input}", "  ", hang="         ", width=width)
            if c.position:
                lines += wrap(f"at: {c.position}", "  ", hang="      ", width=width)
            lines.append("  before: " + _short(c.before, width - 10))
            lines.append("  after:  " + _short(c.after, width - 10))
        for detail in c.details:
            lines += wrap(detail, "  ", hang="      ", width=width)
    return "\n".join(lines)


def render_json(diff: Diff) -> str:
    return json.dumps(
        {
            "a": diff.a,
            "b": diff.b,
            "changed": diff.changed,
            "notes": diff.notes,
            "changes": [asdict(c) for c in diff.changes],
        },
        indent=1,
        sort_keys=True,
    )
