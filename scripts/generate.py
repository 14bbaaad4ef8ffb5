"""Every generated text of the README and docs/ (whole pages, marked sections, the counts a sentence quotes), from one
registry: rewrite what is stale, or (``--check``, which the tests run) list it and exit 1, writing nothing.

    .venv/bin/python scripts/generate.py [--check]

A generator is one entry of ``GENERATORS``, the file it writes and a function returning the text:

- ``Page(path, what, render)``: the whole file is ``render()``;
- ``Section(path, name, what, render)``: the lines between ``<!-- generated: NAME -->`` and
  ``<!-- /generated: NAME -->`` in the file (put the two marker lines in the page once, then run this script);
- ``Count(path, pattern, source)``: a sentence's numbers, one named group per key of ``source()``.

To add one: write the function (in the module that owns the data, or here), add its entry, run this script; a
section rendered by another module's function is ``Section(..., _call("package.module", "function"))``. Benchmark
figures are rendered from the results a benchmark recorded (``docs/bench/*.json``, rewritten by
``scripts/bench_*.py``); nothing here runs a benchmark, so the check stays a few seconds.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package, tests and devtools, whatever is installed
COMMAND = ".venv/bin/python scripts/generate.py"


# --- the three kinds of generated text -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """A whole file, ``render()``."""

    path: str
    what: str
    render: Callable[[], str]

    def apply(self, text: str) -> tuple[str, list[str]]:
        new = self.render()
        return new, [] if new == text else [f"{self.path}: stale ({self.what}){_first_difference(text, new)}"]


@dataclass(frozen=True)
class Section:
    """The lines between ``<!-- generated: NAME -->`` and ``<!-- /generated: NAME -->``, ``render()``."""

    path: str
    name: str
    what: str
    render: Callable[[], str]

    def apply(self, text: str) -> tuple[str, list[str]]:
        begin, end = f"<!-- generated: {self.name} -->\n", f"<!-- /generated: {self.name} -->"
        start, stop = text.find(begin), text.find(end)
        if start < 0 or stop < start:
            return text, [f"{self.path}: no section {begin.strip()} ... {end} ({self.what})"]
        start += len(begin)
        new = self.render().rstrip("\n") + "\n"
        if text[start:stop] == new:
            return text, []
        return text[:start] + new + text[stop:], [f"{self.path}: section {self.name!r} is stale ({self.what})"]


@dataclass(frozen=True)
class Count:
    """One sentence that quotes counts: ``pattern`` has a group per count, named by the key of ``source()``."""

    path: str
    pattern: str
    source: Callable[[], dict[str, int] | dict[str, str]]

    def apply(self, text: str) -> tuple[str, list[str]]:
        match = re.search(self.pattern, text)
        if match is None:
            return text, [f"{self.path}: no sentence matches {self.pattern!r}"]
        values, wrong = self.source(), []
        spans = sorted(((match.span(name), str(values[name]), name) for name in match.groupdict()), reverse=True)
        for (start, end), value, name in spans:
            if text[start:end] != value:
                wrong.append(f"{self.path}: {name} is {text[start:end]}, the count is {value}")
                text = text[:start] + value + text[end:]
        return text, wrong


Generator = Page | Section | Count


def _first_difference(old: str, new: str) -> str:
    old_lines, new_lines = old.splitlines(), new.splitlines()
    for number, (a, b) in enumerate(zip(old_lines, new_lines), 1):
        if a != b:
            return f"; first difference at line {number}"
    return f"; {len(old_lines)} lines, the render has {len(new_lines)}"


# --- where the texts come from ---------------------------------------------------------------------------------------


def _call(module: str, name: str) -> Callable[[], str]:
    """``module.name()``, imported when the text is wanted (most pages need no Megatron import)."""
    return lambda: getattr(importlib.import_module(module), name)()


@cache
def _script(name: str) -> ModuleType:
    """A script of ``scripts/`` as a module (its functions, not its ``main``)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@cache
def _bench(name: str) -> dict:
    return json.loads((ROOT / "docs" / "bench" / f"{name}.json").read_text())


