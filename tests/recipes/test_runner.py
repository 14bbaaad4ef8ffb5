"""``check`` and ``pack`` model the job Megatron-Bridge's recipe runner launches (#21).

``tests/recipes/runner_fixes.json`` was recorded by running the runner's own functions
(``scripts/record_runner_fixes.py`` on Megatron-Bridge r0.6.0's ``scripts/training``) over 14 shipped recipes (two of
them benchmark recipes) x 4 CP/TP/SP/seq_length overrides; the runner is not in the wheel, so the plugin's
restatement (``recipes/runner.py``) is held to that record here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.recipes import runner
from mbridge_seqpack.recipes.targets import build_launch

pytestmark = pytest.mark.slow

RECORD = json.loads((Path(__file__).with_name("runner_fixes.json")).read_text())["cases"]
#: rules that flag a config the runner launches and that then breaks or trains wrong (each with its evidence in the
#: catalog): gpt-oss's sliding-window layers and attention sinks under CP over p2p assert in Transformer Engine;
#: a packed MoE router counts the rows' padding (Moonlight, Qwen3-MoE: the zoo's SHIPPED_TRUE_POSITIVES)
BREAKS_AFTER_LAUNCH = {"cp.sliding_window_comm_type", "cp.softmax_type_comm_type", "equivalence.router_padding"}


@pytest.fixture
def restated(monkeypatch: pytest.MonkeyPatch) -> None:
    """No runner directory: the plugin's restatement of the runner's functions is what runs."""
    monkeypatch.delenv(runner.RUNNER_DIR_ENV, raising=False)
    monkeypatch.setattr(runner, "_CONTAINER_RUNNER", Path("/nonexistent/Megatron-Bridge/scripts/training"))
    assert runner.runner_module() is None


@pytest.fixture(scope="module")
def offline_hub(megatron_bridge: Any) -> Any:
    from tests.zoo.harness import offline

    with offline():
        yield


def _world(cfg: Any, recipe: str) -> int:
    """The GPU count in the name, grown to the smallest world the overridden layout fits."""
    from mbridge_seqpack.rules.context import RuleContext

    declared = int(recipe.split("gpu")[0].rsplit("_", 1)[1])
    return math.lcm(declared, RuleContext(cfg=cfg, world_size=1).topology.smallest_world)


@pytest.mark.parametrize("case", sorted(RECORD), ids=lambda c: c.replace(" ", "+"))
def test_the_runner_fixes_are_those_of_megatron_bridge_run_recipe(case: str, restated: None, offline_hub: Any) -> None:
    recorded = RECORD[case]
    builder = runner.find_megatron_recipe(recorded["recipe"])
    assert f"{builder.__module__}:{builder.__qualname__}" == recorded["builder"]
    launch = build_launch(recorded["recipe"], recorded["overrides"])
    assert launch.runner
    assert {field: runner._read(launch.cfg, field) for field in recorded["fields"]} == recorded["fields"]
    for change in launch.runner_changes:
        assert change.after == recorded["fields"][change.field]
        assert change.describe().startswith(f"the runner will set {change.field}={change.after} (was ")


def test_check_agrees_with_what_the_runner_launches(restated: None, offline_hub: Any) -> None:
    """Every case: the plugin (runner modelled) rejects exactly the configs Megatron-Bridge rejects once the runner
    has repaired them, plus those that break after launch; without the runner the CP cases fail in Megatron-Bridge
    too, and the plugin says so."""
    from tests.zoo.harness import judge

    disagreements = []
    for case, recorded in sorted(RECORD.items()):
        for modelled in (True, False):
            verdict = judge(
                case,
                lambda: build_launch(recorded["recipe"], recorded["overrides"], runner=modelled).cfg,
                lambda cfg: _world(cfg, recorded["recipe"]),
            )
            assert verdict.built, verdict.build_error
            ours = {f["rule_id"] for f in verdict.errors} - BREAKS_AFTER_LAUNCH
            if modelled:  # the runner's launch: Megatron-Bridge accepts every case, so must the plugin
                wrong = bool(ours) or not verdict.mb_accepts
            else:  # a plain finetune() launch: never OK where Megatron-Bridge fails; beyond that, only the
                # misaligned pack the zoo's TRUE_POSITIVES prove (THD CP reads rows not divisible by 2*CP)
                wrong = (not verdict.mb_accepts and not ours) or (
                    verdict.mb_accepts and bool(ours - {"offline.alignment_multiple"})
                )
            if wrong:
                disagreements.append((case, modelled, sorted(ours), verdict.mb_error))
    assert disagreements == []


def test_a_pack_made_for_a_runner_launch_matches_the_config_it_launches(
    tmp_path: Path, restated: None, offline_hub: Any
) -> None:
    """``pack --recipe NAME`` seals the alignment the runner sets (lcm(2*CP, CP*TP under SP)), so the fingerprint rule
    accepts the pack for the config the runner builds; a pack made without modelling the runner does not match."""
    from mbridge_seqpack.cli.main import main
    from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir
    from mbridge_seqpack.report import check

    name, overrides = "llama32_1b_sft_1gpu_h100_bf16_config", ["model.context_parallel_size=2"]
    common = [str(embedded_data_dir() / "training.jsonl"), *overrides, "--recipe", name]
    common += [f"tokenizer.tokenizer_model={embedded_tokenizer_dir()}"]  # --tokenizer would conflict with the recipe
    assert main(["pack", *common, "--output", str(tmp_path / "runner")]) == 0
    assert main(["pack", *common, "--no-runner", "--output", str(tmp_path / "plain")]) == 0
    meta = json.loads((tmp_path / "runner" / "4096_metadata.jsonl").read_text())
    assert meta[0]["fingerprint"]["pad_seq_to_mult"] == 4

    def fingerprint_rule(pack: Path) -> list[Any]:
        launched = build_launch(name, overrides).cfg  # what run_recipe.py launches
        specs = launched.dataset.offline_packing_specs
        specs.packed_train_data_path = str(pack / "training_4096.idx.parquet")
        found = check(launched, world_size=2)  # (no packed_metadata_path: the training-only pack is not appended to)
        return [v for v in found if v.rule_id == "artifact.fingerprint_mismatch"]

    assert fingerprint_rule(tmp_path / "runner") == []
    (v,) = fingerprint_rule(tmp_path / "plain")
    assert v.fields["artifact pad_seq_to_mult"] == 1
    assert v.fields["dataset.offline_packing_specs.pad_seq_to_mult"] == 4


def test_an_unknown_name_lists_both_kinds_of_recipe(offline_hub: Any) -> None:
    with pytest.raises(
        ValueError,
        match=r"recipe 'llama3_8b_sft_cofnig' not found in megatron\.bridge\.recipes \(nor its <family>\.h100 "
        r"modules\) or megatron\.bridge\.perf_recipes \(did you mean 'llama3_8b_sft_config'\?\); packaged "
        r"recipes: .*llama3_8b_sft_packed_8k",
    ):
        build_launch("llama3_8b_sft_cofnig", [])


def test_a_pasted_launch_line_is_modelled_with_its_world_size_and_the_runner_named(
    restated: None, offline_hub: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#39: ``check torchrun ... run_recipe.py ...`` models that launch: --deterministic's overrides (Megatron-Bridge's
    own apply_determinism_overrides) before the overrides, the CP repairs after, the world size from the launcher,
    and the runner implementation named; under the runner $WORLD_SIZE wins over the name's GPU count."""
    from mbridge_seqpack.cli.check import check_target, split_target, take_runner_line
    from mbridge_seqpack.cli.launch_line import launcher_world, runner_args
    from mbridge_seqpack.cli.main import parse_args

    line = (
        "check torchrun --nproc-per-node=4 --nnodes 2 scripts/training/run_recipe.py "
        "--recipe llama32_1b_sft_1gpu_h100_bf16_config -cp 2 -gb 32 --deterministic --rules-only"
    )
    args = parse_args(line.split())
    split_target(args)
    take_runner_line(args)
    report = check_target(
        args.target,
        args.overrides,
        None,
        megatron=False,
        runner_options=runner_args(args),
        launcher=launcher_world(args),
    )
    assert report.ok and report.target == "llama32_1b_sft_1gpu_h100_bf16_config (world size 8)"
    assert [n for n in report.notes if not n.startswith("attention:")] == [
        "modelled: Megatron-Bridge scripts/training/run_recipe.py r0.6.0 (commit 6124fbe), restated in "
        "mbridge_seqpack/recipes/runner.py",
        "the runner will set model.deterministic_mode=True (was False; apply_determinism, --deterministic)",
        "the runner will set model.cross_entropy_loss_fusion=False (was True; apply_determinism, --deterministic)",
        "the runner will set model.calculate_per_token_loss=True (was False; sync_finetuning_cp_invariants)",
        "the runner will set dataset.offline_packing_specs.pad_seq_to_mult=4 (was 1; sync_offline_packing_alignment)",
        "world size 8 from --nproc-per-node 4 x --nnodes 2",
        "equivalence check: stood in here: Transformer Engine's thd_get_partitioned_indices kernel (CUDA only; "
        "here: RuntimeError: Found no NVIDIA driver on your system): each CP rank's packed split ran through "
        "Megatron-Bridge's _partition_packed_batch_for_cp with a transliteration of TE's thd_partition_indices_kernel "
        "in its place",
    ]
    monkeypatch.setenv("WORLD_SIZE", "2")
    report = check_target("llama32_1b_sft_1gpu_h100_bf16_config", [], None, megatron=False)
    assert report.target == "llama32_1b_sft_1gpu_h100_bf16_config (world size 2)"
    assert [n for n in report.notes if n.startswith("world size")] == ["world size 2 from $WORLD_SIZE"]


