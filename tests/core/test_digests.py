"""Launch-time cost independent of pack size (#23), and a cache that cannot lie (#35): the config-time rule reads
metadata and Parquet footers only and trusts no file by its stamp; remembered digests are hints, recorded only from
bytes that matched their seal and evicted by a stamp change or a failed verification."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack import digests
from mbridge_seqpack.artifact.inspect_artifact import inspect_artifact
from mbridge_seqpack.artifact.store import date_back
from mbridge_seqpack.digests import FileStamp, launch_sha256, remember, verified_sha256
from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir
from mbridge_seqpack.report import check

DATA = embedded_data_dir()
TRAIN = "training_4096.idx.parquet"


def _file_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every whole-file hash from now on (the plugin's own reader, not Megatron's)."""
    import sys

    reads: list[str] = []
    real = digests.file_sha256

    def counting(path: str | Path, chunk: int = 1 << 20) -> str:
        reads.append(Path(path).name)
        return real(path, chunk)

    for name, module in list(sys.modules.items()):  # every module that binds it (sequences re-exports it)
        if name.startswith("mbridge_seqpack") and getattr(module, "file_sha256", None) is real:
            monkeypatch.setattr(module, "file_sha256", counting)
    return reads


def _pack_rule(cfg: Any) -> list[Any]:
    return [v for v in check(cfg, world_size=8) if v.rule_id == "artifact.fingerprint_mismatch"]


@pytest.fixture
def packed(tmp_path: Path, packed_cfg: Any) -> tuple[Path, Any]:
    """A fresh pack of the embedded corpus, and a config that names it and the data it was made from."""
    out = tmp_path / "pack"
    pack_jsonl(
        {"training": DATA / "training.jsonl", "validation": DATA / "validation.jsonl"},
        tokenizer=embedded_tokenizer_dir(),
        output_dir=out,
        options=PackOptions(pack_size=4096, pad_seq_to_mult=4),
    )
    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    specs.packed_train_data_path = str(out / TRAIN)
    specs.packed_val_data_path = str(out / "validation_4096.idx.parquet")
    specs.packed_metadata_path = str(out / "4096_metadata.jsonl")
    packed_cfg.dataset.dataset_root = str(DATA)  # the input digests are compared too
    packed_cfg.tokenizer.tokenizer_model = str(embedded_tokenizer_dir())  # and the tokenizer files
    return out, packed_cfg