def _failure_points() -> str:
    from devtools.census.census import build
    from devtools.census.render import render_markdown

    return render_markdown(build())


@cache
def _rules() -> dict[str, int]:
    from mbridge_seqpack.rules import all_rules

    rules = all_rules()
    return {
        "rules": len(rules),
        "errors": sum(1 for r in rules if r.severity == "error"),
        "advisories": sum(1 for r in rules if r.severity == "advisory"),
    }


@cache
def _census() -> dict[str, int]:
    from devtools.census.files import PATH_FILES

    sites = json.loads((ROOT / "devtools" / "census" / "inventory.json").read_text())["sites"]
    return {"sites": sum(len(found) for found in sites.values()), "files": len(PATH_FILES)}  # files on the path


@cache
def _reports() -> dict[str, int]:
    from tests.support.real_reports import REPORTS

    return {
        "reports": len({r.url for r in REPORTS}),
        "failures": sum(1 for r in REPORTS if r.expected),
        "near_misses": sum(1 for r in REPORTS if not r.expected),
    }


@cache
def _zoo() -> dict[str, int]:
    shipped = json.loads((ROOT / "tests" / "zoo" / "expected.json").read_text())["shipped"]
    return {
        "recipes": len(shipped),
        "not_built": sum(1 for v in shipped.values() if str(v.get("megatron", "")).startswith("not built")),
    }


@cache
def _runner() -> dict[str, int]:
    return {"cases": len(json.loads((ROOT / "tests" / "recipes" / "runner_fixes.json").read_text())["cases"])}


def _packer_figures() -> dict[str, str]:
    """The figures docs/packing.md's prose quotes from the packer benchmark."""
    report = _bench("bench_packer")
    peak, fill = report["peak_memory_x_input"], report["fill"]
    return {
        "peak": f"{peak['ratio']:.2f}",
        "peak_n": f"{peak['n'] // 1_000_000}M",
        "peak_capacity": f"{peak['capacity']:,}",
        "fill_n": f"{fill['n'] // 1000}k",
        "fill_capacity": f"{fill['capacity']:,}",
        "fill_mb": _fig(fill["megatron_bridge"], 3),
        "fill_ours": _fig(fill["mbridge_seqpack"]),
        "fill_ratio": f"{fill['ratio']:.0f}",
    }


def _tokenize_figures() -> dict[str, str]:
    """The figures of the tokenization goal's sentence in docs/packing.md."""
    results = _bench("bench_tokenize")["results"]
    plain, default = results["mbridge_seqpack_no_balance"], results["mbridge_seqpack"]
    return {
        "plain": f"{plain['over_encode']:.2f}",
        "default": f"{default['over_encode']:.2f}",
        "plain_s": f"{plain['best_seconds']:.1f}",
        "default_s": f"{default['best_seconds']:.1f}",
        "plain_cpu": f"{plain['cpu_over_encode']:.2f}",
        "default_cpu": f"{default['cpu_over_encode']:.2f}",
    }


def _fig(x: float, digits: int = 2) -> str:
    """``x`` to ``digits`` significant figures, trailing zeros kept (0.30, 0.021, 25)."""
    return f"{x:#.{digits}g}".rstrip(".")


# --- the README's headline figures, from the recorded benchmark results --------------------------------------------

#: issue #34's goal for ``pack``: within this multiple of the tokenizer's own batch encoding
TOKENIZE_GOAL = 1.3


def _packer_row() -> str:
    cells = {(r["capacity"], r["n"]): r for r in _bench("bench_packer")["grid"]}
    small, large = cells[(32768, 1_000_000)], cells[(32768, 10_000_000)]
    ours = [c["time"]["mbridge_seqpack"] for c in (small, large)]
    peer = [c["time"][c["fastest_peer"]] for c in (small, large)]
    return (
        f"| packing 1M / 10M lengths at 32k (`bench_packer.py`) | {_fig(ours[0])} s / {_fig(ours[1])} s | "
        f"LightBinPack (C++) {_fig(peer[0], 3)} s / {_fig(peer[1], 3)} s, Megatron-Bridge FFD "
        f"{_fig(small['time']['megatron_bridge.ffd'], 3)} s (1M) | **{small['ratio']:.1f}x** / "
        f"**{large['ratio']:.1f}x** (10M: {large['x_np_sort']:.1f}x the time of `np.sort`) |"
    )


