"""Every config field the rules read is consumed at run time by the installed Megatron code (or listed as
consumed nowhere, with the proof), and ``docs/field-audit.md`` is generated from the table."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from devtools.field_uses import FIELD_USES, render_markdown
from mbridge_seqpack.rules.catalog import FIELD_TYPES

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "mbridge_seqpack" / "rules"
#: dotted config paths as the rule modules spell them (fields, fix assignments, evidence)
FIELD_LITERAL = re.compile(r"\"((?:model|dataset|train|ddp|dist|validation)\.[A-Za-z_]+(?:\.[A-Za-z_]+)*)\"")
#: paths that name a container or a rule id, not a field
NOT_FIELDS = {"dataset.offline_packing_specs", "dataset.dataset_kwargs", "model.finalize"}
NOT_FIELDS |= {"model.offline_packing_opt_out", "model.in_batch_packing_opt_out"}
NOT_FIELDS |= {"model.core_attention_packing", "model.core_attention_cp"}


def _megatron_dir() -> Path:
    spec = importlib.util.find_spec("megatron")
    assert spec is not None and spec.submodule_search_locations, "megatron is not installed"
    return next(Path(p) for p in spec.submodule_search_locations if (Path(p) / "bridge").is_dir())


def _normalise(path: str) -> str:
    """``dataset.dataset_kwargs.pad_to_max_length`` (an assignment path) as the table spells it."""
    head = "dataset.dataset_kwargs."
    return f"dataset.dataset_kwargs['{path[len(head) :]}']" if path.startswith(head) else path


def test_docs_page_is_current() -> None:
    assert (ROOT / "docs" / "field-audit.md").read_text() == render_markdown()


def _outside_reads(source: str) -> str:
    """A rule module's source without its read declarations (``@rule(reads=...)`` and the ``*_READS`` groups they
    share): a declared field is typed, or read as it is."""
    tree = ast.parse(source)
    declared = [
        ast.get_source_segment(source, k.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for k in node.keywords
        if k.arg == "reads"
    ]
    declared += [
        ast.get_source_segment(source, node.value)
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id.endswith("_READS")
    ]
    for text in declared:
        source = source.replace(text or "", "")
    return source


def test_every_field_a_rule_names_is_audited() -> None:
    listed = {use.field for use in FIELD_USES}
    named = {_normalise(m) for f in RULES.glob("*.py") for m in FIELD_LITERAL.findall(_outside_reads(f.read_text()))}
    typed = {path for path in FIELD_TYPES if path != "dataset.dataset_kwargs"}
    assert (named | typed) - NOT_FIELDS - listed == set()


@pytest.mark.parametrize("use", [u for u in FIELD_USES if u.used], ids=lambda u: u.field)
def test_cited_consumer_names_the_field(use) -> None:  # noqa: ANN001
    source = (_megatron_dir() / use.consumer).read_text()
    assert re.search(rf"\b{re.escape(use.needle)}\b", source), f"{use.consumer} never names {use.needle}"


def test_eval_context_parallel_size_is_consumed_nowhere() -> None:
    """Only config.py reads it, and nothing gives GlobalState an eval process-group collection."""
    megatron = _megatron_dir()
    readers = {
        p.relative_to(megatron).as_posix()
        for p in megatron.rglob("*.py")
        if "eval_context_parallel_size" in p.read_text()
    }
    assert readers <= {"bridge/training/config.py", "bridge/training/state.py"}
    assigns = re.compile(r"_eval_pgs\s*=\s*(?!None\b)")
    assert [p for p in (megatron / "bridge").rglob("*.py") if assigns.search(p.read_text())] == []
