"""#35: no corrupted byte is trained on. A single bit flipped anywhere in a pack's files, with size and modification
time kept, stops the launch before its first optimizer step (``validate()`` for the metadata and footers, the
content check joined at the first ``train_step`` for the rest), and Megatron-Bridge's own packed dataset, with the
plugin installed, never hands a row parsed from bytes that differ from their seal. The poisoned-cache sequence and
a same-size input edit with its mtime put back are refused."""

from __future__ import annotations

import copy
import dis
import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

import mbridge_seqpack
from mbridge_seqpack import digests
from mbridge_seqpack.artifact import launch_guard
from mbridge_seqpack.artifact.content_check import ContentCheckError
from mbridge_seqpack.artifact.inspect_artifact import inspect_artifact
from mbridge_seqpack.artifact.pack_files import content_plan
from mbridge_seqpack.artifact.row_group_seal import CorruptedPackError, Tiles
from mbridge_seqpack.digests import FileStamp
from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir
from mbridge_seqpack.report import check

pytestmark = pytest.mark.slow

DATA = embedded_data_dir()
TOKENIZER = embedded_tokenizer_dir()
PACK = 256
FILES = (f"training_{PACK}.idx.parquet", f"validation_{PACK}.idx.parquet", f"{PACK}_metadata.jsonl")


def _subset(path: Path, source: Path, n: int) -> Path:
    path.write_text("".join(line + "\n" for line in source.read_text().splitlines()[:n]))
    return path


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory, megatron_bridge: Any) -> Path:
    """The embedded training corpus and 100 validation records at 256 tokens: two row groups of training rows."""
    base = tmp_path_factory.mktemp("integrity")
    out = base / "pack"
    pack_jsonl(
        {
            "training": DATA / "training.jsonl",
            "validation": _subset(base / "validation.jsonl", DATA / "validation.jsonl", 100),
        },
        tokenizer=TOKENIZER,
        output_dir=out,
        options=PackOptions(pack_size=PACK),
    )
    entry = json.loads((out / FILES[2]).read_text())[0]
    assert Tiles.of_checksums(entry["checksums"]).row_groups >= 2
    return out


def _point(cfg: Any, directory: Path) -> Any:
    specs = cfg.dataset.offline_packing_specs
    specs.packed_sequence_size = PACK
    specs.max_single_sequence_length = PACK
    specs.packed_train_data_path = str(directory / FILES[0])
    specs.packed_val_data_path = str(directory / FILES[1])
    specs.packed_metadata_path = str(directory / FILES[2])
    cfg.tokenizer.tokenizer_model = str(TOKENIZER)
    return cfg


def _launch(cfg: Any) -> str | None:
    """Where the launch stops: at validate() (the rules), at the first train_step (the content check rank 0 ran
    while the model was built), or nowhere."""
    if [v for v in check(cfg, world_size=8) if v.severity == "error"]:
        return "validate"
    launch_guard.arm(content_plan(cfg))
    try:
        launch_guard.gate()
    except ContentCheckError:
        return "first step"
    return None


def _first_rows(directory: Path) -> dict[str, list[int]]:
    """The first row of every row group of each split: reading it makes the dataset read the whole group."""
    out = {}
    for entry in json.loads((directory / FILES[2]).read_text()):
        tiles = Tiles.of_checksums(entry["checksums"])
        starts = [sum(tiles.rows[:g]) for g in range(tiles.row_groups)]
        out[f"{entry['split']}_{PACK}.idx.parquet"] = starts
    return out


def _megatron_bridge_reads(directory: Path, tokenizer: Any, rows: dict[str, list[int]]) -> str | None:
    """Megatron-Bridge's build_gpt_sft_split on each split (its GPTSFTPackedParquetDataset) reading a row of every
    row group; the first error, or None when every read succeeded."""
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split

    for name, firsts in rows.items():
        try:
            dataset = build_gpt_sft_split(
                directory / name,
                tokenizer=tokenizer,
                seq_length=PACK,
                memmap_workers=1,
                seed=1,
                packed_sequence_size=PACK,
                pad_seq_to_mult=1,
                dataset_kwargs={},
            )
            for row in firsts:
                dataset[row]
        except Exception as exc:  # noqa: BLE001  (the run stops on any of them; which one is recorded)
            return f"{type(exc).__name__}: {exc}"
    return None