def _fill_row() -> str:
    fill = _bench("bench_packer")["fill"]
    return (
        f"| packing + rows, {fill['n'] // 1000}k sequences at {fill['capacity'] // 1024}k | "
        f"{_fig(fill['mbridge_seqpack'])} s | Megatron-Bridge {_fig(fill['megatron_bridge'], 3)} s | "
        f"**{fill['ratio']:.0f}x** |"
    )


def _content_check_row() -> str:
    small, large = _bench("bench_content_check")["results"][:2]
    return (
        f"| launch check of a {small['gb']:.0f} GB / {large['gb']:.0f} GB pack at `validate()` "
        f"(`bench_content_check.py`) | {_fig(small['validate_ms'])} ms / {_fig(large['validate_ms'])} ms (footers by "
        f"content; every byte then on rank 0 while the model builds: {_fig(small['content_check_cold_s'])} s / "
        f"{_fig(large['content_check_cold_s'])} s) | full sha256 {_fig(small['whole_file_sha256_warm_s'])} s / "
        f"{_fig(large['whole_file_sha256_warm_s'])} s | O(metadata) |"
    )


def _tokenize_row() -> str:
    distinct, shared = _bench("bench_tokenize"), _bench("bench_tokenize_repeated_answers")
    ours = ("mbridge_seqpack_no_balance", "mbridge_seqpack")

    def pair(run: dict, key: str, bold: bool = False) -> str:
        text = " / ".join(f"{run[key][name]:.2f}x" for name in ours)
        return f"**{text}**" if bold else text

    wall_met = all(distinct["time_over_tokenizer_encode"][n] <= TOKENIZE_GOAL for n in ours)
    cpu_met = all(distinct["cpu_over_tokenizer_encode"][n] <= TOKENIZE_GOAL for n in ours)
    goal = "met" if wall_met else "met in CPU, not in wall" if cpu_met else "not met"
    over_mb, mb = "megatron_bridge_all_cores_over", "megatron_bridge_all_cores"
    return (
        f"| tokenize + pack, {distinct['records']:,} examples (`bench_tokenize.py`), `--no-balance` / default, each "
        f"run over the tokenizer's own batch encoding of the same texts beside it (median of {distinct['repeats']}) | "
        f"distinct text, idle machine: {pair(distinct, 'time_over_tokenizer_encode', True)} the encoding (CPU "
        f"{pair(distinct, 'cpu_over_tokenizer_encode')}; goal {TOKENIZE_GOAL}x: {goal}); answers shared: "
        f"{pair(shared, 'time_over_tokenizer_encode')} (of a {_fig(shared['tokenizer_encode_best_s'])} s encoding) | "
        f"Megatron-Bridge prep, 2 workers: {distinct['time_over_tokenizer_encode'][mb]:.2f}x; "
        f"{shared['time_over_tokenizer_encode'][mb]:.2f}x | "
        f"{pair(distinct, over_mb, True)}; {pair(shared, over_mb, True)} |"
    )


def _check_time_row() -> str:
    timed = _bench("bench_check")
    return (
        f"| equivalence check inside `validate()` (`bench_check.py`), the {timed['recipes']} packaged recipes "
        f"({timed['verdicts']} verdicts) | {_fig(timed['equivalence_s'])} s with the cache empty, "
        f"{_fig(timed['equivalence_warm_s'])} s cached, after the {_fig(timed['megatron_import_s'])} s Megatron "
        "import (packed vs unpacked per config, CP ranks as forked gloo processes; "
        "[docs/equivalence.md](docs/equivalence.md)) | none | - |"
    )


