"""Every generated page, section and count of the README and docs/ is the render of ``scripts/generate.py``, and a
stale one is named with the command that fixes it (checked on copies of the pages, never the real files)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("generate", ROOT / "scripts" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["generate"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


generate = _generator()


def _copy(tmp_path: Path, *paths: str) -> Path:
    for path in paths:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text((ROOT / path).read_text())
    return tmp_path


def test_nothing_generated_is_stale(capsys) -> None:
    assert generate.main(["--check"]) == 0, capsys.readouterr().out


def test_a_stale_section_is_named_with_the_command_and_regenerated(tmp_path: Path, capsys) -> None:
    (section,) = [g for g in generate.GENERATORS if getattr(g, "name", None) == "package-table"]
    root = _copy(tmp_path, section.path)
    page = root / section.path
    fresh = page.read_text()
    page.write_text(fresh.replace("| `placement/` |", "| `placement/` | (edited by hand)", 1))
    assert generate.main(["--check"], root=root, generators=(section,)) == 1
    assert capsys.readouterr().out.splitlines() == [
        "docs/architecture.md: section 'package-table' is stale (the package docstrings)",
        "1 generated texts are stale; regenerate them with: .venv/bin/python scripts/generate.py",
    ]
    assert page.read_text() != fresh  # --check writes nothing
    assert generate.main([], root=root, generators=(section,)) == 0
    assert page.read_text() == fresh


def test_a_stale_page_names_its_first_different_line(tmp_path: Path) -> None:
    (page,) = [g for g in generate.GENERATORS if g.path == "docs/real-reports.md"]
    root = _copy(tmp_path, page.path)
    lines = (root / page.path).read_text().splitlines(keepends=True)
    (root / page.path).write_text("".join(lines[:4] + ["an edit by hand\n"] + lines[5:]))
    assert generate.generate(root, write=False, generators=(page,)) == [
        "docs/real-reports.md: stale (the public reports); first difference at line 5"
    ]
    generate.generate(root, generators=(page,))
    assert (root / page.path).read_text() == (ROOT / page.path).read_text()


def test_a_page_without_its_markers_is_reported_and_left(tmp_path: Path, capsys) -> None:
    section = generate.Section("docs/x.md", "demo", "a demo", lambda: "text")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("no markers here\n")
    assert generate.main([], root=tmp_path, generators=(section,)) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        "1 not written: put the marker lines or the sentence back in the page"
    )
    assert (tmp_path / "docs" / "x.md").read_text() == "no markers here\n"
    (tmp_path / "docs" / "x.md").write_text("a\n<!-- generated: demo -->\nold\n<!-- /generated: demo -->\nb\n")
    assert generate.main([], root=tmp_path, generators=(section,)) == 0
    assert (tmp_path / "docs" / "x.md").read_text() == (
        "a\n<!-- generated: demo -->\ntext\n<!-- /generated: demo -->\nb\n"
    )


def test_a_drifted_count_is_named_and_put_right() -> None:
    from mbridge_seqpack.rules import all_rules

    readme = (ROOT / "README.md").read_text()
    rules = len(all_rules())
    drifted = readme.replace(f"the rule catalog: {rules} rules", f"the rule catalog: {rules + 1} rules", 1)
    assert drifted != readme
    (count,) = [
        g
        for g in generate.GENERATORS
        if isinstance(g, generate.Count) and "rule catalog" in g.pattern and g.path == "README.md"
    ]
    fixed, wrong = count.apply(drifted)
    assert wrong == [f"README.md: rules is {rules + 1}, the count is {rules}"]
    assert fixed == readme


def test_a_sentence_that_no_longer_matches_is_reported() -> None:
    (count,) = [
        g
        for g in generate.GENERATORS
        if isinstance(g, generate.Count) and g.path == "docs/cli.md" and "cases" in g.pattern
    ]
    assert count.apply("nothing here") == ("nothing here", [f"docs/cli.md: no sentence matches {count.pattern!r}"])


def test_benchmark_figures_keep_their_significant_zeros() -> None:
    assert [generate._fig(x) for x in (0.2997, 0.0214, 24.57, 1.7016)] == ["0.30", "0.021", "25", "1.7"]
    assert generate._fig(14.499, 3) == "14.5"


def test_the_package_diagram_is_the_import_graph() -> None:
    """Every subpackage is a row of the table; an edge is drawn exactly where a package imports another."""
    from devtools.import_graph import package_graph, subpackages

    table, diagram = generate.package_table(), generate.package_diagram()
    assert all(f"| `{name}/` |" in table for name in subpackages())
    graph, (boxes, core) = package_graph(), generate._layers()
    drawn = {tuple(line.split(" --> ")) for line in diagram.replace("    ", "").splitlines() if " --> " in line}
    assert drawn == {(box, to) for box in boxes for to in graph[box] if to in boxes}
    assert ("pipeline", "tokenization") in drawn and ("tokenization", "pipeline") not in drawn
    assert {"errors", "textout"} <= set(core) and "hook" in boxes  # hook imports rules: not core


def test_a_long_docstring_summary_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    module = tmp_path / "m.py"
    module.write_text('"""' + "word " * 30 + 'end."""\n')
    with pytest.raises(SystemExit, match=r"^m.py: give its docstring a first sentence of at most 120 characters$"):
        generate._summary(module)


def test_adding_a_rule_names_the_one_command() -> None:
    assert generate.COMMAND in (ROOT / "docs" / "adding-a-rule.md").read_text()
