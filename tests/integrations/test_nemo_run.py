"""The NeMo-Run plugin against the real ``nemo-run`` package and Megatron-Bridge's own override function:
a ``run.Script`` gets overrides that, applied by Megatron-Bridge, give exactly what ``apply()`` gives; a
``run.Partial`` gets its config applied; the executor gets the activation variable."""

from __future__ import annotations

import copy
from typing import Any

import pytest

run = pytest.importorskip("nemo_run")

from mbridge_seqpack import PackingConfigError, check  # noqa: E402
from mbridge_seqpack.compose.mixins import (  # noqa: E402
    ContextParallel,
    LongContext,
    OfflinePacking,
    PackedCudaGraphs,
    Parallelism,
    apply,
)
from mbridge_seqpack.integrations.nemo_run import SequencePacking, SequencePackingScriptArgs  # noqa: E402
from tests.support.config_snapshot import snapshot  # noqa: E402

pytestmark = pytest.mark.slow

RUNNER = "/opt/Megatron-Bridge/scripts/training/run_recipe.py"
CAPABILITIES = {
    "cp2": [ContextParallel(2)],
    "32k_cp4": [LongContext(32768, 4)],
    "cuda_graphs": [PackedCudaGraphs()],
    "4k_cp2": [OfflinePacking(pack_size=4096), ContextParallel(2)],
    "tp4_cp2": [Parallelism(tensor=4), ContextParallel(2, comm_type="a2a")],
}


@pytest.fixture(scope="module")
def base(megatron_bridge: Any) -> Any:
    from mbridge_seqpack.recipes import build_recipe

    return build_recipe("llama3_8b_sft_packed_8k")


@pytest.mark.parametrize("name", sorted(CAPABILITIES))
def test_script_overrides_through_megatron_bridge_equal_apply(base: Any, name: str) -> None:
    from mbridge_seqpack.overrides import apply_overrides

    mixins = CAPABILITIES[name]
    task = run.Script(path=RUNNER, args=["--recipe", "llama3_8b_sft_packed_8k"])
    executor = run.LocalExecutor()
    SequencePacking(mixins=mixins, base=base).setup(task, executor)
    assert executor.env_vars["MBRIDGE_SEQPACK_MODE"] == "error"
    assert task.args[:2] == ["--recipe", "llama3_8b_sft_packed_8k"]
    launched = apply_overrides(copy.deepcopy(base), task.args[2:])  # what the runner does with them
    assert snapshot(launched) == snapshot(apply(copy.deepcopy(base), *mixins))
    assert check(launched, world_size=16) == []


def test_the_plugin_asks_the_training_process_for_a_correction() -> None:
    from mbridge_seqpack.errors import UsageError

    executor = run.LocalExecutor()
    SequencePacking(corrections=["router_padding_mask"]).setup(run.Script(path=RUNNER, args=[]), executor)
    assert executor.env_vars["MBRIDGE_SEQPACK_CORRECTIONS"] == "router_padding_mask"
    executor = run.LocalExecutor()
    SequencePacking().setup(run.Script(path=RUNNER, args=[]), executor)
    assert "MBRIDGE_SEQPACK_CORRECTIONS" not in executor.env_vars
    with pytest.raises(UsageError, match="^SequencePacking.corrections: unknown correction 'router'"):
        SequencePacking(corrections=["router"])


def test_script_overrides_exact_for_cp2(base: Any) -> None:
    task = run.Script(path=RUNNER, args=[])
    SequencePacking(mixins=[ContextParallel(2)], base=base).setup(task, run.LocalExecutor())
    assert task.args == [
        "model.context_parallel_size=2",
        "dataset.offline_packing_specs.pad_seq_to_mult=4",
        "model.calculate_per_token_loss=true",
    ]


def test_script_without_base_passes_facts_and_the_hook_reports_the_rest(base: Any) -> None:
    from mbridge_seqpack.overrides import apply_overrides

    task = run.Script(path=RUNNER, args=[])
    executor = run.LocalExecutor()
    SequencePacking(mixins=[ContextParallel(2)], mode="warn").setup(task, executor)
    assert task.args == ["model.context_parallel_size=2"]
    assert executor.env_vars["MBRIDGE_SEQPACK_MODE"] == "warn"
    launched = apply_overrides(copy.deepcopy(base), task.args)
    assert sorted(v.rule_id for v in check(launched, world_size=8)) == [
        "cp.finetune_per_token_loss",
        "offline.alignment_multiple",
    ]


def test_script_arguments_are_applied_before_deriving(base: Any) -> None:
    """The user's own overrides on the script count: a 16k length and a stricter multiple of 8 are kept."""
    task = run.Script(
        path=RUNNER,
        args=["--recipe", "x", "dataset.seq_length=16384", "dataset.offline_packing_specs.pad_seq_to_mult=8"],
    )
    SequencePacking(mixins=[ContextParallel(2)], base="llama3_8b_sft_packed_8k").setup(task, run.LocalExecutor())
    assert task.args[4:] == [
        "model.context_parallel_size=2",
        "model.seq_length=16384",
        "dataset.offline_packing_specs.packed_sequence_size=16384",
        "model.calculate_per_token_loss=true",
    ]