@pytest.mark.slow
def test_the_first_launch_after_pack_reads_no_whole_file(
    packed: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """pack hashed its outputs, inputs and tokenizer files in full; the launch compares stamps, sizes and 64 KiB
    tails only."""
    _, cfg = packed
    reads = _file_reads(monkeypatch)
    assert _pack_rule(cfg) == []
    assert reads == []


@pytest.mark.slow
def test_a_written_file_passes_validate_and_is_refused_by_the_launchs_content_check(
    packed: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flip inside a row group is beyond validate()'s O(metadata) look (no whole file is read there); the
    content check the launch runs before its first optimizer step reads it and names the row group."""
    from mbridge_seqpack.artifact.pack_files import content_plan

    out, cfg = packed
    target = out / TRAIN
    data = bytearray(target.read_bytes())
    data[len(data) // 3] ^= 0x10  # same size, other bytes, written now: another mtime
    target.write_bytes(bytes(data))
    reads = _file_reads(monkeypatch)
    assert _pack_rule(cfg) == []
    assert reads == []
    (problem,) = content_plan(cfg).run()
    assert problem.startswith(f"{target}: row group 0 (rows 0..")
    assert "differs from its seal" in problem


@pytest.mark.slow
def test_a_copied_or_swapped_file_is_not_trusted_by_its_old_record(packed: tuple[Path, Any], tmp_path: Path) -> None:
    """Records are keyed by real path and inode: a copy (even with its mtime kept) is read in full once; a
    validation file moved onto the training name is refused whatever is remembered."""
    out, cfg = packed
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)  # copy2 keeps the mtimes
    stamp = FileStamp.of(copy / TRAIN)
    assert stamp.mtime_ns == FileStamp.of(out / TRAIN).mtime_ns and stamp.inode != FileStamp.of(out / TRAIN).inode
    assert digests._recalled(stamp) is None
    os.replace(out / "validation_4096.idx.parquet", out / TRAIN)
    rules = [v.rule for v in _pack_rule(cfg)]
    assert any("named for another split than the 'validation' rows it holds" in r for r in rules), rules


@pytest.mark.slow
def test_a_truncated_file_is_refused_without_reading_it(
    packed: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    out, cfg = packed
    with open(out / TRAIN, "r+b") as f:
        f.truncate(f.seek(0, os.SEEK_END) - 1)
    reads = _file_reads(monkeypatch)
    violations = _pack_rule(cfg)
    assert violations and reads == []


def test_a_file_written_within_the_racy_window_is_not_remembered(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 100)
    stamp = FileStamp.of(path)
    assert stamp.racy()
    assert remember(path, "0" * 64, stamp) is False
    assert digests._recalled(stamp) is None


def test_a_remembered_digest_is_recalled_only_for_the_same_stamp_and_tail(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 1024)  # 256 KiB: the tail is the last 64 KiB
    stamp = date_back(path)
    assert not stamp.racy()
    digest = verified_sha256(path)
    assert digests._recalled(FileStamp.of(path)) == digest
    # a flip inside the tail with the mtime put back is still seen, and evicts the record
    with open(path, "r+b") as f:
        f.seek(-10, os.SEEK_END)
        f.write(b"\xff")
    os.utime(path, ns=(stamp.mtime_ns, stamp.mtime_ns))
    assert digests._recalled(FileStamp.of(path)) is None
    assert not digests._record_path(FileStamp.of(path)).exists()
    assert launch_sha256(path) != digest  # and the fallback reads the file


def test_only_bytes_that_match_their_seal_are_remembered(tmp_path: Path) -> None:
    """verified_sha256 with an expected digest records a match and evicts on a mismatch: a corrupted read never
    leaves a record that would refuse the good bytes put back under the same stamp."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"good" * 1000)
    stamp = date_back(path)
    good = verified_sha256(path)
    assert digests._recalled(stamp) == good
    path.write_bytes(b"evil" * 1000)
    os.utime(path, ns=(stamp.mtime_ns, stamp.mtime_ns))  # same size, same mtime: the same stamp
    assert FileStamp.of(path) == stamp
    assert verified_sha256(path, expected=good) != good
    assert digests._recalled(stamp) is None  # evicted, not recorded as the corrupted digest
    path.write_bytes(b"good" * 1000)
    os.utime(path, ns=(stamp.mtime_ns, stamp.mtime_ns))
    assert launch_sha256(path, expected=good) == good  # read again (no record), matches, recorded
    assert digests._recalled(stamp) == good
    digests.forget(path)
    assert digests._recalled(stamp) is None


def test_an_unwritable_or_corrupted_cache_only_costs_the_full_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    date_back(path)
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    monkeypatch.setenv(digests.CACHE_ENV, str(blocked))
    assert launch_sha256(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    monkeypatch.setenv(digests.CACHE_ENV, str(tmp_path / "cache"))
    verified_sha256(path)
    record = digests._record_path(FileStamp.of(path))
    record.write_text("{not json")
    assert launch_sha256(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


@pytest.mark.slow
def test_inspect_reads_in_full_whatever_is_remembered(
    packed: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flip deep inside the file with its mtime put back is beyond a launch's O(metadata) look; ``inspect`` (and
    ``verify``) read every byte and refuse it."""
    out, _ = packed
    target = out / TRAIN
    before = FileStamp.of(target)
    data = bytearray(target.read_bytes())
    data[100] ^= 0x01
    target.write_bytes(bytes(data))
    os.utime(target, ns=(before.mtime_ns, before.mtime_ns))
    reads = _file_reads(monkeypatch)
    assert not inspect_artifact(out).ok
    assert TRAIN in reads


def test_pack_dates_its_new_files_back_past_the_racy_window_in_whole_seconds(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    stamp = date_back(path)
    assert time.time() - stamp.mtime_ns / 1e9 >= digests.RACY_SECONDS
    assert stamp.mtime_ns % 1_000_000_000 == 0  # whole seconds: also trusted on 1-second file systems