def test_300_random_bit_flips_stop_the_launch_and_megatron_bridges_reads(
    pack: Path, packed_cfg: Any, tmp_path: Path
) -> None:
    """Each flip (size and mtime kept) is refused by the launch before the first optimizer step and by
    Megatron-Bridge's packed dataset when it reads the rows; without the plugin most read back as other values."""
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    work = tmp_path / "copy"
    shutil.copytree(pack, work)
    cfg = _point(packed_cfg, work)
    tokenizer = load_megatron_tokenizer(TOKENIZER)
    rows = _first_rows(work)
    rng = random.Random(35)
    missed, where, silent_without_plugin = [], {"validate": 0, "first step": 0}, 0
    with mbridge_seqpack.install():
        assert _launch(cfg) is None and _megatron_bridge_reads(work, tokenizer, rows) is None
        for trial in range(300):
            path = work / FILES[trial % 3]
            stamp = FileStamp.of(path)
            good = path.read_bytes()
            data = bytearray(good)
            offset, bit = rng.randrange(len(data)), 1 << rng.randrange(8)
            data[offset] ^= bit
            path.write_bytes(bytes(data))
            os.utime(path, ns=(stamp.mtime_ns, stamp.mtime_ns))
            assert FileStamp.of(path) == stamp  # the same stamp: nothing but the bytes changed
            try:
                stopped = _launch(cfg)
                refused = _megatron_bridge_reads(work, tokenizer, rows)
                if trial < 60 and path.suffix == ".parquet":
                    with mbridge_seqpack.install(mode="off"):  # Megatron-Bridge alone
                        silent_without_plugin += _megatron_bridge_reads(work, tokenizer, rows) is None
            finally:
                path.write_bytes(good)
            if stopped is None or refused is None:
                missed.append((path.name, offset, bit, stopped, refused))
            else:
                where[stopped] += 1
    assert missed == []
    assert where["validate"] > 0 and where["first step"] > 0, where
    assert silent_without_plugin > 20  # of 40 Parquet flips: Megatron-Bridge alone reads most without an error


