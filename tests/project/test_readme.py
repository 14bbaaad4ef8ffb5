"""The README's commands run as written, offline, and fail for the reason the README gives; its sample error is the
one the default recipe with CP=2 raises."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    """The fenced blocks of ``language`` ("" for a plain fence), read fence by fence."""
    blocks, current, opened = [], [], None
    for line in README.splitlines():
        if line.startswith("```"):
            if opened is None:
                opened, current = line[3:].strip(), []
            else:
                if opened == language:
                    blocks.append("\n".join(current) + "\n")
                opened = None
        elif opened is not None:
            current.append(line)
    return blocks


def _commands() -> list[tuple[list[str], int]]:
    """Every ``mbridge-seqpack ...`` line of the README's shell blocks, with the exit code its comment says (0 when
    it says none)."""
    found = []
    for block in _blocks("sh"):
        for line in block.splitlines():
            command, _, comment = line.partition("#")
            if command.startswith("mbridge-seqpack "):
                said = re.search(r"exit (\d)", comment)
                found.append((shlex.split(command)[1:], int(said.group(1)) if said else 0))
    return found


def test_the_readme_has_commands_to_run() -> None:
    assert [argv[0] for argv, _ in _commands()] == ["check", "check", "pack"]


@pytest.mark.parametrize("argv, code", _commands(), ids=lambda x: " ".join(x) if isinstance(x, list) else str(x))
def test_each_command_runs_as_written(
    argv: list[str], code: int, megatron_bridge: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # `pack --output out/...` writes here
    assert main(argv) == code, capsys.readouterr()
    out = capsys.readouterr().out
    if argv[0] == "check" and "--fix" not in argv:
        assert out.startswith("result: 2 violation(s)")
    if "--fix" in argv:
        fixed = shlex.split(out.strip())
        assert main(["check", *argv[1 : argv.index("--fix")], *fixed[1:], "--rules-only"]) == 0
    if argv[0] == "pack":
        assert (tmp_path / "out" / "my_pack" / "training_8192.idx.parquet").is_file()


def test_the_offline_cuda_graph_example_fails_for_the_reason_given(megatron_bridge: Any, capsys: Any) -> None:
    (sentence,) = re.findall(r"offline: `(mbridge-seqpack check [^`]+)`", README.replace("\n", " "))
    assert main(shlex.split(sentence)[1:] + ["--rules-only"]) == 1
    out = capsys.readouterr().out
    failed = re.findall(r"^  FAIL (\S+)", out, flags=re.M)
    assert failed == [
        "cuda_graphs.training_graphs_need_fixed_width",
        "cuda_graphs.attention_graphs_need_pad_cu_seqlens",
    ]


def test_the_sample_error_is_the_one_raised(megatron_bridge: Any) -> None:
    """The README's sample is the error the default recipe with CP=2 raises, line for line."""
    import mbridge_seqpack
    from mbridge_seqpack.recipes import build_recipe

    (sample,) = [b for b in _blocks("") if b.startswith("mbridge_seqpack: ")]
    cfg = build_recipe("llama3_8b_sft_packed_8k")
    cfg.model.context_parallel_size = 2
    with mbridge_seqpack.install(world_size=8), pytest.raises(ValueError) as info:
        cfg.validate()
    assert sample == str(info.value) + "\n"


def test_megatron_bridges_own_validate_names_one_setting_of_the_cuda_graph_launch(megatron_bridge: Any) -> None:
    """The README: Megatron-Bridge's validate() refuses the full-iteration graph launch too, naming one setting
    (pad_cu_seqlens on its recipe, pad_to_max_length on the packaged one); the rules name each violation, a host read
    of a device value inside the capture among them."""
    from mbridge_seqpack.cli.check import check_target
    from tests.zoo.harness import offline

    graphs = ["model.cuda_graph_impl=local", "model.cuda_graph_scope=full_iteration"]
    assert "`validate()` names `pad_to_max_length`" in README.replace("\n", " ")
    with offline():
        report = check_target("llama3_8b_sft_2gpu_h100_bf16_config", graphs, None)
    assert report.megatron_error.startswith(
        "ValueError: Packed attention CUDA graphs require offline_packing_specs.pad_cu_seqlens=True."
    )
    assert {v.rule_id for v in report.errors} >= {
        "cuda_graphs.attention_graphs_need_pad_cu_seqlens",
        "cuda_graphs.capture_host_reads",
    }
    packaged = check_target("llama3_8b_sft_packed_8k", graphs, None)
    assert packaged.megatron_error == (
        "ValueError: Offline packing with CUDA graphs requires dataset pad_to_max_length=True."
    )