def headline_figures() -> str:
    """The README's table of benchmark figures, each read from the JSON its script recorded."""
    return "\n".join(
        [
            "| what | mbridge-seqpack | peer | ratio |",
            "|---|---|---|---|",
            _packer_row(),
            _fill_row(),
            _content_check_row(),
            _check_time_row(),
            _tokenize_row(),
        ]
    )


def _packing_table(name: str) -> Callable[[], str]:
    """One of ``scripts/bench_packer.py``'s docs/packing.md tables, from its recorded JSON."""

    def render() -> str:
        bench, report = _script("bench_packer"), _bench("bench_packer")
        return bench.table(report) if name == "grid" else getattr(bench, f"{name}_table")(report[name])

    return render


def _content_check_table() -> str:
    return _script("bench_content_check").table(_bench("bench_content_check"))


def _tokenize_table() -> str:
    return _script("bench_tokenize").table(_bench("bench_tokenize"), _bench("bench_tokenize_repeated_answers"))


def recipes_table() -> str:
    """docs/recipes.md's table of the packaged recipes: each built at its declared world size (``recipes --layout``'s
    rows), so a recipe added under ``recipes/`` is in the table with the layout it derives."""
    from mbridge_seqpack.cli.args import DEFAULT_RECIPE
    from mbridge_seqpack.cli.recipes import recipe_rows

    lines = ["| recipe | model | mode | row | layout | MBS | GPUs |", "|---|---|---|---|---|---|---|"]
    for row in recipe_rows():
        size = row["row_length"]
        seq = f"{size // 1024}k" if size % 1024 == 0 else str(size)
        parts = [f"TP{row['tp']}" + ("+SP" if row["sequence_parallel"] else "")]
        parts += [f"{name}{row[key]}" for name, key in (("PP", "pp"), ("CP", "cp"), ("EP", "ep")) if row[key] > 1]
        parts.append(f"DP{row['dp']}")
        name = f"`{row['name']}`" + (" (the default)" if row["name"] == DEFAULT_RECIPE else "")
        lines.append(
            f"| {name} | {row['model']} | {row['mode']} | {seq} | {' '.join(parts)} | {row['micro_batch_size']} "
            f"| {row['world_size']} |"
        )
    return "\n".join(lines)


# --- docs/architecture.md: the package diagram and table, from the code ----------------------------------------------


def _summary(path: Path) -> str:
    """A module's docstring's first sentence: one table cell, so one line of at most 120 characters."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    match = re.match(r"(.+?[.!?])(\s|$)", paragraph)
    sentence = (match.group(1) if match else paragraph).replace("``", "`")
    if not sentence or len(sentence) > 120:
        raise SystemExit(f"{path.relative_to(ROOT)}: give its docstring a first sentence of at most 120 characters")
    return sentence


def _layers() -> tuple[list[str], list[str]]:
    """The diagram's boxes (subpackages and the top-level modules that import one) and the core modules below all."""
    from devtools.import_graph import package_graph, subpackages

    graph, folders = package_graph(), subpackages()
    modules = sorted(name for name in graph if name not in folders and not name.startswith("__"))
    core = [m for m in modules if not graph[m] & set(folders)]
    return [*folders, *(m for m in modules if m not in core)], core


def package_diagram() -> str:
    """Mermaid: which package imports which (function-level imports included), from ``devtools/import_graph.py``."""
    from devtools.import_graph import package_graph

    graph = package_graph()
    boxes, core = _layers()
    lines = ["```mermaid", "flowchart TD"]
    lines += [f"    {box} --> {to}" for box in boxes for to in sorted(graph[box]) if to in boxes]
    lines += [
        "```",
        "",
        f"Every box may also import the core modules, which import no package: {', '.join(f'`{m}`' for m in core)}.",
    ]
    return "\n".join(lines)


def package_table() -> str:
    """One row per package and top-level module: its docstring's first sentence."""
    from devtools.import_graph import PACKAGE

    boxes, core = _layers()
    rows = ["| package | what it holds |", "|---|---|"]
    for name in [*boxes, *core]:
        folder = PACKAGE / name
        if folder.is_dir():
            label, path = f"`{name}/`", folder / "__init__.py"
        else:
            label, path = f"`{name}.py`", PACKAGE / f"{name}.py"
        rows.append(f"| {label} | {_summary(path)} |")
    return "\n".join(rows)


