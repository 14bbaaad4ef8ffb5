"""``pack`` on the command line is three steps (cli/data.py): resolve the request (nothing read or written, a user
mistake refused), run it, render the report (cli/pack_summary.py); each can be called on its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.cli.data import PackRequest, resolve_pack, run_pack
from mbridge_seqpack.cli.main import parse_args
from mbridge_seqpack.cli.pack_summary import PackReport
from mbridge_seqpack.errors import UsageError
from mbridge_seqpack.pipeline.ray_engine import RayEngine
from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir


def test_resolving_reads_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = parse_args(["pack", "--pack-size", "2048", "--output", str(out), "--ray", "local", "--ray-shard-mb", "2"])
    request = resolve_pack(args)
    assert isinstance(request, PackRequest) and not out.exists()
    assert request.inputs == {
        "training": embedded_data_dir() / "training.jsonl",
        "validation": embedded_data_dir() / "validation.jsonl",
    }
    assert (request.output, request.tokenizer, request.found_by_builder) == (out, embedded_tokenizer_dir(), False)
    assert (request.options.pack_size, request.options.pad_seq_to_mult, request.launched) == (2048, 1, None)
    assert isinstance(request.engine, RayEngine) and request.engine.shard_bytes == 2 << 20
    assert request.engine.ray is None  # joined only when the pack runs


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pack"], "pack needs --pack-size N (or --recipe NAME to take it from a recipe)"),
        (["pack", "a.jsonl", "b.jsonl"], "pack takes one INPUT file, got 2: a.jsonl b.jsonl"),
        (["pack", "--pack-size", "8", "x=1"], "overrides ['x=1'] need --recipe NAME"),
    ],
)
def test_a_mistake_is_refused_while_resolving(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        resolve_pack(parse_args(argv))
    assert str(caught.value) == message


def test_run_then_render_is_what_pack_prints(tmp_path: Path, megatron_bridge: Any, capsys: Any) -> None:
    from mbridge_seqpack.cli.main import main

    source = tmp_path / "train.jsonl"
    source.write_text("\n".join((embedded_data_dir() / "training.jsonl").read_text().splitlines()[:40]) + "\n")
    argv = ["pack", str(source), "--pack-size", "2048", "--data-parallel", "2", "--output", str(tmp_path / "a")]
    request = resolve_pack(parse_args(argv))
    report = PackReport(run_pack(request), 2048, request.found_by_builder, request.launched)
    assert main([*argv[:-1], str(tmp_path / "b"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    rendered = json.loads(report.to_json())
    assert rendered["splits"] == printed["splits"]  # the same pack: the entries agree, paths aside
    assert rendered["directory"] == str(tmp_path / "a") and rendered["found_by_megatron_bridge"] is False
    text = report.to_text()
    assert text.startswith(f"packed into {tmp_path / 'a'}\n  training: 40 sequences -> ")
    assert f"packed_train_data_path={tmp_path / 'a' / 'training_2048.idx.parquet'}" in text
