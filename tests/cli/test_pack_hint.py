"""Issue #53: ``check --fix`` raising ``pad_seq_to_mult`` moves the folder Megatron-Bridge's builder reads the pack
from; ``--fix`` says so with the ``pack`` command that makes the new one, ``check`` on the fixed config says no pack
is there (not a bare "no sealed pack found" beside ``result: OK``), and the printed command makes the pack the check
then finds."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.cli.main import main
from mbridge_seqpack.recipes.building_blocks import embedded_data_dir

RECIPE = "small_gpt_smoke_4k"
#: the embedded validation split at DP 8, global batch 16: what check will refuse, said by pack first
WARNINGS = [
    "warning: the batch sampler needs 16 validation rows per evaluation batch and the packed split holds 11: the "
    "first evaluation fails, after eval_interval training steps; add validation.eval_global_batch_size=8"
]


def _checked(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[bool, list[str]]:
    """``check ARGV --json --rules-only``: ok, and its notes (whole, as the text's note: lines unwrapped)."""
    import json

    assert main(["check", *argv, "--json", "--rules-only"]) == 0
    report = json.loads(capsys.readouterr().out)
    return report["ok"], report["notes"]


def _folders(root: Path) -> list[Path]:
    return sorted(path for path in (root / "packed").iterdir() if path.is_dir())


def test_a_fix_that_moves_the_pack_says_so_with_the_pack_command(
    megatron_bridge: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "data"
    shutil.copytree(embedded_data_dir(), root)
    mine = [f"dataset.dataset_root={root}"]
    assert main(["pack", "--recipe", RECIPE, *mine]) == 0
    (old,) = _folders(root)
    capsys.readouterr()
    ok, notes = _checked(capsys, RECIPE, *mine)
    assert ok and not [n for n in notes if n.startswith("no pack")]  # found where it is read

    cp2 = [*mine, "model.context_parallel_size=2"]
    assert main(["check", RECIPE, *cp2, "--world-size", "2", "--fix"]) == 0
    captured = capsys.readouterr()
    fixed = shlex.split(captured.out.strip())
    assert "dataset.offline_packing_specs.pad_seq_to_mult=4" in fixed
    command = f"mbridge-seqpack pack --recipe {RECIPE} {' '.join(fixed)}"
    (moved,) = [line for line in captured.err.splitlines() if line.startswith("# the fixes move")]
    new = old.name.replace("pad_seq_to_mult1_", "pad_seq_to_mult4_").rsplit("_", 1)[0]
    assert moved.startswith(f"# the fixes move the pack Megatron-Bridge reads from {old.name} to {new}_")
    assert moved.endswith("(the pack made before no longer matches the config); make the new one: " + command), moved

    ok, notes = _checked(capsys, RECIPE, *fixed, "--world-size", "2")
    (note,) = [n for n in notes if n.startswith("no pack")]
    assert ok  # Megatron-Bridge's prep would make an unsealed pack at launch: said beside the verdict
    assert note.startswith(f"no pack where Megatron-Bridge's builder reads it for this config ({root}/packed/{new}_")
    assert note.endswith(
        f"(the pack(s) beside it, {old.name}, were made for other settings); make it before the launch: {command}"
    )

    assert main(shlex.split(command)[1:]) == 0  # the printed command, as printed
    assert len(_folders(root)) == 2
    capsys.readouterr()
    assert main(["check", RECIPE, *fixed, "--world-size", "2", "--rules-only"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("result: OK") and "no pack where" not in out and "no sealed pack found" not in out


def test_pack_takes_a_pasted_launch_line_and_says_where_its_world_size_came_from(
    megatron_bridge: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pack torchrun ... run_recipe.py --recipe NAME -gb 16 key=value``: the recipe, the convenience flags as the
    runner's overrides, the world size from torchrun's flags (said in one line); a runner option that changes more
    than overrides is refused."""
    import json

    root = tmp_path / "data"
    shutil.copytree(embedded_data_dir(), root)
    line = "torchrun --nproc-per-node 4 --nnodes 2 scripts/training/run_recipe.py --recipe small_gpt_smoke_4k -gb 16"
    argv = ["pack", *line.split(), f"dataset.dataset_root={root}", "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    notes = " ".join(captured.err.split())
    assert (
        "note: rows laid out for world size 8 (DP 8) from --nproc-per-node 4 x --nnodes 2; pass --world-size N"
        in notes
    )
    (training,) = [split for name, split in json.loads(captured.out)["splits"].items() if name == "training"]
    assert (training["balance"]["data_parallel"], training["balance"]["micro_batches"]) == (8, 2)
    assert json.loads(captured.out)["warnings"] == WARNINGS  # --json says what the text says check will refuse
    with pytest.raises(SystemExit) as exited:  # argparse's usage error: exit 2, the usage line and one message
        main(["pack", *line.split(), "--dataset", "squad", f"dataset.dataset_root={root}"])
    assert exited.value.code == 2
    assert (
        capsys.readouterr().err.split("error: ", 1)[1].split()
        == (
            "pack takes a pasted run_recipe.py line's recipe, convenience flags and overrides; --dataset changes more "
            "than overrides: drop it (pack packs the recipe's own dataset settings)"
        ).split()
    )
