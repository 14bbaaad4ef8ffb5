"""#43 item 6: the hook's kept verdict is keyed on what it read. A config refused for a bad pack is accepted in the
same process once the pack is fixed: the stamps (inode, size, mtime_ns) of every file and folder the verdict read are
part of the key, and a verdict that raised is not kept at all."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.packs import run_pack, small_jsonl

pytestmark = pytest.mark.slow


def _date_back(*roots: Path) -> None:
    """Every file and folder under ``roots`` ten seconds old: stamps a kept verdict may trust (not racy)."""
    past = time.time() - 10
    for root in roots:
        for path in [root, *root.rglob("*")]:
            os.utime(path, (past, past))


def _break_the_metadata(pack: Path) -> None:
    """An edited max_samples_per_bin: the entry seal refuses it."""
    meta = pack / "4096_metadata.jsonl"
    entries = json.loads(meta.read_text())
    entries[0]["max_samples_per_bin"] += 1
    meta.write_text(json.dumps(entries))


@pytest.fixture
def broken(tmp_path: Path, packed_cfg: Any) -> tuple[Any, Path, Path]:
    """A config whose packed path names a pack with an edited metadata entry, and the JSONL it was made from."""
    (tmp_path / "root").mkdir()
    source = small_jsonl(tmp_path / "root" / "training.jsonl")
    run_pack({"training": source}, tmp_path / "pack")
    _break_the_metadata(tmp_path / "pack")
    packed_cfg.dataset.dataset_root = str(tmp_path / "root")
    specs = packed_cfg.dataset.offline_packing_specs
    specs.packed_train_data_path = str(tmp_path / "pack" / "training_4096.idx.parquet")
    packed_cfg.dataset.do_validation = False
    packed_cfg.dataset.max_train_samples = 16000  # one row of 40 records: the batches repeat it
    _date_back(tmp_path)
    return packed_cfg, tmp_path / "pack", source


def _pack_rule_ids(violations: list[Any]) -> list[str]:
    return [v.rule_id for v in violations if v.rule_id == "artifact.fingerprint_mismatch"]


def test_a_kept_verdict_is_judged_again_once_a_file_it_read_changed(broken: tuple[Any, Path, Path]) -> None:
    from mbridge_seqpack import hook

    cfg, pack, source = broken
    assert _pack_rule_ids(hook._report(cfg, keep=True)) == ["artifact.fingerprint_mismatch"]
    assert hook._checked["stamps"] is not None  # kept, with the stamps of what it read
    assert str(pack / "4096_metadata.jsonl") in hook._checked["reads"]
    run_pack({"training": source}, pack)  # fixed: re-packed in place
    _date_back(pack)
    assert _pack_rule_ids(hook._report(cfg, keep=True)) == []


def test_a_config_refused_for_a_bad_pack_is_accepted_once_the_pack_is_fixed(broken: tuple[Any, Path, Path]) -> None:
    from megatron.bridge.training.config import runtime_config_update

    import mbridge_seqpack
    from mbridge_seqpack.errors import PackingConfigError

    cfg, pack, source = broken
    os.environ["WORLD_SIZE"] = "8"  # the conftest fixture restores the environment
    with mbridge_seqpack.install():
        with pytest.raises(PackingConfigError) as info:
            runtime_config_update(cfg)
        assert info.value.rule_ids == ["artifact.fingerprint_mismatch"]
        run_pack({"training": source}, pack)
        _date_back(pack)
        runtime_config_update(cfg)  # the same config object, in the same process
