"""Packaged recipes (offline, valid at their world size) and the mbridge-seqpack CLI."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack import check
from mbridge_seqpack.cli import main
from mbridge_seqpack.cli.check import run_megatron_validation
from mbridge_seqpack.recipes import build_recipe, list_recipes, recipe_info
from tests.support.expected_recipes import EXPECTED_RECIPES
from tests.support.stderr_text import unwrap

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_recipe_names() -> None:
    assert list_recipes() == EXPECTED_RECIPES


@pytest.mark.parametrize("name", EXPECTED_RECIPES)
def test_recipe_builds_offline_and_validates(name: str, megatron_bridge: Any, no_network: None) -> None:
    cfg = build_recipe(name)
    world = recipe_info(name).world_size
    assert check(cfg, world_size=world) == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run_megatron_validation(cfg, world) is None


def test_long_context_recipes_carry_the_derived_fields(megatron_bridge: Any) -> None:
    cfg = build_recipe("llama31_8b_sft_128k_cp8")
    specs = cfg.dataset.offline_packing_specs
    assert (cfg.model.seq_length, cfg.dataset.seq_length, specs.packed_sequence_size) == (131072, 131072, 131072)
    assert (cfg.model.context_parallel_size, cfg.model.tensor_model_parallel_size) == (8, 2)
    assert cfg.model.sequence_parallel is True
    assert specs.pad_seq_to_mult == 16  # lcm(2*CP, CP*TP)
    assert cfg.model.calculate_per_token_loss is True and cfg.ddp.average_in_collective is False
    graphs = build_recipe("llama3_8b_sft_packed_8k_cuda_graphs")
    from megatron.bridge.utils.cuda_graph import cuda_graph_module_names

    from mbridge_seqpack.rules import RuleContext

    assert (graphs.model.cuda_graph_impl, cuda_graph_module_names(graphs.model)) == ("transformer_engine", ["mlp"])
    assert graphs.dataset.dataset_kwargs["pad_to_max_length"] is True
    assert graphs.dataset.offline_packing_specs.pad_cu_seqlens is False  # attention is not captured
    assert RuleContext(graphs, 8).graph_path.verdict == "works"


def test_cli_check_default_recipe_passes(megatron_bridge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    # TE's backend pick off a GPU rests on cuDNN's own support query accepting: an assumed ok, said as one
    assert out.startswith("result: OK (1 assumed)\nmbridge-seqpack check: llama3_8b_sft_packed_8k (world size 8)\n")
    assert "  layout   world=8 TP=2 PP=1 CP=1 EP=1 DP=4 SP=on\n" in out
    assert "  batch    micro 1, global 16, token slots per step 131,072 (8192 x 16)\n" in out
    assert "megatron-bridge validate(): ok\n" in out
    assert "  ok   " not in out and "rules that found something" not in out  # only what found something is listed
    counts = [line for line in out.splitlines() if " rules: " in line]
    assert len(counts) == 1 and re.fullmatch(r"\d+ rules: \d+ ok, 1 assumed, \d+ n/a", counts[0]), counts
    assert all(len(line) <= 100 for line in out.splitlines())


def test_cli_check_all_lists_every_rule(megatron_bridge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from mbridge_seqpack.rules import all_rules

    assert main(["check", "--all", "--rules-only"]) == 0
    out = capsys.readouterr().out
    mark = r"  (ok  |asm |n/a |skip|FAIL|ADV |UND\?) "
    marked = [line.split()[1] for line in out.splitlines() if re.match(mark, line)]
    assert marked == [r.rule_id for r in all_rules()]


def test_cli_check_broken_override_fails_with_the_fix(
    megatron_bridge: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "llama3_8b_sft_packed_8k", "model.context_parallel_size=2", "--rules-only"]) == 1
    out = capsys.readouterr().out
    assert "  FAIL cp.finetune_per_token_loss" in out
    assert "       fix:      cfg.model.calculate_per_token_loss = True\n" in out
    assert "  FAIL offline.alignment_multiple" in out
    assert "       fix:      cfg.dataset.offline_packing_specs.pad_seq_to_mult = 4\n" in out
    assert out.startswith("result: 2 violation(s) (1 assumed)\n")
    assert "rules that found something:\n" in out


def test_cli_check_names_a_misspelt_field_and_a_mistyped_value(
    megatron_bridge: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt field gets "did you mean"; a value of the wrong type is config.types' report (with the field),
    not a bare ``invalid literal for int()``."""
    assert main(["check", "llama3_8b_sft_packed_8k", "model.context_paralel_size=2", "--rules-only"]) == 2
    err = unwrap(capsys.readouterr().err)
    assert err.strip().endswith(
        "Could not override 'model.context_paralel_size'. (did you mean 'model.context_parallel_size'?)"
    )
    # a new key of a free-form mapping crashed the "did you mean" lookup (vars() of a dict) with a traceback
    assert main(["check", "llama3_8b_sft_packed_8k", "dataset.dataset_kwargs.prompt_tempalte=x", "--rules-only"]) == 2
    err = unwrap(capsys.readouterr().err).strip()
    assert err.endswith(
        "Could not override 'dataset.dataset_kwargs.prompt_tempalte'. (dataset.dataset_kwargs is a mapping "
        "without the key 'prompt_tempalte': add it with ++dataset.dataset_kwargs.prompt_tempalte=...)"
    )
    assert main(["check", "llama3_8b_sft_packed_8k", "model.context_parallel_size=two", "--rules-only"]) == 1
    out = capsys.readouterr().out
    assert "layout   not derived: a field has the wrong type (see config.types below)" in out
    assert "fields:   model.context_parallel_size='two', type='str'" in out
    assert "invalid literal" not in out


