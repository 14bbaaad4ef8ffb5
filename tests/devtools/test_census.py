"""The failure-point census is complete for the installed packages and the page is its render.

The drift test re-scans the installed Megatron-Bridge / Megatron-Core / TE files on the path and fails on any site
the census does not map (a new ``assert`` after an upgrade is listed with its file, function and text), on any
inventory entry or verdict that no longer matches a site, and on a site two overrides judge differently. Planted
copies show the test catches an added site and a changed condition, and ignores a moved line. No Megatron import:
the census reads the installed files as text.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.census.census import Census, build, load_inventory, scan_path
from devtools.census.files import LEFT_OUT, PATH_FILES, PathFile, site_packages
from devtools.census.mapping import MAPPING
from devtools.census.render import render_markdown
from devtools.census.scanner import KINDS, scan_source
from devtools.census.silent import UNCONSUMED_FIELD_RULES, all_mechanisms
from devtools.field_uses import FIELD_USES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def census() -> Census:
    return build()


def test_every_site_on_the_path_is_mapped(census: Census) -> None:
    assert census.problems() == []
    assert len(census.mapped) == len(load_inventory())


def test_docs_page_is_the_render(census: Census) -> None:
    assert (ROOT / "docs" / "failure-points.md").read_text() == render_markdown(census)
    evidence = (ROOT / "docs" / "evidence.md").read_text()
    assert f"({len(census.mapped)} sites in\n{len(PATH_FILES)} files)" in evidence


def test_verdict_anchors_are_stable_names_not_positions(census: Census) -> None:
    """A verdict's anchor is its name in the mapping or its first site's file and function: the sites of one file
    gone (a file upgraded away), every verdict with no site there keeps its anchor."""
    from dataclasses import replace

    from devtools.census.render import _verdict_ids

    ids = _verdict_ids(census)
    assert len(set(ids.values())) == len(ids)
    assert ids[id(next(m for m in census.mapped if m.site.qualname == "GPTSFTDatasetConfig.validate").verdict)] == (
        "gpt-sft-validate"
    )
    from devtools.census.mapping.common import INVARIANT

    assert ids[id(INVARIANT)] == "invariant"
    gone = PATH_FILES[0].path
    rest = replace(census, mapped=[m for m in census.mapped if m.site.file != gone])
    kept = {id(m.verdict) for m in rest.mapped} - {id(m.verdict) for m in census.mapped if m.site.file == gone}
    assert kept and {k: v for k, v in _verdict_ids(rest).items() if k in kept} == {k: ids[k] for k in kept}


def test_every_rule_id_named_exists(census: Census) -> None:
    from mbridge_seqpack.rules.catalog import all_rules

    catalog = {r.rule_id for r in all_rules()}
    named = {r for m in census.mapped for r in m.verdict.rules} | {
        r for m in all_mechanisms() for r in m.verdict.rules
    }
    assert named - catalog == set()


def test_every_path_file_exists_and_its_listed_functions_too() -> None:
    base = site_packages()
    for f in PATH_FILES:
        source = (base / f.path).read_text()
        defined = set()
        stack: list[tuple[ast.AST, str]] = [(ast.parse(source), "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    defined.add(name)
                    stack.append((child, name + "."))
        assert [q for q in f.only if q not in defined] == [], f.path
    assert len({f.path for f in PATH_FILES}) == len(PATH_FILES)
    assert all(why.strip() for _, why in LEFT_OUT)


def test_hand_listed_mechanisms_point_at_installed_code() -> None:
    base = site_packages()
    for m in all_mechanisms():
        if not m.needle:
            continue
        source = (base / m.file).read_text()
        assert m.needle in source, (m.name, m.file, m.needle)
        assert m.function.rsplit(".", 1)[-1] in source, (m.name, m.function)


def test_fields_consumed_nowhere_are_census_discards() -> None:
    unconsumed = {u.field for u in FIELD_USES if not u.used}
    assert unconsumed == set(UNCONSUMED_FIELD_RULES)


def _one_file(path: str) -> tuple[PathFile, list]:
    entry = next(f for f in PATH_FILES if f.path == path)
    return entry, [g for g in MAPPING if g.file == path]


def _planted(tmp_path: Path, path: str, edit) -> list:  # noqa: ANN001
    """Scan a copy of one installed path file after ``edit(source) -> source``, as the drift test scans."""
    entry, _ = _one_file(path)
    target = tmp_path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(edit((site_packages() / path).read_text()))
    return scan_path(root=tmp_path, files=[entry])


def _build_one(path: str, sites: list) -> Census:
    _, groups = _one_file(path)
    inventory = {k for k in load_inventory() if k[0] == path}
    return build(sites, inventory, groups)


def test_a_planted_assert_is_reported_unmapped_and_a_moved_line_is_not(tmp_path: Path) -> None:
    path = "megatron/core/packed_seq_params.py"
    anchor = "        cu_seqlens = (\n"

    def plant(source: str) -> str:
        assert source.count(anchor) == 1
        planted = "        assert self.total_tokens != 7, 'planted'\n"
        return "# a comment that moves every line down\n\n" + source.replace(anchor, planted + anchor)

    census = _build_one(path, _planted(tmp_path, path, plant))
    assert [(u.site.file, u.site.qualname, u.site.kind, u.site.text, u.why) for u in census.unmapped] == [
        (
            path,
            "PackedSeqParams.__post_init__",
            "assert",
            "assert self.total_tokens != 7, 'planted'",
            "not in the census inventory",
        )
    ]
    assert census.stale_inventory == [] and census.stale_groups == [] and census.stale_overrides == []
    assert len(census.mapped) == 1  # the repeat_interleave site, two lines further down, keeps its identity
    assert "packed_seq_params.py" in census.problems()[0] and "planted" in census.problems()[0]


def test_a_changed_condition_is_a_new_site_and_leaves_its_old_entry_stale(tmp_path: Path) -> None:
    path = "megatron/core/tensor_parallel/mappings.py"
    old = "        dim_size % world_size == 0\n"  # inside _split_along_first_dim's multi-line assert

    def change(source: str) -> str:
        assert old in source
        return source.replace(old, "        dim_size % (2 * world_size) == 0\n", 1)

    census = _build_one(path, _planted(tmp_path, path, change))
    assert [(u.site.qualname, u.site.kind) for u in census.unmapped] == [("_split_along_first_dim", "assert")]
    assert [k[1:3] for k in census.stale_inventory] == [("_split_along_first_dim", "assert")]


def test_a_verdict_for_a_function_that_is_gone_is_stale(tmp_path: Path) -> None:
    path = "megatron/core/packed_seq_params.py"
    sites = _planted(tmp_path, path, lambda s: s.replace("repeat_interleave(", "repeat_interleave_renamed(", 1))
    census = _build_one(path, sites)
    assert census.mapped == [] and census.unmapped == []
    assert [g.qualname for g in census.stale_groups] == ["PackedSeqParams.__post_init__"]
    assert len(census.stale_inventory) == 1


SAMPLE = """
import torch

