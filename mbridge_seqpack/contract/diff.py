"""``contract diff``: what changed between two records, observation by observation, as a reviewer reads it: the
function, the input, and the values before and after at the first position they differ (a side that raised is an
outcome: ``raised ValueError -> returns``); guards added, removed or changed in the functions the inputs ran
(census.scan); ``validate()`` verdicts that flipped, with the config."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from mbridge_seqpack.textout import WIDTH, wrap

__all__ = ["Change", "Diff", "diff_records", "first_difference", "is_raised", "outcome", "render_text", "render_json"]

_END = "(absent)"


@dataclass
class Change:
    observation: str
    function: str
    kind: str  # "value", "status", "census", "verdicts", "missing"
    inputs: str = ""
    input: str = ""  # the observation's sub-input (the value's first key) where it has some
    position: str = ""
    outcome: str = ""  # "raised ValueError -> returns" where one side raised
    before: Any = None
    after: Any = None
    details: list[str] = field(default_factory=list)


@dataclass
class Diff:
    a: str
    b: str
    notes: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    #: census.scan's guard changes when they do not count (the default): shown after the changes
    guards: list[Change] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def first_difference(a: Any, b: Any, path: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], Any, Any] | None:
    """(path, before, after) at the first position ``a`` and ``b`` differ (dict keys in sorted order, list
    elements in order; a key or element one side lacks reads as ``(absent)``), or None when equal."""
    if a == b:
        return None
    if is_raised(a) or is_raised(b):  # an outcome: raised or returned, never compared key by key
        return path, a, b
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


def is_raised(value: Any) -> bool:
    """A recorded exception (observations.raised): ``{"raised": "Type: message"}``."""
    return isinstance(value, dict) and set(value) == {"raised"} and isinstance(value["raised"], str)


def outcome(before: Any, after: Any) -> str:
    """``raised ValueError -> returns``, ``returns -> raised TypeError``, ``raised A -> raised B``; "" when
    neither side raised."""
    if not (is_raised(before) or is_raised(after)):
        return ""

    def one(value: Any) -> str:
        if is_raised(value):
            return "raised " + value["raised"].partition(":")[0]
        return "absent" if value == _END else "returns"

    return f"{one(before)} -> {one(after)}"


def _position(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _guards(value: dict[str, Any], groups: set[str]) -> dict[str, str]:
    """The guards of the functions run by the observations ``groups`` (one guard once, whichever ran it)."""
    out: dict[str, str] = {}
    for name in sorted(groups & set(value)):
        out.update(value[name])
    return out


def _census(name: str, head: dict[str, Any], a: dict[str, Any], b: dict[str, Any], groups: set[str]) -> Change | None:
    """Guards by (function, kind): a function's one guard gone and one new is a changed guard, the rest removed or
    added. Only the functions of observations both records ran are compared (``groups``): an observation one commit
    cannot run would otherwise read as guards removed; the census holds the functions of observations that ran."""
    if "sites" in a or "sites" in b:  # a record of observation set v1 (a census of lines): not comparable
        return None
    before, after = _guards(a, groups), _guards(b, groups)

    def place(key: str, shown: str) -> tuple[str, str]:
        """(where: file and function, kind): a guard gone and one new at one place read as one changed."""
        return shown.partition(": ")[0], key.split("::")[0]

    gone: dict[tuple[str, str], list[str]] = {}
    new: dict[tuple[str, str], list[str]] = {}
    for key in sorted(set(before) - set(after)):
        gone.setdefault(place(key, before[key]), []).append(before[key])
    for key in sorted(set(after) - set(before)):
        new.setdefault(place(key, after[key]), []).append(after[key])
    lines = []
    for where in sorted(set(gone) | set(new)):
        was, now = gone.get(where, []), new.get(where, [])
        if len(was) == 1 and len(now) == 1:
            lines.append(f"changed guard {was[0]} -> {now[0].partition(': ')[2]}")
            continue
        lines += [f"removed guard {g}" for g in was] + [f"added guard {g}" for g in now]
    if not lines:
        return None
    return Change(name, head["function"], "census", inputs=head["inputs"], details=lines)


def _verdicts(name: str, head: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> Change | None:
    lines = []
    for case in sorted(set(a) | set(b)):
        x, y = a.get(case, {}), b.get(case, {})
        if "verdict" not in x or "verdict" not in y:  # a case one commit's config cannot build decides nothing
            continue
        was, now = x["verdict"], y["verdict"]
        if was != now:
            lines.append(f"{case} ({(y or x).get('config', '')}): {was} -> {now}")
    if not lines:
        return None
    return Change(name, head["function"], "verdicts", inputs=head["inputs"], details=lines)


def diff_records(
    a: dict[str, Any], b: dict[str, Any], *, a_name: str = "A", b_name: str = "B", count_guards: bool = False
) -> Diff:
    """Every observation of either record that differs (observations only one record has are listed as missing
    unless one record was made with ``--only``). census.scan's guard changes are kept apart (``Diff.guards``,
    shown, not counted) unless ``count_guards``: a guard of code these inputs ran, changed, is a change of code; a
    changed value or verdict is a change of what these inputs observe."""
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
            change = _census(name, head, x["value"], y["value"], set(x["value"]) & set(y["value"]))
        elif name.startswith("validate."):
            change = _verdicts(name, head, x["value"], y["value"])
        else:
            path, before, after = first_difference(x["value"], y["value"])  # type: ignore[misc]
            sub = str(path[0]) if path and isinstance(x["value"], dict) else ""
            change = Change(
                name, head["function"], "value", inputs=head["inputs"], input=sub,
                position=_position(path[1:] if sub else path), outcome=outcome(before, after),
                before=_shown(before), after=_shown(after),
            )  # fmt: skip
        if change is None:
            continue
        (out.guards if change.kind == "census" and not count_guards else out.changes).append(change)
    return out


def _shown(value: Any) -> Any:
    """A recorded exception as its line (``raised ValueError: ...``), anything else as recorded."""
    return f"raised {value['raised']}" if is_raised(value) else value


def _short(value: Any, width: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[: width - 3] + "..."


def render_text(diff: Diff, *, width: int = WIDTH) -> str:
    """The diff in ``width`` columns; the first line says whether anything changed."""
    guards = sum(len(c.details) for c in diff.guards)
    lines = [
        f"{len(diff.changes)} observation{'s' if len(diff.changes) != 1 else ''} changed"
        if diff.changed
        else "no change: every observation of both records is the same"
        + (
            f" ({guards} guard{'s' if guards != 1 else ''} of the code they ran changed: below, not counted)"
            if guards
            else ""
        )
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
            if c.outcome:
                lines.append(f"  outcome: {c.outcome}")
            lines.append("  before: " + _short(c.before, width - 10))
            lines.append("  after:  " + _short(c.after, width - 10))
        for detail in c.details:
            lines += wrap(detail, "  ", hang="      ", width=width)
    for c in diff.guards:
        lines.append("")
        lines += wrap(
            f"{c.observation}: {len(c.details)} guard{'s' if len(c.details) != 1 else ''} of the code these inputs "
            "ran changed (shown, not counted: what is observed did not change through them; `contract bisect-run "
            "--only census.scan` counts them)",
            hang="  ",
            width=width,
        )
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
            "guards_not_counted": [asdict(c) for c in diff.guards],
        },
        indent=1,
        sort_keys=True,
    )