def _status_line() -> str:
    """The status line of a command that loads Megatron-Bridge with its bytecode cached (cli/startup.py), as shown."""
    from mbridge_seqpack.cli import startup

    name, _, why = startup.SLOW_IMPORTS["megatron"].partition("; ")
    return f"```\nmbridge-seqpack: loading {name} ...\n  {why}\n```"


def _import_seconds() -> dict[str, str]:
    """A bare Megatron-Bridge import, as scripts/bench_startup.py recorded it (the status line quotes the same)."""
    record = _bench("bench_startup")["median"]
    return {
        "cached": str(round(record["import megatron.bridge, bytecode cached"]["wall_s"])),
        "uncached": str(round(record["import megatron.bridge"]["wall_s"])),
    }


def suite_times() -> str:
    """docs/development.md's suite times per tier, as scripts/bench_suite.py recorded them."""
    path = ROOT / "docs" / "bench" / "bench_suite.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    what = {"fast": "`bash scripts/test.sh --fast`", "full": "`bash scripts/test.sh` (the whole suite)"}
    lines = []
    for tier, command in what.items():
        run = record.get(tier)
        if run is None:
            lines.append(f"- {command}: not recorded yet (`scripts/bench_suite.py --tier {tier}`)")
            continue
        minutes = f"{run['seconds'] / 60:.1f} min"
        lines.append(
            f"- {command}: {minutes} on {run['cores']} cores ({run['date']}): {'; then '.join(run['summaries'])}"
        )
    return "\n".join(lines)


# --- the registry ----------------------------------------------------------------------------------------------------