def test_megatron_bridges_dataset_reads_only_verified_bytes(pack: Path, tmp_path: Path, megatron_bridge: Any) -> None:
    """A flipped bit inside a row group: Megatron-Bridge's dataset raises naming the row group before any of its
    rows reach a batch (the other group reads fine); warn mode warns and reads it as Megatron-Bridge would."""
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    work = tmp_path / "copy"
    shutil.copytree(pack, work)
    rows = _first_rows(work)
    train = work / FILES[0]
    entry = json.loads((work / FILES[2]).read_text())[0]
    tiles = Tiles.of_checksums(entry["checksums"])
    start, end = tiles.span(1)
    data = bytearray(train.read_bytes())
    data[(start + end) // 2] ^= 0x04
    train.write_bytes(bytes(data))
    tokenizer = load_megatron_tokenizer(TOKENIZER)
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split

    def dataset() -> Any:
        return build_gpt_sft_split(
            train, tokenizer=tokenizer, seq_length=PACK, memmap_workers=1, seed=1, packed_sequence_size=PACK,
            pad_seq_to_mult=1, dataset_kwargs={},
        )  # fmt: skip

    first_group, second_group = rows[FILES[0]][0], rows[FILES[0]][1]
    with mbridge_seqpack.install():
        ds = dataset()
        assert ds[first_group]["input_ids"]  # group 0 is intact
        with pytest.raises(CorruptedPackError) as info:
            ds[second_group]
        assert str(info.value).startswith(f"{train}: row group 1 (rows {second_group}..")
        assert "differs from its seal" in str(info.value)
    with mbridge_seqpack.install(mode="warn"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dataset()[second_group]["input_ids"]
    assert any("row group 1" in str(w.message) for w in caught)


def test_the_gate_is_where_megatron_bridges_training_loop_calls_train_step(
    pack: Path, packed_cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the hook inside Megatron-Bridge's own runtime_config_update() (what pretrain()/finetune() run
    first): validate() passes in O(metadata) and arms the check; the train_step train() calls (looked up in its
    module at each call) raises before the original runs; a good pack passes to the original."""
    import megatron.bridge.training.train as train_module
    from megatron.bridge.training.config import runtime_config_update

    loads = [i.argval for i in dis.get_instructions(train_module.train) if i.opname == "LOAD_GLOBAL"]
    assert "train_step" in loads  # train() binds train_step when it runs: the wrapper installed at validate() is it
    monkeypatch.setenv("WORLD_SIZE", "8")
    work = tmp_path / "copy"
    shutil.copytree(pack, work)
    cfg = _point(packed_cfg, work)
    with mbridge_seqpack.install():
        runtime_config_update(copy.deepcopy(cfg))
        assert launch_guard.is_armed()
        with pytest.raises(AttributeError):  # the gate passed: the original train_step ran on these dummy args
            train_module.train_step(*[None] * 9)
        train = work / FILES[0]
        stamp = FileStamp.of(train)
        data = bytearray(train.read_bytes())
        data[1000] ^= 0x01
        train.write_bytes(bytes(data))
        os.utime(train, ns=(stamp.mtime_ns, stamp.mtime_ns))
        runtime_config_update(copy.deepcopy(cfg))
        with pytest.raises(ContentCheckError) as info:
            train_module.train_step(*[None] * 9)
    assert str(info.value).startswith(
        f"mbridge_seqpack: stopped before the first optimizer step: {train}: row group 0 (rows 0.."
    )
    assert str(info.value).endswith("Nothing was trained on these bytes")
    assert not getattr(train_module.train_step, "__mbridge_seqpack_launch_guard__", False)  # the original is back


def _recipe_pack(root: Path) -> tuple[Path, Any]:
    """``pack --recipe small_gpt_smoke_4k dataset.dataset_root=ROOT`` (where Megatron-Bridge's builder looks) and
    the config a launch of that recipe builds."""
    from mbridge_seqpack.artifact.builder_location import builder_location
    from mbridge_seqpack.cli.main import main
    from mbridge_seqpack.recipes.targets import build_launch

    assert main(["pack", "--recipe", "small_gpt_smoke_4k", f"dataset.dataset_root={root}", "--json"]) == 0
    # a training-only pack: the launch must not prepare a validation split into its sealed folder
    cfg = build_launch("small_gpt_smoke_4k", [f"dataset.dataset_root={root}", "dataset.do_validation=false"]).cfg
    return builder_location(cfg).directory, cfg


def _check_cli(root: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    from mbridge_seqpack.cli.main import main

    capsys.readouterr()
    # the 80-record subset packs into 2 rows: the run repeats them (else offline.train_split_rows, one global batch)
    overrides = [f"dataset.dataset_root={root}", "dataset.max_train_samples=800", "dataset.do_validation=false"]
    code = main(["check", "small_gpt_smoke_4k", *overrides, "--rules-only"])
    return code, capsys.readouterr().out


def test_a_poisoned_cache_cannot_refuse_a_good_pack(
    tmp_path: Path, capsys: pytest.CaptureFixture, megatron_bridge: Any
) -> None:
    """inspect reads a corrupted file (same size and mtime) and refuses it, without recording its digest; the good
    bytes put back under the same stamp then pass check and the launch's content check."""
    root = tmp_path / "root"
    root.mkdir()
    _subset(root / "training.jsonl", DATA / "training.jsonl", 80)
    directory, cfg = _recipe_pack(root)
    train = directory / "training_4096.idx.parquet"
    stamp, good = FileStamp.of(train), train.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0x20
    train.write_bytes(bytes(data))
    os.utime(train, ns=(stamp.mtime_ns, stamp.mtime_ns))
    assert not inspect_artifact(directory).ok
    assert digests._recalled(stamp) is None  # nothing recorded from bytes that failed their seal
    assert content_plan(cfg).run()  # the launch refuses the corrupted bytes too
    train.write_bytes(good)
    os.utime(train, ns=(stamp.mtime_ns, stamp.mtime_ns))
    assert FileStamp.of(train) == stamp
    code, out = _check_cli(root, capsys)
    assert code == 0 and "result: OK" in out
    assert content_plan(cfg).run() == []
    assert inspect_artifact(directory).ok
    assert digests._recalled(stamp) is not None  # inspect's full read matched the seal: recorded


def test_a_same_size_input_edit_with_its_mtime_put_back_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture, megatron_bridge: Any
) -> None:
    """check says what it read and what it deferred, in one line; the launch reads the JSONL the default-location
    pack was made from and stops before the first optimizer step; a size change is refused at validate()."""
    root = tmp_path / "root"
    root.mkdir()
    source = _subset(root / "training.jsonl", DATA / "training.jsonl", 80)
    directory, cfg = _recipe_pack(root)
    stamp, text = FileStamp.of(source), source.read_bytes()
    edited = bytearray(text)
    at = text.index(b'"input": "') + len(b'"input": "')
    edited[at] = ord("X") if edited[at] != ord("X") else ord("Y")  # same size, near the start
    source.write_bytes(bytes(edited))
    os.utime(source, ns=(stamp.mtime_ns, stamp.mtime_ns))
    assert FileStamp.of(source) == stamp
    code, out = _check_cli(root, capsys)
    assert code == 0
    line = " ".join(out.split("pack contents: ", 1)[1].split("\nnote: attention:")[0].split())
    assert line == (
        "checked now: metadata, sizes and Parquet footers of 1 pack file(s); deferred: "
        f"{directory.joinpath('training_4096.idx.parquet').stat().st_size / 1024:.1f} kB of pack bytes, "
        "training.jsonl, the tokenizer files, hashed on rank 0 while the model is built (the run stops before "
        "its first optimizer step if any byte differs), and each row group again as Megatron-Bridge reads it"
    )
    with mbridge_seqpack.install():
        launch_guard.arm(content_plan(cfg))
        with pytest.raises(ContentCheckError) as info:
            launch_guard.gate()
    assert f"the pack was made from another training file than {source} (sha256 differs" in str(info.value)
    assert digests._recalled(stamp) is None  # the record pack made is evicted by the failed verification
    source.write_bytes(bytes(edited) + b"\n")  # another size: refused at validate() already
    (violation,) = [v for v in check(cfg, world_size=1) if v.rule_id == "artifact.fingerprint_mismatch"]
    assert f"{len(text) + 1} bytes, the pack was made from {len(text)}" in violation.rule


def _gate_rank(rank: int, init: str, corrupted: str, results: Any, source: str | None = None) -> None:
    """One rank of a two-process gloo job: rank 0 arms a content check of a corrupted file (a pack file, or with
    ``source`` a JSONL the pack was made from, whose recorded digest no longer matches)."""
    import torch.distributed as dist

    from mbridge_seqpack.artifact.content_check import ContentPlan, PackFile, SourceFile

    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    launch_guard.set_mode(lambda: "error")
    if source is not None:
        plan = ContentPlan(sources=[SourceFile(Path(source), "0" * 64, "training")])
    else:
        seal = __import__("mbridge_seqpack.artifact.verified_parquet", fromlist=["find_seal"]).find_seal(
            Path(corrupted)
        )
        plan = ContentPlan(packs=[PackFile(Path(corrupted), seal.file_bytes, seal.file_sha256, seal.tiles)])
    launch_guard.arm(plan)
    try:
        launch_guard.gate()
        results.put((rank, "passed"))
    except ContentCheckError as exc:
        results.put((rank, str(exc)))
    finally:
        dist.destroy_process_group()


def _two_ranks(tmp_path: Path, corrupted: Path, source: Path | None = None) -> dict[int, str]:
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    args = (init, str(corrupted), results, None if source is None else str(source))
    procs = [context.Process(target=_gate_rank, args=(r, *args)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    return dict(results.get(timeout=5) for _ in procs)


def test_every_rank_stops_when_rank_0_finds_a_bad_byte(pack: Path, tmp_path: Path) -> None:
    """Two ranks over gloo: rank 0's verdict reaches rank 1 through the gate's all_reduce, so no rank goes on
    into a collective that rank 0 will never join."""
    work = tmp_path / "copy"
    shutil.copytree(pack, work)
    train = work / FILES[0]
    data = bytearray(train.read_bytes())
    data[500] ^= 0x01
    train.write_bytes(bytes(data))
    got = _two_ranks(tmp_path, train)
    assert got[0].startswith(f"mbridge_seqpack: stopped before the first optimizer step: {train}: row group 0")
    assert got[1] == (
        "mbridge_seqpack: stopped before the first optimizer step: rank 0's content check found pack bytes that "
        "differ from their seal (rank 0's error names the file). Nothing was trained on these bytes"
    )


def test_the_other_ranks_name_what_rank_0_found(tmp_path: Path) -> None:
    """Rank 0's content check says what kind of file failed (the code the gate's all_reduce carries): a JSONL that
    changed since packing is not blamed on the pack on the ranks that did not read it."""
    from mbridge_seqpack.artifact.content_check import BackgroundCheck, ContentPlan, SourceFile

    source = tmp_path / "training.jsonl"
    source.write_text('{"input": "a", "output": "b"}\n')
    check = BackgroundCheck(ContentPlan(sources=[SourceFile(source, "0" * 64, "training")]))
    assert check.wait(60) and str(source) in check.verdict()[0]
    assert launch_guard.other_rank_text(check.found_in()) == (
        "rank 0's content check found a JSONL file that changed since the pack was made from it (rank 0's error "
        "names the file)"
    )
    assert BackgroundCheck(ContentPlan()).found_in() == 0


def test_install_wraps_the_packed_reader_and_uninstall_restores_it_exactly(megatron_bridge: Any) -> None:
    from megatron.bridge.data.packing.parquet import GPTSFTPackedParquetDataset

    original = GPTSFTPackedParquetDataset.__dict__["_ensure_reader"]
    with mbridge_seqpack.install():
        assert GPTSFTPackedParquetDataset.__dict__["_ensure_reader"] is not original
        mbridge_seqpack.install(mode="warn")  # installing again wraps nothing twice
        assert GPTSFTPackedParquetDataset.__dict__["_ensure_reader"].__wrapped__ is original
    assert GPTSFTPackedParquetDataset.__dict__["_ensure_reader"] is original