def f(x, n, cu, mask):
    assert x.dim() == 2, "2D"
    raise ValueError("bad")

class C:
    def g(self, t, cu):
        try:
            pass
        except KeyError:
            raise
        a = t.item(); b = t.tolist(); c = t.cpu(); d = t.detach().numpy(); e = t.to("cpu")
        torch.cuda.synchronize()
        idx = torch.nonzero(t); u = t.unique(); w = torch.where(t > 0)
        r1 = torch.repeat_interleave(t, cu); r2 = t.repeat_interleave(2); r3 = t.repeat_interleave(cu, output_size=8)
        if (t > 0).any():
            pass
        if torch.equal(t, cu) and not t.all():
            pass
        k = int(t.sum()); divide(n, 2)
        torch.where(t > 0, t, cu)
        if t:
            pass
        return lambda: torch._assert(t.numel() > 0, "lambda")
"""


def test_scanner_kinds_on_a_sample() -> None:
    sites = scan_source(SAMPLE, "sample.py")
    got = [(s.qualname, s.kind, s.text) for s in sites]
    assert got == [
        ("f", "assert", "assert x.dim() == 2, '2D'"),
        ("f", "raise", "raise ValueError('bad')"),
        ("C.g", "item", "t.item()"),
        ("C.g", "tolist", "t.tolist()"),
        ("C.g", "cpu", "t.cpu()"),
        ("C.g", "numpy", "t.detach().numpy()"),
        ("C.g", "to_cpu", "t.to('cpu')"),
        ("C.g", "sync", "torch.cuda.synchronize()"),
        ("C.g", "dynamic_shape", "torch.nonzero(t)"),
        ("C.g", "dynamic_shape", "t.unique()"),
        ("C.g", "dynamic_shape", "torch.where(t > 0)"),
        ("C.g", "dynamic_shape", "torch.repeat_interleave(t, cu)"),
        ("C.g", "tensor_bool", "(t > 0).any()"),
        ("C.g", "tensor_bool", "torch.equal(t, cu)"),
        ("C.g", "tensor_bool", "t.all()"),
        ("C.g", "scalar", "int(t.sum())"),
        ("C.g", "check_call", "divide(n, 2)"),
        ("C.g.<lambda>", "assert", "torch._assert(t.numel() > 0, 'lambda')"),
    ]
    assert {s.kind for s in sites} <= set(KINDS)
    twice = scan_source(SAMPLE.replace("    assert x.dim()", "    assert x.dim() == 2, '2D'\n    assert x.dim()"), "s")
    assert [(s.kind, s.occurrence) for s in twice[:2]] == [("assert", 0), ("assert", 1)]


def test_the_census_imports_no_megatron() -> None:
    code = (
        "import sys; from devtools.census.__main__ import main; "
        "import devtools.census.render, devtools.census.mapping; "
        "assert not [m for m in sys.modules if m.startswith(('megatron', 'transformer_engine', 'torch'))], "
        "sorted(m for m in sys.modules if m.startswith(('megatron', 'transformer_engine', 'torch')))[:5]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