GENERATORS: tuple[Generator, ...] = (
    Page("docs/rules.md", "the rule catalog", _call("mbridge_seqpack.rules.catalog", "render_markdown")),
    Page(
        "docs/graph-paths.md",
        "the CUDA-graph path matrix",
        _call("mbridge_seqpack.analysis.graph_paths", "render_markdown"),
    ),
    Page("docs/real-reports.md", "the public reports", _call("tests.support.real_reports", "render_markdown")),
    Page("docs/field-audit.md", "the field audit", _call("devtools.field_uses", "render_markdown")),
    Page("docs/failure-points.md", "the failure-point census", _failure_points),
    Section("README.md", "headline-figures", "docs/bench/*.json", headline_figures),
    Section(
        "docs/equivalence.md",
        "equivalence-table",
        "docs/bench/equivalence_table.json, from scripts/equivalence_table.py",
        lambda: _script("equivalence_table").section(),
    ),
    Section("docs/packing.md", "content-check", "docs/bench/bench_content_check.json", _content_check_table),
    Section("docs/packing.md", "packer-grid", "docs/bench/bench_packer.json", _packing_table("grid")),
    Section("docs/packing.md", "work-balance", "docs/bench/bench_packer.json", _packing_table("balance")),
    Section("docs/packing.md", "builder-prep", "docs/bench/bench_packer.json", _packing_table("builder_prep")),
    Section("docs/packing.md", "tokenize", "docs/bench/bench_tokenize*.json", _tokenize_table),
    Section("docs/recipes.md", "recipe-table", "the packaged recipes, each built (recipes --layout)", recipes_table),
    Section(
        "docs/development.md", "suite-times", "docs/bench/bench_suite.json, from scripts/bench_suite.py", suite_times
    ),
    Section("docs/architecture.md", "package-diagram", "the import graph", package_diagram),
    Section("docs/architecture.md", "package-table", "the package docstrings", package_table),
    # A section another module renders: Section("docs/<page>.md", "<name>", "<its data>", _call("<module>", "<fn>")),
    # with the two marker lines put in the page once (e.g. the equivalence table of the equivalence checks).
    Count(
        "README.md",
        r"the rule catalog: (?P<rules>\d+) rules \((?P<errors>\d+) errors, (?P<advisories>\d+) advisories\)",
        _rules,
    ),
    Count("README.md", r"Transformer Engine \((?P<sites>\d+) sites, each mapped", _census),
    Count(
        "README.md",
        r"(?P<reports>\d+) public reports \((?P<failures>\d+) failures, (?P<near_misses>\d+) near-misses\), "
        r"Megatron-Bridge's (?P<recipes>\d+) recipes",
        lambda: {**_reports(), **_zoo()},
    ),
    Count("docs/evidence.md", r"from (?P<reports>\d+) public bug reports", _reports),
    Count("docs/evidence.md", r"`ConfigContainer`: (?P<failures>\d+) failures, each rejected", _reports),
    Count("docs/evidence.md", r"and (?P<near_misses>\d+) working near-misses", _reports),
    Count("docs/evidence.md", r"TE \((?P<sites>\d+) sites in\s+(?P<files>\d+) files\)", _census),
    Count("docs/evidence.md", r"The (?P<not_built>\d+) recipes not built", _zoo),
    Count("docs/cli.md", r"On those (?P<cases>\d+) cases, with the runner", _runner),
    Count("docs/cli.md", r"the recipe, (?P<rules>\d+) rules, Megatron-Bridge's", _rules),
    Section("docs/cli.md", "status-line", "cli/startup.py SLOW_IMPORTS", _status_line),
    Count(
        "docs/quickstart.md",
        r"The rule catalog: (?P<rules>\d+) rules \((?P<errors>\d+) errors, (?P<advisories>\d+) advisories\)",
        _rules,
    ),
    Count(
        "README.md",
        r"Importing\s+Megatron-Bridge took (?P<cached>\d+) s \((?P<uncached>\d+) s without cached bytecode\)",
        _import_seconds,
    ),
    Count(
        "docs/packing.md",
        r"Peak memory of `pack_lengths` on (?P<peak_n>\w+) lengths at (?P<peak_capacity>[\d,]+): "
        r"\*\*(?P<peak>[\d.]+)x",
        _packer_figures,
    ),
    Count(
        "docs/packing.md",
        r"Packing plus row building, (?P<fill_n>\w+)\s+sequences at (?P<fill_capacity>[\d,]+): .*? "
        r"(?P<fill_mb>[\d.]+) s, ours (?P<fill_ours>[\d.]+) s\s+\(\*\*(?P<fill_ratio>\d+)x\*\*\)",
        _packer_figures,
    ),
    Count(
        "docs/packing.md",
        r"idle machine: (?P<plain>[\d.]+)x \(`--no-balance`\) and (?P<default>[\d.]+)x\s+\(default\), "
        r"(?P<plain_s>[\d.]+) / (?P<default_s>[\d.]+) s against .*?; in CPU seconds it is, "
        r"(?P<plain_cpu>[\d.]+)x / (?P<default_cpu>[\d.]+)x",
        _tokenize_figures,
    ),
)


def generate(root: Path = ROOT, write: bool = True, generators: tuple[Generator, ...] = GENERATORS) -> list[str]:
    """Apply every generator to its file under ``root`` (writing the result unless ``write`` is false): what was
    stale, one line each."""
    stale = []
    for path in dict.fromkeys(g.path for g in generators):
        target = root / path
        before = target.read_text() if target.exists() else ""
        text = before
        for generator in (g for g in generators if g.path == path):
            text, problems = generator.apply(text)
            stale += problems
        if write and text != before:
            target.write_text(text)
    return stale


def main(argv: list[str] | None = None, root: Path = ROOT, generators: tuple[Generator, ...] = GENERATORS) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list what is stale and exit 1; write nothing")
    args = parser.parse_args(argv)
    stale = generate(root, write=not args.check, generators=generators)
    for line in stale:
        print(line)
    if args.check and stale:
        print(f"{len(stale)} generated texts are stale; regenerate them with: {COMMAND}")
        return 1
    left = (
        [] if args.check else generate(root, write=False, generators=generators)
    )  # what writing cannot fix: a marker or sentence gone
    if left:
        print(f"{len(left)} not written: put the marker lines or the sentence back in the page")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