def test_cli_check_json_and_megatron_failure(megatron_bridge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "small_gpt_smoke_4k", "--world-size", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["derived"]["dp"] == 4
    assert main(["check", "small_gpt_smoke_4k", "--world-size", "2", "train.global_batch_size=7", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [v["rule_id"] for v in report["violations"]] == ["batch.global_batch_divisible"]
    assert report["violations"][0]["assignments"] == {"train.global_batch_size": 8}


def test_cli_check_recipe_file(tmp_path: Path, megatron_bridge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "my_recipe.py"
    recipe.write_text(
        "def config():\n"
        "    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider\n"
        "    return sft_base(small_gpt_provider(2048), seq_length=2048, global_batch_size=4)\n"
    )
    assert main(["check", str(recipe), "--world-size", "4", "--rules-only"]) == 0
    assert "mode" not in unwrap(capsys.readouterr().err)
    assert main(["check", f"{recipe}:nope"]) == 2
    assert f"mbridge-seqpack: error: {recipe} has no function 'nope'" in unwrap(capsys.readouterr().err)


def test_cli_bad_inputs_exit_2(megatron_bridge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "no_such_recipe"]) == 2
    assert (
        "mbridge-seqpack: error: recipe 'no_such_recipe' not found in megatron.bridge.recipes (nor its "
        "<family>.h100 modules) or megatron.bridge.perf_recipes; packaged recipes: llama31_8b_sft_128k_cp8"
        in unwrap(capsys.readouterr().err)
    )
    assert main(["check", "small_gpt_smoke_4k", "model.no_such_field=3"]) == 2
    assert unwrap(capsys.readouterr().err) == (
        "mbridge-seqpack: error: Megatron-Bridge rejected the overrides: Failed to "
        "parse Hydra overrides: Could not override 'model.no_such_field'.\n"
    )
    assert main(["check", "small_gpt_smoke_4k", "justtext"]) == 2
    assert "mbridge-seqpack: error: override 'justtext' is not valid Hydra override syntax" in unwrap(
        capsys.readouterr().err
    )


def test_cli_recipes_lists_without_building_or_importing_megatron() -> None:
    """``recipes`` reads the recipe files' markers only: a fresh interpreter lists them with Megatron unimported."""
    code = (
        "import sys, io, contextlib; from mbridge_seqpack.cli.main import main; out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out): rc = main(['recipes'])\n"
        "print(rc, sorted(m for m in sys.modules if m.startswith('megatron'))); print(out.getvalue())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    first, *table = done.stdout.splitlines()
    assert first == "0 []", done.stderr[-2000:]
    assert max(map(len, table)) <= 100
    assert table[0].split() == ["recipe", "/", "model,", "mode", "GPUs", "what", "it", "trains"]
    at = next(i for i, line in enumerate(table) if line.startswith("llama31_8b_sft_32k_cp2 "))
    assert table[at].split() == [
        "llama31_8b_sft_32k_cp2",
        "16",
        *"32k packed rows, CP2 x TP2 (SP), DP4 on 16 GPUs.".split(),
    ]
    assert table[at + 1].strip() == "Llama-3.1-8B, offline packed, long context"


def test_cli_recipes_table(megatron_bridge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipes", "--layout"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(map(len, lines)) <= 100
    assert lines[0].split() == ["recipe", "/", "model,", "mode", "seq", "layout", "GPUs", "MBS", "GBS", "tokens/step"]
    at = next(i for i, line in enumerate(lines) if line.startswith("llama31_8b_sft_32k_cp2 "))
    assert lines[at].split() == ["llama31_8b_sft_32k_cp2", "32768", "TP2", "CP2", "DP4", "16", "1", "16", "524,288"]
    assert lines[at + 1].strip() == "Llama-3.1-8B, offline packed, long context"
    assert main(["recipes", "--json", "--layout"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == EXPECTED_RECIPES
    vlm = next(r for r in rows if r["name"] == "qwen25_vl_3b_sft_in_batch_4k")
    assert (vlm["mode"], vlm["micro_batch_size"], vlm["dp"]) == ("in-batch packed", 4, 8)


def test_cli_plan_exact(megatron_bridge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan",
            "small_gpt_smoke_4k",
            "--world-size",
            "8",
            "--slots",
            "65536",
            "--lengths",
            "2048,4096,8192,16384,3000",
        ]
    )
    assert code == 0
    assert capsys.readouterr().out.splitlines() == [
        "plan for small_gpt_smoke_4k: 65,536 token slots per optimizer step; context window unknown",
        "  (--context-window N)",
        "pack length  GBS  DP  verdict",
        "─" * 100,
        "       2048   32   8  ok",
        "       4096   16   8  ok",
        "       8192    8   8  ok",
        "      16384    4   8  batch.global_batch_min: every DP rank needs at least one micro batch per step:",
        "                      global_batch_size >= 8",
        "       3000    -   8  plan.slots_divisible: 65536 token slots are not a whole number of 3000-token",
        "                      rows",
    ]


def test_cli_plan_marks_lengths_above_the_context_window(
    megatron_bridge: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Llama-3-8B was trained to 8,192 positions (its HF max_position_embeddings): 16k rows are not "ok"."""
    from mbridge_seqpack.recipes.building_blocks import llama3_8b_provider

    assert llama3_8b_provider().seq_length == 8192  # what the bridge maps max_position_embeddings to
    assert main(["plan", "--slots", "65536", "--lengths", "8192,16384", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["pack_length"], r["ok"], r["within_context"], r["context_window"]) for r in rows] == [
        (8192, True, True, 8192),
        (16384, False, False, 8192),
    ]
    assert main(["plan", "--slots", "65536", "--lengths", "16384"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0]
        == "plan for llama3_8b_sft_packed_8k: 65,536 token slots per optimizer step; context window 8,192 tokens"
    )
    assert out[-1].split(None, 3) == ["16384", "4", "4", "above the model's 8,192-token context window"]
    assert (
        main(
            [
                "plan",
                "small_gpt_smoke_4k",
                "--slots",
                "65536",
                "--lengths",
                "16384",
                "--context-window",
                "32768",
                "--world-size",
                "1",
            ]
        )
        == 0
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "model.context_parallel_size=3", "dataset.offline_packing_specs.pad_seq_to_mult=5", "--rules-only"],
        ["check", "qwen25_vl_3b_sft_in_batch_4k", "model.cuda_graph_impl=transformer_engine", "--rules-only"],
        ["recipes"],
        ["recipes", "--layout"],
        ["plan", "--slots", "262144"],
    ],
)
def test_cli_output_fits_100_columns(
    megatron_bridge: Any, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    main(argv)
    out = capsys.readouterr().out
    assert out.strip() and max(len(line) for line in out.splitlines()) <= 100


def test_readme_main_command_runs_from_a_shell(megatron_bridge: Any) -> None:
    """The console script on the embedded default exits 0; a broken override exits 1 with the fix (its process
    imports Megatron-Bridge: the fixture marks the test slow)."""
    exe = Path(sys.executable).with_name("mbridge-seqpack")
    done = subprocess.run(
        [str(exe), "check", "--rules-only", "model.context_parallel_size=3"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "fix:      cfg.model.seq_length = 8196" in done.stdout


def test_a_pasted_run_recipe_line_reads_as_the_runner_reads_it() -> None:
    """#39: ``check`` after a pasted torchrun launch line of run_recipe.py (r0.6.0): the launcher dropped, the world
    size from --nproc-per-node x --nnodes, the convenience flags as the runner's overrides (before the trailing
    ones, strings JSON-quoted), the runner's own options kept; no Megatron import."""
    from mbridge_seqpack.cli.check import split_target, take_runner_line
    from mbridge_seqpack.cli.launch_line import launcher_world, runner_args
    from mbridge_seqpack.cli.main import parse_args
    from mbridge_seqpack.recipes.runner import RunnerArgs

    line = (
        "check torchrun --nproc-per-node=8 --nnodes 1:2 --rdzv-endpoint host:29500 scripts/training/run_recipe.py "
        "--recipe llama32_1b_sft_1gpu_h100_bf16_config -cp 2 -tp 2 -gb 64 -mb 2 -sl 8192 -vp 2 --lr 1e-05 "
        "--save_dir /ckpt --deterministic --dataset squad --mode sft model.sequence_parallel=true --rules-only"
    )
    args = parse_args(line.split())
    split_target(args)
    take_runner_line(args)
    assert args.target == "llama32_1b_sft_1gpu_h100_bf16_config"
    assert args.overrides == [
        "train.global_batch_size=64",
        "train.micro_batch_size=2",
        "dataset.seq_length=8192",
        "model.tensor_model_parallel_size=2",
        "model.context_parallel_size=2",
        "model.virtual_pipeline_model_parallel_size=2",
        "optimizer.lr=1e-05",
        'checkpoint.save="/ckpt"',
        "model.sequence_parallel=true",
    ]
    assert launcher_world(args) == (16, "--nproc-per-node 8 x --nnodes 2")
    assert runner_args(args) == RunnerArgs(mode="sft", dataset="squad", deterministic=True)
    assert args.rules_only is True
    model = parse_args(["check", "--model", "llama3_8b", "--mode", "lora", "-pp", "2"])
    split_target(model)
    take_runner_line(model)
    assert (model.target, model.overrides) == ("llama3_8b_peft_config", ["model.pipeline_model_parallel_size=2"])


REFUSED_LINES = [
    (["check", "--model", "llama3_8b"], "--model needs --mode (run_recipe.py: the recipe is <model>_<task>_config)"),
    (["check", "--recipe", "a_config", "--model", "b"],
     "--recipe and --model are exclusive (as in run_recipe.py): pass one"),
    (["check", "x_config", "--recipe", "a_config"], "a recipe named twice: 'x_config' and --recipe/--model; pass one"),
    (["check", "--recipe", "a_config", "--nnodes", "2"],
     "--nnodes without --nproc-per-node: pass both (torchrun's) or --world-size"),
    (["check", "--recipe", "a_config", "--nproc-per-node", "gpu"],
     "--nproc-per-node 'gpu': expected a GPU count (gpu/auto are not known here)"),
]  # fmt: skip


@pytest.mark.parametrize("argv, message", REFUSED_LINES)
def test_a_launch_line_the_runner_would_refuse_is_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert unwrap(capsys.readouterr().err) == f"mbridge-seqpack: error: {message}\n"
