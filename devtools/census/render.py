"""``docs/failure-points.md``: the census rendered from the data (the scan of the installed files, the inventory,
the verdicts and the hand-listed mechanisms)."""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
import re
from collections import Counter, defaultdict

from devtools.census import mapping
from devtools.census.census import Census, Mapped
from devtools.census.files import LEFT_OUT, PATH_FILES, STAGES, package_of
from devtools.census.scanner import KINDS
from devtools.census.silent import KINDS as MECHANISM_KINDS
from devtools.census.silent import all_mechanisms
from devtools.census.verdicts import CLASSES, CensusVerdict

__all__ = ["render_markdown"]

PACKAGES = ("megatron-bridge", "megatron-core", "transformer-engine")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "/")


def _code(text: str) -> str:
    text = " ".join(text.split()).replace("`", "'")
    return f"`{text}`"


def _verdict_text(v: CensusVerdict) -> str:
    parts = [f"**{v.cls}**"]
    if v.rules:
        parts.append(", ".join(f"`{r}`" for r in v.rules))
    if v.validator:
        parts.append(f"({_cell(v.validator)})")
    reason = _cell(v.reason)
    text = " ".join(parts) + f": {reason}" + ("" if reason.endswith(".") else ".")
    if v.fields:
        text += " Fields: " + ", ".join(f"`{f}`" for f in v.fields) + "."
    return text


def _summary(census: Census) -> list[str]:
    by = Counter((package_of(m.site.file), m.verdict.cls) for m in census.mapped)
    lines = ["| package | " + " | ".join(CLASSES) + " | sites |", "|---" * (len(CLASSES) + 2) + "|"]
    for package in PACKAGES:
        row = [by[(package, c)] for c in CLASSES]
        lines.append(f"| {package} | " + " | ".join(map(str, row)) + f" | {sum(row)} |")
    totals = [sum(by[(p, c)] for p in PACKAGES) for c in CLASSES]
    lines.append("| **all** | " + " | ".join(f"**{t}**" for t in totals) + f" | **{sum(totals)}** |")
    return lines


def _by_stage(census: Census) -> list[str]:
    stage_of = {f.path: f.stage for f in PATH_FILES}
    by = Counter((stage_of[m.site.file], m.verdict.cls) for m in census.mapped)
    lines = ["| stage | " + " | ".join(CLASSES) + " |", "|---" * (len(CLASSES) + 1) + "|"]
    for stage in STAGES:
        lines.append(f"| {stage} | " + " | ".join(str(by[(stage, c)]) for c in CLASSES) + " |")
    return lines


def _by_kind(census: Census) -> list[str]:
    by = Counter((m.site.kind, m.verdict.cls) for m in census.mapped)
    kinds = [k for k in KINDS if any(by[(k, c)] for c in CLASSES)]
    lines = ["| kind | " + " | ".join(CLASSES) + " |", "|---" * (len(CLASSES) + 1) + "|"]
    for kind in kinds:
        lines.append(f"| `{kind}` | " + " | ".join(str(by[(kind, c)]) for c in CLASSES) + " |")
    return lines


def _gap_table(gaps: list[Mapped]) -> list[str]:
    """One row per distinct gap verdict: its sites (file:line), the fields, what fails."""
    rows: dict[int, list[Mapped]] = defaultdict(list)
    verdicts: dict[int, CensusVerdict] = {}
    for m in gaps:
        rows[id(m.verdict)].append(m)
        verdicts[id(m.verdict)] = m.verdict
    lines = ["| sites | fields | what fails |", "|---|---|---|"]
    for key in sorted(rows, key=lambda k: (rows[k][0].site.file, rows[k][0].site.line)):
        sites = rows[key]
        ordered = sorted(sites, key=lambda m: (m.site.file, m.site.line))
        shown = list(
            dict.fromkeys(f"`{m.site.file.split('/', 1)[1]}:{m.site.line}` {m.site.qualname}" for m in ordered)
        )
        where = "<br>".join(shown[:4]) + (f"<br>(+{len(shown) - 4} more)" if len(shown) > 4 else "")
        fields = ", ".join(f"`{f}`" for f in verdicts[key].fields)
        lines.append(f"| {where} | {fields} | {_cell(verdicts[key].reason)} |")
    return lines


def _rules_table(census: Census) -> list[str]:
    sites: Counter[str] = Counter()
    mechanisms: Counter[str] = Counter()
    for m in census.mapped:
        sites.update(m.verdict.rules)
    for mech in all_mechanisms():
        mechanisms.update(mech.verdict.rules)
    rules = sorted(set(sites) | set(mechanisms), key=lambda r: (-sites[r], -mechanisms[r], r))
    lines = ["| rule | sites it guards | hand-listed mechanisms |", "|---|---|---|"]
    lines += [f"| `{r}` | {sites[r]} | {mechanisms[r]} |" for r in rules]
    return lines


