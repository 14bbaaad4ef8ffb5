"""Fixes in Megatron-Bridge's own override syntax: `check --fix` prints one override set that, applied with
Megatron-Bridge's process_config_with_overrides, leaves zero violations; every violation renders both forms."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack import check
from mbridge_seqpack.overrides import check_override_syntax, converged_fix, render_override

pytestmark = pytest.mark.slow

CP2 = ["model.context_parallel_size=2"]
BROKEN: list[tuple[int, list[str]]] = [
    (8, CP2),
    (8, CP2 + ["model.calculate_per_token_loss=true"]),
    (8, ["model.context_parallel_size=4", "dataset.offline_packing_specs.pad_seq_to_mult=6"]),
    (8, ["train.micro_batch_size=2"]),
    (8, ["train.global_batch_size=12"]),
    (8, ["train.global_batch_size=4"]),
    (8, ["dataset.offline_packing_specs.pad_cu_seqlens=true"]),
    (8, ["dataset.seq_length=2048"]),
    (32, ["model.tensor_model_parallel_size=32", "model.sequence_parallel=true", "train.global_batch_size=32"]),
    (8, ["dataset.offline_packing_specs.max_single_sequence_length=8192"]),
    (8, ["dataset.offline_packing_specs.pad_seq_to_mult='4'"]),
    (
        8,
        CP2
        + [
            "model.tensor_model_parallel_size=2",
            "model.sequence_parallel=true",
            "model.seq_length=4094",
            "dataset.seq_length=4094",
            "dataset.offline_packing_specs.packed_sequence_size=4094",
        ],
    ),
]


def _apply(cfg: Any, overrides: list[str]) -> Any:
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    return process_config_with_overrides(copy.deepcopy(cfg), cli_overrides=overrides)


@pytest.mark.parametrize("world, overrides", BROKEN, ids=[" ".join(o)[:60] for _, o in BROKEN])
def test_fix_converges_through_megatron_bridges_override_function(
    packed_cfg: Any, world: int, overrides: list[str]
) -> None:
    broken = _apply(packed_cfg, overrides)
    assert check(broken, world_size=world), "the table row must be broken"
    fixes, remaining = converged_fix(broken, lambda c: check(c, world_size=world))
    assert remaining == []
    check_override_syntax(fixes)
    assert check(_apply(packed_cfg, overrides + fixes), world_size=world) == []  # applied once, by Megatron-Bridge


def test_every_violation_renders_a_python_and_a_hydra_fix(packed_cfg: Any) -> None:
    cfg = _apply(packed_cfg, CP2)
    found = {v.rule_id: v for v in check(cfg, world_size=8)}
    assert found["offline.alignment_multiple"].overrides == ["dataset.offline_packing_specs.pad_seq_to_mult=4"]
    assert found["cp.finetune_per_token_loss"].overrides == ["model.calculate_per_token_loss=true"]
    assert "    override: model.calculate_per_token_loss=true" in found["cp.finetune_per_token_loss"].describe()
    assert (
        render_override("dataset.dataset_kwargs.pad_to_max_length", True)
        == "++dataset.dataset_kwargs.pad_to_max_length=true"
    )
    assert (
        render_override("model.hierarchical_context_parallel_sizes", [2, 4])
        == "model.hierarchical_context_parallel_sizes=[2,4]"
    )
    assert render_override("model.mtp_num_layers", None) == "model.mtp_num_layers=null"
    assert render_override("model.cuda_graph_impl", "none") == "model.cuda_graph_impl=none"


def test_cli_check_fix_and_early_syntax_errors(megatron_bridge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The syntax error is refused by a fresh process before Megatron-Bridge's import; --fix's last line, pasted
    back as overrides, checks clean (in this process: Megatron-Bridge is imported once per session)."""
    from mbridge_seqpack.cli.main import main

    exe = [sys.executable, "-m", "mbridge_seqpack"]
    bad = subprocess.run([*exe, "check", "model.seq_length=[1,"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "is not valid Hydra override syntax" in bad.stderr
    assert "Traceback" not in bad.stderr
    capsys.readouterr()
    assert main(["check", "--fix", "model.context_parallel_size=2"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("model.context_parallel_size=2 ")
    code = main(["check", "--rules-only", *line.split()])
    assert code == 0, capsys.readouterr().out[-3000:]


def test_fix_collapses_a_key_the_user_also_set() -> None:
    """The printed set holds each key once (the fix's value wins over the user's), so it pastes as one command."""
    from mbridge_seqpack.cli.check import collapsed

    given = ["model.context_parallel_size=2", "dataset.offline_packing_specs.pad_seq_to_mult=1", "train.gbs=8"]
    fixes = ["model.calculate_per_token_loss=true", "dataset.offline_packing_specs.pad_seq_to_mult=4"]
    assert collapsed([*given, *fixes]) == [
        "model.context_parallel_size=2",
        "dataset.offline_packing_specs.pad_seq_to_mult=4",
        "train.gbs=8",
        "model.calculate_per_token_loss=true",
    ]
    assert collapsed(["dataset.dataset_kwargs.add_eos=true", "++dataset.dataset_kwargs.add_eos=false"]) == [
        "++dataset.dataset_kwargs.add_eos=false"
    ]


def test_fix_offers_a_world_size_where_no_override_helps(
    megatron_bridge: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """TP 4 on 6 GPUs: no override makes 6 work, so --fix names the nearest GPU count that does (8, the larger of
    4 and 8), with the fixes for it; pasted back at that world size, the config checks clean."""
    from mbridge_seqpack.cli.main import main

    capsys.readouterr()
    argv = ["check", "small_gpt_smoke_4k", "--world-size", "6", "model.tensor_model_parallel_size=4"]
    assert main([*argv, "--fix"]) == 0
    out, err = capsys.readouterr()
    assert "# and run on 8 GPUs (check it with --world-size 8): no override makes the world size asked work" in err
    line = out.strip().splitlines()[-1]
    assert line.startswith("model.tensor_model_parallel_size=4")
    assert main(["check", "small_gpt_smoke_4k", "--rules-only", "--world-size", "8", *line.split()]) == 0


def test_fix_offers_the_overrides_that_match_the_pack(
    megatron_bridge: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pack of 2048-token rows aligned to 4, named by path in a 4k recipe: --fix makes the config read it as it
    was made (the length owned by dataset.seq_length, the model's following), and the result checks clean."""
    from mbridge_seqpack.cli.main import main
    from mbridge_seqpack.recipes.building_blocks import embedded_data_dir

    data = embedded_data_dir()
    argv = ["pack", str(data / "training.jsonl"), "--validation", str(data / "validation.jsonl")]
    assert main([*argv, "--pack-size", "2048", "--pad-seq-to-mult", "4", "--output", str(tmp_path / "p")]) == 0
    specs = "dataset.offline_packing_specs"
    paths = [
        f"{specs}.packed_train_data_path={tmp_path / 'p' / 'training_2048.idx.parquet'}",
        f"{specs}.packed_val_data_path={tmp_path / 'p' / 'validation_2048.idx.parquet'}",
    ]
    capsys.readouterr()
    assert main(["check", "small_gpt_smoke_4k", "--world-size", "8", *paths, "--fix"]) == 0
    fixed = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert {
        f"{specs}.packed_sequence_size=2048",
        "dataset.seq_length=2048",
        "model.seq_length=2048",
        f"{specs}.pad_seq_to_mult=4",
    } <= set(fixed)
    assert main(["check", "small_gpt_smoke_4k", "--rules-only", "--world-size", "8", *fixed]) == 0