def test_custom_converter(base: Any) -> None:
    def argparse_style(args: SequencePackingScriptArgs) -> list[str]:
        return [f"--{path}={value}" for path, value in args.assignments.items()]

    task = run.Script(path=RUNNER, args=[])
    SequencePacking(mixins=[ContextParallel(2)], script_args_converter_fn=argparse_style).setup(
        task, run.LocalExecutor()
    )
    assert task.args == ["--model.context_parallel_size=2"]


def train(config: Any, forward_step_func: Any = None) -> Any:
    """Stands for finetune(): runs what it runs first."""
    from megatron.bridge.training.config import runtime_config_update

    runtime_config_update(config)
    return config


def test_partial_with_a_config_container(base: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import fiddle as fdl

    monkeypatch.setenv("WORLD_SIZE", "8")
    task = run.Partial(train, config=copy.deepcopy(base))
    executor = run.LocalExecutor()
    SequencePacking(mixins=[ContextParallel(2)]).setup(task, executor)
    assert executor.env_vars["MBRIDGE_SEQPACK_MODE"] == "error"
    # NeMo-Run turns the dataclass into a run.Config; the plugin keeps it one (serializable), built where it runs
    assert snapshot(fdl.build(task.config)) == snapshot(apply(copy.deepcopy(base), ContextParallel(2)))
    trained = fdl.build(task)()  # Megatron-Bridge's own validation accepts the applied config
    assert trained.model.context_parallel_size == 2


def test_partial_with_a_run_config_of_a_recipe(megatron_bridge: Any) -> None:
    import fiddle as fdl

    from mbridge_seqpack.recipes import build_recipe

    task = run.Partial(train, config=run.Config(build_recipe, "llama3_8b_sft_packed_8k"))
    SequencePacking(mixins=[LongContext(16384, 2)]).setup(task, run.LocalExecutor())
    built = fdl.build(task.config)
    assert (built.dataset.seq_length, built.model.context_parallel_size) == (16384, 2)
    assert built.dataset.offline_packing_specs.pad_seq_to_mult == 4


def test_a_partial_task_survives_nemo_runs_serialization(
    megatron_bridge: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.run(..., dryrun=True) serializes the task; NeMo-Run's fdl_runner deserializes, builds and calls it where
    it trains. Both work with the plugin (a live ConfigContainer in the task could not be serialized)."""
    import fiddle as fdl
    import nemo_run.config
    from nemo_run.core.serialization.zlib_json import ZlibJSONSerializer

    from mbridge_seqpack.recipes import build_recipe

    monkeypatch.setattr(nemo_run.config, "_NEMORUN_HOME", str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "4")
    task = run.Partial(train, config=run.Config(build_recipe, "llama3_8b_sft_packed_8k"))
    plugin = SequencePacking(mixins=[LongContext(16384, 2)])
    run.run(task, executor=run.LocalExecutor(), plugins=[plugin], dryrun=True)
    task = run.Partial(train, config=run.Config(build_recipe, "llama3_8b_sft_packed_8k"))
    plugin.setup(task, run.LocalExecutor())
    shipped = ZlibJSONSerializer().serialize(task)  # what the executor hands to fdl_runner
    trained = fdl.build(fdl.cast(run.Partial, ZlibJSONSerializer().deserialize(shipped)))()
    assert (trained.dataset.seq_length, trained.model.context_parallel_size) == (16384, 2)
    assert trained.model.calculate_per_token_loss is True


def test_plugin_runs_inside_nemo_run(
    base: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through NeMo-Run's own ``run.run`` (dry run): the plugin's overrides and variable reach the launch."""
    import nemo_run.config

    monkeypatch.setattr(nemo_run.config, "_NEMORUN_HOME", str(tmp_path))
    task = run.Script(path=RUNNER, args=[])
    plugin = SequencePacking(mixins=[ContextParallel(2)], base="llama3_8b_sft_packed_8k")  # serializable
    run.run(task, executor=run.LocalExecutor(), plugins=[plugin], dryrun=True)
    shown = "".join(capsys.readouterr().out.split())  # NeMo-Run's rich console wraps at its own width
    assert "model.context_parallel_size=2" in shown
    assert "MBRIDGE_SEQPACK_MODE" in shown


def test_plugin_refuses_a_capability_that_cannot_hold(base: Any) -> None:
    cfg = copy.deepcopy(base)
    cfg.train.global_batch_size = 3
    task = run.Script(path=RUNNER, args=[])
    with pytest.raises(PackingConfigError):
        SequencePacking(mixins=[ContextParallel(0 + 3)], base=cfg).setup(task, run.LocalExecutor())
    assert task.args == []


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"mode": "strict"}, ValueError, "SequencePacking.mode must be 'error', 'warn' or 'off', got 'strict'"),
        (
            {"mixins": ["cp=2"]},
            TypeError,
            "SequencePacking.mixins takes mbridge_seqpack.compose.mixins objects; got str",
        ),
    ],
)
def test_plugin_arguments(kwargs: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error) as info:
        SequencePacking(**kwargs)
    assert str(info.value) == message
