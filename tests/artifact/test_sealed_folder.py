"""A sealed pack is complete or refused (issue 43 item 5): a split the launch would prepare into its folder, and an
unsealed file beside it, are refused at validate(), and a refused launch leaves the folder byte for byte as it was.
Also: Megatron-Bridge's per-example truncation warning is folded into one line, and inspect shows no counts for a
split it could not read."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

import mbridge_seqpack
from mbridge_seqpack.cli.main import main

DATA = Path(__file__).resolve().parents[2] / "mbridge_seqpack" / "data" / "sft_sample"
RECIPE = "small_gpt_smoke_4k"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def training_only(tmp_path: Path, megatron_bridge: Any) -> tuple[Path, Any]:
    """``pack --recipe`` of a dataset root that has only a training split: a sealed folder at the builder's default
    location without validation, and the config of that recipe (which validates)."""
    from mbridge_seqpack.artifact.builder_location import builder_location
    from mbridge_seqpack.recipes.targets import build_launch

    root = tmp_path / "root"
    root.mkdir()
    (root / "training.jsonl").write_text("".join(DATA.joinpath("training.jsonl").read_text().splitlines(True)[:60]))
    overrides = [f"dataset.dataset_root={root}", "dataset.max_train_samples=800"]
    assert main(["pack", "--recipe", RECIPE, *overrides, "--json"]) == 0
    cfg = build_launch(RECIPE, overrides).cfg
    return builder_location(cfg).directory, cfg


def test_a_split_the_launch_would_prepare_into_a_sealed_folder_is_refused_and_nothing_is_written(
    training_only: tuple[Path, Any],
) -> None:
    from megatron.bridge.training.config import runtime_config_update

    folder, cfg = training_only
    before = _snapshot(folder)
    assert sorted(before) == ["4096_metadata.jsonl", "training_4096.idx.parquet"]
    (v,) = [v for v in mbridge_seqpack.check(cfg, world_size=1) if v.rule_id == "artifact.fingerprint_mismatch"]
    assert v.rule.startswith(
        f"the validation split is missing from the sealed pack whose metadata is {folder / '4096_metadata.jsonl'}: "
        f"Megatron-Bridge's builder would prepare it at launch, into {folder / 'validation_4096.idx.parquet'}"
    )
    assert v.overrides == ["dataset.do_validation=false"]
    with mbridge_seqpack.install(world_size=1), pytest.raises(ValueError, match=r"artifact\.fingerprint_mismatch"):
        runtime_config_update(cfg)
    assert _snapshot(folder) == before  # the refused launch wrote nothing into the sealed folder
    cfg.dataset.do_validation = False
    assert [v for v in mbridge_seqpack.check(cfg, world_size=1) if v.rule_id.startswith("artifact.")] == []


def test_an_unsealed_file_beside_a_sealed_pack_is_refused(training_only: tuple[Path, Any], tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    folder, cfg = training_only
    added = folder / "validation_4096.idx.parquet"  # as Megatron-Bridge's prep writes it: no seal in its footer
    rows = pq.read_table(folder / "training_4096.idx.parquet")
    pq.write_table(rows.replace_schema_metadata(None), added)
    cfg.dataset.offline_packing_specs.packed_val_data_path = str(added)
    (v,) = [v for v in mbridge_seqpack.check(cfg, world_size=1) if v.rule_id == "artifact.fingerprint_mismatch"]
    assert v.rule.startswith(
        f"{added}: not sealed, though 4096_metadata.jsonl beside it seals a pack of split(s) ['training']"
    )


def test_megatron_bridges_per_example_truncation_warning_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, megatron_bridge: Any
) -> None:
    source = tmp_path / "data.jsonl"
    source.write_text("".join(DATA.joinpath("training.jsonl").read_text().splitlines(True)[:120]))
    with caplog.at_level(logging.WARNING):
        assert main(["pack", str(source), "--pack-size", "256", "--output", str(tmp_path / "p")]) == 0
    per_example = [r for r in caplog.records if r.getMessage().endswith("is not long enough to truncate.")]
    assert per_example == []
    err = " ".join(capsys.readouterr().err.split())
    assert "note: Megatron-Bridge's prep of data.jsonl warned " in err
    assert " time(s) like 'input is not long enough to truncate.' (a truncation field shorter than its share" in err


def test_inspect_shows_no_counts_for_a_split_it_could_not_read(
    training_only: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _ = training_only
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "training_4096.idx.parquet").write_bytes(b"not parquet")
    capsys.readouterr()
    assert main(["inspect", str(broken)]) == 1
    out = capsys.readouterr().out
    assert "0 tokens, efficiency 0.00%" not in out
    assert "training (training_4096.idx.parquet, " in out and "): not read\n    PROBLEM: " in out
    assert json.loads((broken / "4096_metadata.jsonl").read_text())[0]["split"] == "training"
