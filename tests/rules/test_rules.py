"""Every rule: a real ConfigContainer breaking only that rule gives exactly that violation (fields and
fix asserted), and the same config with the fix applied gives none."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack import check
from mbridge_seqpack.config_paths import set_path
from tests.support.field_reads import undeclared_reads, untyped_fields
from tests.support.rule_cases import CASES, SPECS, Case, _metadata_breaks, _metadata_repair


def _apply_fix(cfg: Any, assignments: dict[str, Any]) -> None:
    for path, value in assignments.items():
        set_path(cfg, path, value)


@pytest.mark.parametrize("case", CASES, ids=[c.rule_id for c in CASES])
def test_rule_breaks_and_fix_repairs(
    case: Case, request: pytest.FixtureRequest, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = request.getfixturevalue(case.base)
    base_world = case.base_world or case.repaired_world or case.world
    assert check(cfg, world_size=base_world) == [], "the base config must be valid"
    assert undeclared_reads(cfg, base_world) == {}
    if case.patch is not None:
        case.patch(monkeypatch)
    case.breaks(cfg, tmp_path)

    found = check(cfg, world_size=case.world)
    assert sorted(v.rule_id for v in found) == sorted((case.rule_id, *case.also))
    assert undeclared_reads(cfg, case.world) == {}  # every field each rule reads here is in its @rule(reads=...)
    assert untyped_fields(found) == []
    violation = next(v for v in found if v.rule_id == case.rule_id)
    assert violation.fields == (case.fields(cfg, tmp_path) if callable(case.fields) else case.fields)
    if case.assignments is not None:
        assert violation.assignments == case.assignments
    if case.fix is not None:
        assert violation.fix == case.fix
    assert violation.rule  # the rule in words

    if case.repair is not None:
        case.repair(cfg, tmp_path)
    else:
        _apply_fix(cfg, violation.assignments)
        for other in found:
            if other is not violation:
                _apply_fix(cfg, other.assignments)
    assert check(cfg, world_size=case.repaired_world or case.world) == []


def test_metadata_rule_names_paths_and_repairs(packed_cfg: Any, tmp_path: Any) -> None:
    _metadata_breaks(packed_cfg, tmp_path)
    (v,) = check(packed_cfg, world_size=8)
    assert v.rule_id == "cuda_graphs.pad_cu_seqlens_needs_metadata"
    assert v.fields == {
        f"{SPECS}.packed_metadata_path": None,
        f"{SPECS}.packed_train_data_path": str(tmp_path / "training_4096.idx.parquet"),
    }
    assert v.fix == (
        f"cfg.{SPECS}.packed_metadata_path = '<metadata JSON written with the pack, e.g. "
        f"{tmp_path / '4096_metadata.jsonl'}>'"
    )
    packed_cfg.dataset.offline_packing_specs.packed_metadata_path = str(tmp_path / "missing.json")
    (v,) = check(packed_cfg, world_size=8)
    assert v.rule.endswith("the file does not exist")
    _metadata_repair(packed_cfg, tmp_path)
    assert check(packed_cfg, world_size=8) == []


def test_glm45_from_its_bridge_structure_opts_out_of_offline_packing(packed_cfg: Any) -> None:
    """A small GLM-4.5-shaped config (QKV bias as GLM-4.5's own config.json has it) through GLM45Bridge."""
    from transformers import Glm4MoeConfig

    from mbridge_seqpack.recipes.building_blocks import provider_from_hf_config

    provider = provider_from_hf_config(
        Glm4MoeConfig(
            architectures=["Glm4MoeForCausalLM"],
            num_hidden_layers=4,
            hidden_size=256,
            intermediate_size=512,
            num_attention_heads=4,
            num_key_value_heads=2,
            moe_intermediate_size=128,
            n_routed_experts=4,
            num_experts_per_tok=2,
            vocab_size=1000,
            first_k_dense_replace=1,
            attention_bias=True,
        )
    )
    assert not hasattr(provider, "hf_architectures")  # nothing recorded beyond the bridge's own fields
    provider.seq_length = 4096
    packed_cfg.model = provider
    found = {v.rule_id: v for v in check(packed_cfg, world_size=8)}
    # GLM-4.5's router has an aux loss: the packed rows' tail padding is routed (equivalence.router_padding)
    assert sorted(found) == ["equivalence.router_padding", "model.offline_packing_opt_out"]
    v = found["model.offline_packing_opt_out"]
    assert v.fields["model family"] == "GLM-4.5"


def test_world_size_must_be_positive(packed_cfg: Any) -> None:
    with pytest.raises(ValueError, match=r"world_size must be a positive integer, got 0; pass e.g. world_size=8"):
        check(packed_cfg, world_size=0)


def test_world_size_defaults_to_environment(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "32")
    (v,) = check(packed_cfg)  # DP 32 > global batch 16
    assert v.rule_id == "batch.global_batch_min"
    assert v.fields["data_parallel_size"] == 32


def test_the_rules_page_is_generated_from_the_catalog() -> None:
    from pathlib import Path

    from mbridge_seqpack.rules.catalog import all_rules, render_markdown

    page = (Path(__file__).resolve().parents[2] / "docs" / "rules.md").read_text()
    assert page == render_markdown()
    assert all(f"| `{r.rule_id}` | {r.severity} |" in page for r in all_rules())


def test_a_mask_need_beyond_any_node_is_an_error_naming_the_figure(pretrain_cfg: Any) -> None:
    """Megatron-Bridge's 128k pretraining layout (seq 131072, 8 workers per rank, 8 ranks per node): each of the 64
    mask-building processes holds two float32 S x S tensors while torch.tril(torch.ones((S, S))) runs and one bool
    mask after (gpt_dataset.py:798-800), 9 * S^2 bytes each: 9,216 GiB per node, beyond a 2 TiB node. The advisory's
    own figure proves the failure, so it is an error; at 32k (144 GiB) it stays an advisory (the Case above)."""
    from mbridge_seqpack import check
    from mbridge_seqpack.errors import ERROR

    pretrain_cfg.model.seq_length = pretrain_cfg.dataset.seq_length = 131072
    pretrain_cfg.dataset.num_workers = 8
    need = 64 * 9 * 131072**2
    [v] = [v for v in check(pretrain_cfg, world_size=64) if v.rule_id == "dataset.create_attention_mask"]
    assert (v.severity, v.fields["host GiB per node"]) == (ERROR, need / 2**30) == (ERROR, 9216.0)
    assert v.proven == (
        "9,216 GiB of host memory per node is beyond a node of 2 TiB: the dataloader workers run out of memory on "
        "any machine"
    )
    assert v.assignments == {"dataset.create_attention_mask": False}


def test_each_rule_id_prefix_names_its_one_module() -> None:
    """One family, one module: every rule lives in ``rules/<prefix>.py`` for its id's prefix, and that module holds
    only that family (so a family's rules are found by their id); ``config`` runs first, then families by name."""
    from pathlib import Path

    from mbridge_seqpack.rules.catalog import all_rules, family

    rules = all_rules()
    assert [
        (r.rule_id, r.fn.__module__) for r in rules if r.fn.__module__ != f"mbridge_seqpack.rules.{family(r)}"
    ] == []
    order = [family(r) for r in rules]
    assert rules[0].rule_id == "config.types"
    assert order == sorted(order, key=lambda name: (name != "config", name))
    modules = Path(__file__).resolve().parents[2] / "mbridge_seqpack" / "rules"
    holding = {p.stem for p in modules.glob("*.py") if "@rule(" in p.read_text() and p.stem != "registry"}
    assert holding == set(order)


def test_a_rule_outside_its_family_module_is_refused() -> None:
    from mbridge_seqpack.errors import ERROR
    from mbridge_seqpack.rules.registry import registered, rule

    def misplaced(ctx: Any) -> None:
        return None

    misplaced.__module__ = "mbridge_seqpack.rules.offline"
    before = registered()
    with pytest.raises(
        RuntimeError, match=r"'cp.misplaced' is registered in mbridge_seqpack.rules.offline.*rules/cp.py"
    ):
        rule("cp.misplaced", "A rule in the wrong module.", severity=ERROR, evidence="none needed")(misplaced)
    assert registered() == before


def _rule_ids_with_a_case() -> set[str]:
    """The rule ids the test tree's ``Case(...)`` entries name, read from the source (no test imports another)."""
    named: set[str] = set()
    for path in Path(__file__).resolve().parents[1].rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Case":
                first = (
                    node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "rule_id"), None)
                )
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    named.add(first.value)
    return named


def test_every_rule_has_a_case() -> None:
    """A rule is added with its case: a real config that breaks it (and the fix that repairs it)."""
    from mbridge_seqpack.rules import all_rules

    named = _rule_ids_with_a_case()
    assert [r.rule_id for r in all_rules() if r.rule_id not in named] == []