def _mechanisms() -> list[str]:
    lines = ["| kind | mechanism | where | what happens | verdict |", "|---|---|---|---|---|"]
    for m in all_mechanisms():
        where = f"`{m.file.split('/', 1)[1] if '/' in m.file else m.file}` {m.function}"
        lines.append(f"| {m.kind} | {_cell(m.name)} | {where} | {_cell(m.what)} | {_verdict_text(m.verdict)} |")
    return lines


def _files(census: Census) -> list[str]:
    count = Counter(m.site.file for m in census.mapped)
    lines = ["| file | stage | sites | why it is on the path |", "|---|---|---|---|"]
    for f in PATH_FILES:
        only = f" (only {', '.join(f'`{q}`' for q in f.only)})" if f.only else ""
        lines.append(f"| `{f.path}` | {f.stage} | {count[f.path]} | {_cell(f.why)}{only} |")
    return lines


def _verdict_ids(census: Census) -> dict[int, str]:
    """A stable anchor per distinct verdict, in order of first appearance along the path: a verdict the mapping
    names (``INVARIANT`` in ``mapping/common.py``) by its name (``invariant``); any other by the file and function
    of its first site (``bridge-training-config-configcontainer-validate``), then its class, then a digest of its
    reason where verdicts share them. A new site or verdict renames no other anchor."""
    named = _named_verdicts()
    ids: dict[int, str] = {}
    taken: set[str] = set()
    for m in sorted(census.mapped, key=lambda m: (_ORDER[m.site.file], m.site.line)):
        if id(m.verdict) in ids:
            continue
        base = _slug(f"{m.site.file.removeprefix('megatron/').removesuffix('.py')}-{m.site.qualname}")
        digest = hashlib.sha1(m.verdict.reason.encode()).hexdigest()[:6]
        candidates = (*named.get(id(m.verdict), ()), base, f"{base}-{m.verdict.cls}", f"{base}-{digest}")
        anchor = next(a for a in candidates if a not in taken)
        ids[id(m.verdict)] = anchor
        taken.add(anchor)
    return ids