def test_the_dataset_presets_are_megatron_bridges(megatron_bridge: Any) -> None:
    """``check --dataset`` offers run_recipe.py's choices (``sorted(DATASET_PRESETS)``) without importing them."""
    from megatron.bridge.recipes.utils.dataset_utils import DATASET_PRESETS

    from mbridge_seqpack.cli.launch_line import DATASETS

    assert list(DATASETS) == sorted(DATASET_PRESETS)


def test_a_pp_override_rebuilds_a_recipe_owned_pipeline_layout(restated: None, offline_hub: Any) -> None:
    """``sync_model_pipeline_layout``: a PP override rebuilds the layout from the provider's builder, unless the
    layout is overridden too; restated here, and run on a real config whose provider has a builder."""
    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

    cfg = sft_base(small_gpt_provider(2048), seq_length=2048, global_batch_size=4)
    calls = []
    cfg.model._pipeline_model_parallel_layout_builder = lambda pp, vp: calls.append((pp, vp)) or [["embedding"]]
    cfg.model.pipeline_model_parallel_size = 2
    assert runner.sync_model_pipeline_layout(cfg, ["model.tensor_model_parallel_size=2"]) == []
    assert runner.sync_model_pipeline_layout(cfg, ["model.pipeline_model_parallel_size=2"]) == [
        runner.RunnerChange(
            "model.pipeline_model_parallel_layout", None, [["embedding"]], "sync_model_pipeline_layout"
        )
    ]
    layout = ["model.pipeline_model_parallel_size=2", "model.pipeline_model_parallel_layout=x"]
    assert runner.sync_model_pipeline_layout(cfg, layout) == [] and calls == [(2, None)]
