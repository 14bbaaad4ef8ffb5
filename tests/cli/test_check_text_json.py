"""Issue #53: ``check``'s text and ``--json`` say the same. At CP=2 the text once said "equivalence check: not
determined here" under ``result: OK`` while the JSON said ok: what stood in for TE's CUDA-only partition kernel is
now said as such, in both, and every note line of the text is in the JSON."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from mbridge_seqpack.cli.main import main

CP2 = ["small_gpt_smoke_4k", "model.context_parallel_size=2", "--world-size", "2"]


def _notes(text: str) -> list[str]:
    """The text's ``note:`` lines, each joined with the lines it wraps onto."""
    joined: list[str] = []
    for line in text.splitlines():
        if line.startswith("  ") and joined and joined[-1].startswith("note: "):
            joined[-1] += " " + line.strip()
        else:
            joined.append(line)
    return [line.removeprefix("note: ") for line in joined if line.startswith("note: ")]


def test_text_and_json_agree_at_cp2(megatron_bridge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    assert main(["check", *CP2, "--fix"]) == 0
    fixed = shlex.split(capsys.readouterr().out.strip())
    argv = ["check", CP2[0], *fixed, *CP2[2:]]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    first = text.splitlines()[0]
    assert report["ok"] and first.startswith("result: OK")
    assert report["determined"] == ("NOT DETERMINED" not in first) == (report["undetermined"] == [])
    if report["determined"]:
        assert "not determined" not in text.lower()
    assert _notes(text) == report["notes"]
    stood_in = [n for n in report["notes"] if n.startswith("equivalence check: stood in here: Transformer Engine's")]
    assert len(stood_in) == (0 if torch.cuda.is_available() else 1)


def test_check_lists_every_failure_of_megatron_bridges_validate(
    megatron_bridge: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Megatron-Bridge's own validate() stops at its first failure; ``check`` shows each (text and JSON alike), the
    first being what Megatron-Bridge's runtime_config_update raised."""
    argv = [
        "check", "small_gpt_smoke_4k", "train.num_epochs=1", "dist.use_megatron_fsdp=true",
        "dist.use_torch_fsdp2=true", "--world-size", "1",
    ]  # fmt: skip
    assert main(argv) == 1
    text = capsys.readouterr().out
    assert main([*argv, "--json"]) == 1
    validate = json.loads(capsys.readouterr().out)["megatron_bridge_validate"]
    assert validate["ok"] is False
    assert validate["errors"] == [
        validate["error"],
        "ValueError: use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive.",
        "AssertionError: Megatron-FSDP requires the fsdp_dtensor checkpointing format!",
    ]
    assert validate["error"].startswith("AssertionError: Cannot specify more than one of train_iters")
    joined = " ".join(text.split())
    assert f"megatron-bridge validate(): FAILED: {validate['error']}" in joined
    assert "also FAILED: ValueError: use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive." in joined