def _named_verdicts() -> dict[int, tuple[str, ...]]:
    """The module-level verdict constants of ``mapping/``: the verdict -> its anchors by name (bare, then with its
    module's name)."""
    names: dict[int, tuple[str, ...]] = {}
    for info in sorted(pkgutil.iter_modules(mapping.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{mapping.__name__}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, CensusVerdict) and name.isupper():
                names.setdefault(id(value), (_slug(name), _slug(f"{info.name}-{name}")))
    return names


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


_ORDER = {f.path: i for i, f in enumerate(PATH_FILES)}


def _legend(census: Census, ids: dict[int, str]) -> list[str]:
    verdicts = {id(m.verdict): m.verdict for m in census.mapped}
    count = Counter(id(m.verdict) for m in census.mapped)
    return [
        f'- <a id="{vid}"></a>**{vid}** ({count[key]} sites) {_verdict_text(verdicts[key])}'
        for key, vid in ids.items()
    ]


def _sites(census: Census, ids: dict[int, str]) -> list[str]:
    by_file: dict[str, list[Mapped]] = defaultdict(list)
    for m in census.mapped:
        by_file[m.site.file].append(m)
    lines: list[str] = []
    for f in PATH_FILES:
        mapped = sorted(by_file.get(f.path, []), key=lambda m: m.site.line)
        if not mapped:
            continue
        lines += ["", f"### `{f.path}` ({len(mapped)})", ""]
        by_function: dict[str, list[Mapped]] = defaultdict(list)
        for m in mapped:
            by_function[m.site.qualname].append(m)
        for qualname, items in by_function.items():
            groups: dict[int, list[Mapped]] = defaultdict(list)
            for m in items:
                groups[id(m.verdict)].append(m)
            for key, members in groups.items():
                v = members[0].verdict
                vid = ids[key]
                rules = " " + ", ".join(f"`{r}`" for r in v.rules) if v.rules else ""
                sites = "; ".join(f"L{m.site.line} {m.site.kind} {_code(_short(m.site.text))}" for m in members)
                lines.append(f"- `{qualname}`: {sites} -> [{vid}](#{vid}) {v.cls}{rules}")
    return lines


def _short(text: str, width: int = 72) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def render_markdown(census: Census) -> str:
    """The whole page; ``census`` must be clean (every site mapped)."""
    if not census.clean:
        raise RuntimeError("the census has unmapped or stale entries:\n" + "\n".join(census.problems()))
    total = len(census.mapped)
    counts = Counter(m.verdict.cls for m in census.mapped)
    gaps = [m for m in census.mapped if m.verdict.cls == "gap"]
    packing_gaps = [m for m in gaps if not m.verdict.general]
    general_gaps = [m for m in gaps if m.verdict.general]
    mechanisms = all_mechanisms()
    mech_counts = Counter(m.kind for m in mechanisms)
    mech_gaps = [m for m in mechanisms if m.verdict.cls == "gap"]
    ids = _verdict_ids(census)
    lines = [
        "# Failure points below Megatron-Bridge: the census",
        "",
        "Generated by `python -m devtools.census > docs/failure-points.md` from the data in",
        "`devtools/census/` (the installed files it scans, the reviewed inventory of sites, the verdicts",
        "written by reading the code); `tests/devtools/test_census.py` re-scans the installed Megatron-Bridge 0.6.2,",
        "Megatron-Core 0.19.2 and Transformer Engine 2.20.2, fails on any site the census does not map (a",
        "new `assert` after an upgrade shows up with its file, function and text) and keeps this page equal to",
        "the render.",
        "It is the inverse of [field-audit.md](field-audit.md) (fields -> consumers): failures -> rules.",
        "",
        f"**{total} sites** in {len(PATH_FILES)} files on the path packed, variable-length or CP-split data takes: "
        + ", ".join(f"{counts[c]} {c}" for c in CLASSES)
        + f" ({len(packing_gaps)} packing / CP gap sites, {len(general_gaps)} general). Plus {len(mechanisms)} "
        "mechanisms the scan cannot see ("
        + ", ".join(f"{mech_counts[k]} {k}" for k in MECHANISM_KINDS)
        + f"; {len(mech_gaps)} of them gaps).",
        "",
        "## Classes",
        "",
        "- **guarded**: a config that reaches the site is rejected at `validate()` by the plugin rule(s) named.",
        "- **megatron_validates**: Megatron-Bridge's own config-time check (`ConfigContainer.validate()`, a config "
        "class's `validate()` / `__post_init__`, `runtime_config_update`) rejects every config that would reach it.",
        "- **unreachable**: no config reaches it, for the reason given (an internal invariant, a call contract of "
        "Megatron-Core with TE, another code path, inference only, a version gate the pinned stack satisfies...).",
        "- **harmless**: reached, but it does not fail a run with well-formed inputs (a host read outside any "
        "graph, a check only malformed data trips, a detector of NaNs something else caused, logging).",
        "- **gap**: reachable from a config, fails on the GPU (or trains wrong), and no rule catches it yet; "
        "*general* gaps are on the path but not specific to packed / variable-length / CP data.",
        "",
        "## Sites by package and class",
        "",
        *_summary(census),
        "",
        "## Sites by stage of the path",
        "",
        *_by_stage(census),
        "",
        "## Sites by kind",
        "",
        *_by_kind(census),
        "",
        "What a kind is (the scanner's docstring, `census/scanner.py`): `assert` statements and `torch._assert`;",
        "`raise` with an exception (a bare re-raise is not a site); method calls `.item()`, `.tolist()`, `.cpu()`,",
        "`.numpy()`; `.to('cpu')`; `synchronize()`; value-dependent shapes (`nonzero`, `argwhere`, `unique`,",
        "`masked_select`, `bincount`, one-argument `torch.where`, `repeat_interleave` without `output_size` and",
        "with non-literal repeats); `tensor_bool` (`torch.equal` / `allclose`, and `.any()` / `.all()` or a",
        "comparison with a reduction in a boolean context); `scalar` (`int()` / `float()` / `bool()` of a",
        "reduction); `check_call` (`divide`, `ensure_divisibility`, `validate_result`, `assert_dim_for_fp8_exec`,",
        "`assert_viewless_tensor`).",
        "A site's identity is file + enclosing qualname + kind + `ast.unparse` text + occurrence: line moves and",
        "reformatting keep it, a changed condition or message does not. Not seen by the scan: `if t:` / `int(t)` /",
        "`t[mask]` on a plain name (types are unknown), implicit syncs inside library calls, and compiled checks;",
        "the ones that decide a config are listed by hand below.",
        "",
        "## Gaps: packed, variable-length and CP data",
        "",
        *_gap_table(packing_gaps),
        "",
        "## Gaps: general (on the path, not packing-specific)",
        "",
        *_gap_table(general_gaps),
        "",
        "## What the scan cannot see: silent discards, silent wrong training, compiled checks",
        "",
        *_mechanisms(),
        "",
        "## Rules and the sites they guard",
        "",
        *_rules_table(census),
        "",
        "## The path: files scanned",
        "",
        *_files(census),
        "",
        "## What stayed out of the path, and why",
        "",
        "| left out | why |",
        "|---|---|",
        *[f"| `{_cell(path)}` | {_cell(why)} |" for path, why in LEFT_OUT],
        "",
        "## Verdicts",
        "",
        "Every distinct verdict once, with the number of sites it covers; the site list below points here.",
        "",
        *_legend(census, ids),
        "",
        "## Every site, file by file",
        "",
        "Each line: the function, its sites that share one verdict (line, kind, text), the verdict's id and class.",
        *_sites(census, ids),
    ]
    return "\n".join(lines) + "\n"
