"""The test tree covers the catalog: every rule has a case (``tests/support/rule_cases/<family>.py``, run by
``tests/rules/test_<family>.py``), and every error rule has an evidence test: one marked
``@pytest.mark.evidence("<rule id>", ...)`` that runs the Megatron, Megatron-Bridge or Transformer Engine code the
rule's evidence names and shows it failing where the rule fires. Read from the source: no Megatron import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mbridge_seqpack.errors import ERROR
from mbridge_seqpack.rules import all_rules

TESTS = Path(__file__).resolve().parents[1]
CASES = TESTS / "support" / "rule_cases"

#: error rules with no evidence test, each with why (the failing code needs a GPU, several ranks or another
#: Megatron-Core); the rule's evidence cites the code that fails instead. An evidence test for one removes it from here
NO_EVIDENCE_TEST = {
    "offline.alignment_multiple": "TE's thd_get_partitioned_indices is a CUDA kernel "
    "(tests/equivalence/test_equivalence_cp.py::test_te_kernel_does_not_run_on_this_cpu)",
    "mtp.packed_context_parallel": "the MTP roll's CP branch needs a CP group and TE's THD split, a CUDA kernel",
    "moe.hybridep_uneven_inputs": "HybridEP's dispatcher (DeepEP's hybrid kernels) runs on GPUs only",
    "tp_comm_overlap.mxfp8_tokens": "TE's userbuffers (the TP overlap buffers) are CUDA memory, made at launch",
    "cuda_graphs.te_capture_width": "the failing copy_ is in TE's graph replay, after a capture on a GPU",
    "cp.hierarchical_sizes_required": "the crash is TE attention built with cp_group=None at model build on GPUs",
    "cp.thd_mcore_version": "the failing import is of a Megatron-Core older than 0.18, not the pinned one",
    "pipeline.interleaved_micro_batches": "the interleaved schedule allocates on CUDA before its check raises",
    "pipeline.variable_shapes_interleaved_pp2": "the shape exchange between PP ranks (a hang) needs several ranks",
    "fixed_width.gpt_sft_pipeline": "the p2p buffers between PP ranks are sized on GPUs, over several ranks",
}


def _case_rule_ids(tree: ast.AST) -> list[str]:
    """The rule ids the ``Case(...)`` entries of a module name."""
    named = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Case":
            first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "rule_id"), None)
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                named.append(first.value)
    return named


def _rule_ids_with_a_case() -> set[str]:
    """The rule ids the test tree's ``Case(...)`` entries name, read from the source (no test imports another)."""
    return {rule_id for path in TESTS.rglob("*.py") for rule_id in _case_rule_ids(ast.parse(path.read_text()))}


def _constants(tree: ast.Module) -> dict[str, list[str]]:
    """A module's top-level tuples (or lists) of strings, by name: a marker may name its rules ``*NAME``."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Tuple | ast.List):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            values = [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if isinstance(target, ast.Name) and len(values) == len(node.value.elts):
                found[target.id] = values
    return found


def _marked_rule_ids(decorator: ast.expr, constants: dict[str, list[str]]) -> list[str]:
    """The rule ids of an ``@pytest.mark.evidence(...)`` decorator; none for any other decorator."""
    if not (isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "pytest.mark.evidence"):
        return []
    named = []
    for arg in decorator.args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            named.append(arg.value)
        elif isinstance(arg, ast.Starred) and isinstance(arg.value, ast.Name):
            named += constants[arg.value.id]
        else:
            raise AssertionError(f"evidence marker argument not a rule id: {ast.unparse(arg)}")
    return named


def evidence_tests(source: str, where: str) -> dict[str, list[str]]:
    """Rule id -> the tests of ``source`` marked as its evidence (``where::test_name``)."""
    tree = ast.parse(source)
    constants = _constants(tree)
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
            for decorator in node.decorator_list:
                for rule_id in _marked_rule_ids(decorator, constants):
                    found.setdefault(rule_id, []).append(f"{where}::{node.name}")
    return found


def _evidence_in_the_tree() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        for rule_id, tests in evidence_tests(path.read_text(), str(path.relative_to(TESTS.parent))).items():
            found.setdefault(rule_id, []).extend(tests)
    return found


def test_every_rule_has_a_case() -> None:
    """A rule is added with its case: a real config that breaks it (and the fix that repairs it)."""
    named = _rule_ids_with_a_case()
    assert [r.rule_id for r in all_rules() if r.rule_id not in named] == []


def test_each_family_has_its_cases_module_and_test_file() -> None:
    """A case sits in the module its rule id's prefix names, and each such module has the test file that runs it."""
    misplaced = {
        (path.name, rule_id)
        for path in CASES.glob("*.py")
        for rule_id in _case_rule_ids(ast.parse(path.read_text()))
        if rule_id.split(".")[0] != path.stem
    }
    assert misplaced == set()
    families = {p.stem for p in CASES.glob("*.py") if p.stem != "__init__"}
    runs = {p.stem.removeprefix("test_"): p.read_text() for p in TESTS.joinpath("rules").glob("test_*.py")}
    assert {f for f in families if f"tests.support.rule_cases.{f} import CASES" not in runs.get(f, "")} == set()


def test_every_error_rule_has_an_evidence_test_or_says_why_not() -> None:
    found = _evidence_in_the_tree()
    rules = {r.rule_id: r for r in all_rules()}
    assert sorted(set(found) - set(rules)) == []  # a marker names a rule the catalog has
    errors = {rule_id for rule_id, r in rules.items() if r.severity == ERROR}
    assert sorted(errors - set(found) - set(NO_EVIDENCE_TEST)) == []
    assert sorted(set(NO_EVIDENCE_TEST) - errors) == []  # an exception is an error rule ...
    assert sorted(set(NO_EVIDENCE_TEST) & set(found)) == []  # ... that has no evidence test since
    assert all(len(why) > 20 for why in NO_EVIDENCE_TEST.values())


SAMPLE = """
RULES = ("cp.a", "cp.b")


@pytest.mark.evidence("cp.c")
@pytest.mark.parametrize("x", [1])
def test_one(x):
    pass


@pytest.mark.slow
@pytest.mark.evidence(*RULES)
def test_two():
    pass


@pytest.mark.evidence("cp.d")
def helper():
    pass


def test_three():
    pytest.mark.evidence("cp.e")
"""


def test_the_scan_reads_literal_and_named_rule_ids_on_tests_only() -> None:
    assert evidence_tests(SAMPLE, "t.py") == {
        "cp.c": ["t.py::test_one"],
        "cp.a": ["t.py::test_two"],
        "cp.b": ["t.py::test_two"],
    }
    with pytest.raises(AssertionError, match=r"not a rule id: rule_ids\(\)"):
        evidence_tests("@pytest.mark.evidence(rule_ids())\ndef test_x(): pass", "t.py")
