"""Packed artifacts: the same sequences as Megatron-Bridge's own prep, read by its own dataset, sealed,
resolved as it resolves paths, and refusing every corruption, truncation, interruption and mix-up."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mbridge_seqpack import check
from mbridge_seqpack.artifact.inspect_artifact import inspect_artifact
from mbridge_seqpack.artifact.pack_files import content_plan
from mbridge_seqpack.artifact.store import ENTRY_SEAL, ArtifactError, entry_digest
from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
from mbridge_seqpack.tokenization.sequences import InputError
from tests.support.packs import (
    DATA,
    TOKENIZER,
    assert_the_hook_refuses,
    chat_corpus,
    chat_tokenizer,
    pack_rule,
    packed_sequences,
    run_pack,
    small_jsonl,
)
from tests.support.stderr_text import unwrap

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory, megatron_bridge: Any) -> Path:
    out = tmp_path_factory.mktemp("packed") / "a"
    run_pack(
        {"training": DATA / "training.jsonl", "validation": DATA / "validation.jsonl"}, out, pad_seq_to_mult=4, seed=7
    )
    return out


def _megatron_bridge_prep(
    src: Path, tokenizer: Path, tmp: Path, pack_size: int, mult: int, kwargs: dict[str, Any]
) -> Path:
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.bridge.data.packing.offline import prepare_gpt_sft_packed_data

    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    out = tmp / "mb.idx.parquet"
    prepare_gpt_sft_packed_data(
        input_path=src,
        output_path=out,
        output_metadata_path=tmp / "mb_metadata.jsonl",
        packed_sequence_size=pack_size,
        tokenizer=load_megatron_tokenizer(tokenizer),
        max_seq_length=pack_size,
        seed=0,
        dataset_kwargs={**kwargs, "index_mapping_dir": str(tmp / "index")},
        pad_seq_to_mult=mult,
        num_tokenizer_workers=1,
        dataset_builder=build_gpt_sft_split,
    )
    return out


@pytest.mark.parametrize(("mult", "lines_per_chunk"), [(1, 50_000), (4, 500)])  # 500: four streamed chunks
def test_byte_identical_to_megatron_bridge_prep_prompt_answer(
    tmp_path: Path, megatron_bridge: Any, mult: int, lines_per_chunk: int
) -> None:
    ours = run_pack(
        {"training": DATA / "training.jsonl"}, tmp_path / "ours", pad_seq_to_mult=mult, lines_per_chunk=lines_per_chunk
    )
    theirs = _megatron_bridge_prep(DATA / "training.jsonl", TOKENIZER, tmp_path, 4096, mult, {})
    mine = packed_sequences(ours.directory / "training_4096.idx.parquet")
    assert sum(mine.values()) == 1799
    assert mine == packed_sequences(theirs)
    (tokens, mask), _ = next(iter(mine.items()))
    assert 0 < sum(mask) < len(mask)  # loss on the answer only


def test_byte_identical_to_megatron_bridge_prep_chat(tmp_path: Path, megatron_bridge: Any) -> None:
    tok = chat_tokenizer(tmp_path)
    chat = chat_corpus(tmp_path / "chat.jsonl", 300)
    kwargs = {"chat": True, "use_hf_tokenizer_chat_template": True}
    ours = run_pack(
        {"training": chat}, tmp_path / "ours", pack_size=2048, pad_seq_to_mult=4, dataset_kwargs=kwargs, tokenizer=tok
    )
    mine = packed_sequences(ours.directory / "training_2048.idx.parquet")
    assert sum(mine.values()) == 300
    assert mine == packed_sequences(_megatron_bridge_prep(chat, tok, tmp_path, 2048, 4, kwargs))
    assert inspect_artifact(ours.directory).ok


def _steps_as_megatron_bridge_reads_them(path: Path, balance: dict, epoch: int) -> float:
    """Modeled straggler ratio of a written split as Megatron-Bridge's own batch sampler hands its rows to the DP
    ranks (every rank's sampler, one epoch), with the cost model the pack recorded."""
    import pyarrow.parquet as pq
    from megatron.bridge.data.samplers import MegatronPretrainingBatchSampler

    rows = pq.read_table(str(path), columns=["input_ids", "seq_start_id"]).to_pylist()
    costs = []
    for row in rows:
        seqs = np.diff(row["seq_start_id"] + [len(row["input_ids"])]) - 1  # runtime lengths (labels shift by one)
        costs.append(balance["cost_linear"] * seqs.sum() + balance["cost_attention"] * (seqs**2).sum())
    dp, global_batch = balance["data_parallel"], balance["data_parallel"] * balance["micro_batches"]
    steps = len(rows) // global_batch
    loads = np.zeros((steps, dp))
    for rank in range(dp):
        sampler = MegatronPretrainingBatchSampler(
            total_samples=len(rows),
            consumed_samples=epoch * steps * global_batch,
            micro_batch_size=1,
            global_batch_size=global_batch,
            data_parallel_rank=rank,
            data_parallel_size=dp,
            seed=balance["sampler_seed"],
        )
        for step, indices in enumerate(sampler):
            loads[step, rank] = sum(costs[i] for i in indices)
    return float(np.mean(loads.max(axis=1) / loads.mean(axis=1)))


def test_megatron_bridges_batch_sampler_reads_the_balanced_steps(artifact: Path) -> None:
    # the pack is laid out for the batch sampler (Megatron-Bridge's SFT default) with seed 1234: its first epoch
    # reads exactly the balanced steps the metadata reports; later epochs reshuffle (reported separately)
    balance = json.loads((artifact / "4096_metadata.jsonl").read_text())[0]["balance"]
    assert (balance["sampler"], balance["sampler_seed"]) == ("batch", 1234)
    path = artifact / "training_4096.idx.parquet"
    assert _steps_as_megatron_bridge_reads_them(path, balance, 0) == pytest.approx(
        balance["straggler_ratio"], abs=1e-6
    )
    later = [_steps_as_megatron_bridge_reads_them(path, balance, epoch) for epoch in range(1, 5)]
    assert float(np.mean(later)) == pytest.approx(balance["straggler_ratio_later_epochs"], abs=1e-6)
    assert balance["straggler_ratio"] < min(later)


def test_a_config_that_reads_the_pack_otherwise_than_laid_out_gets_an_advisory(
    artifact: Path, packed_cfg: Any
) -> None:
    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    specs.packed_train_data_path = str(artifact / "training_4096.idx.parquet")
    packed_cfg.train.global_batch_size = 8  # DP 8 x 1 row, the batch sampler, seed 1234: as packed
    packed_cfg.dataset.seed = 1234
    assert packed_cfg.dataset.dataloader_type == "batch"
    assert check(packed_cfg, world_size=8) == []
    packed_cfg.dataset.seed = 5678  # only the seed differs: pasting the packed one back is the fix
    (v,) = check(packed_cfg, world_size=8)
    ratio = json.loads((artifact / "4096_metadata.jsonl").read_text())[0]["balance"]["straggler_ratio"]
    assert (v.rule_id, v.severity) == ("artifact.balance_layout", "advisory")
    assert v.fields == {"pack sampler_seed": 1234, "dataset.seed": 5678}
    assert v.rule == (
        f"the pack's rows are laid out so that each step keeps every DP rank equally busy (modeled straggler "
        f"ratio {ratio:.4f}) for the sampler, seed, DP size and global batch it was packed for; read otherwise, "
        f"training is correct but that balance does not hold"
    )
    assert v.overrides == ["dataset.seed=1234"]
    packed_cfg.train.global_batch_size = 16  # 2 rows per rank per step: only a re-pack lays the rows out for it
    (v,) = check(packed_cfg, world_size=8)
    assert v.fields == {"pack sampler_seed": 1234, "pack micro_batches": 1, "dataset.seed": 5678, "micro_batches": 2}
    assert v.fix == (
        "re-run `mbridge-seqpack pack --recipe ...` with this config (or pass --data-parallel 8 --micro-batches 2 "
        "--sampler batch --sampler-seed 5678)"
    )
    assert v.overrides == []


def test_a_pack_from_before_the_sampler_was_recorded_counts_as_laid_out_in_file_order(
    artifact: Path, packed_cfg: Any, tmp_path: Path
) -> None:
    old = tmp_path / "old"
    shutil.copytree(artifact, old)
    meta = old / "4096_metadata.jsonl"
    entries = json.loads(meta.read_text())
    for key in ("sampler", "sampler_seed", "read_order_sha256", "straggler_ratio_later_epochs"):
        del entries[0]["balance"][key]
    entries[0][ENTRY_SEAL] = entry_digest(entries[0])  # as that (sealed) pack wrote it
    meta.write_text(json.dumps(entries))
    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    specs.packed_train_data_path = str(old / "training_4096.idx.parquet")
    packed_cfg.train.global_batch_size = 8
    (v,) = check(packed_cfg, world_size=8)  # Megatron-Bridge's default batch sampler, not the file order
    assert v.rule_id == "artifact.balance_layout"
    assert v.fields == {"pack sampler": "single", "dataset.dataloader_type": "batch"}
    assert v.overrides == ["dataset.dataloader_type=single"]
    packed_cfg.dataset.dataloader_type = "single"
    assert check(packed_cfg, world_size=8) == []  # file order, whatever the seed


def test_a_torch_that_permutes_otherwise_than_the_packing_ones_gets_an_advisory(
    artifact: Path, packed_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mbridge_seqpack.placement import sampler  # the owner of the read order (placement/sampler.py)

    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    specs.packed_train_data_path = str(artifact / "training_4096.idx.parquet")
    packed_cfg.train.global_batch_size, packed_cfg.dataset.seed = 8, 1234  # as packed
    (entry,) = [e for e in json.loads((artifact / "4096_metadata.jsonl").read_text()) if "balance" in e]
    recorded = entry["balance"]["read_order_sha256"]
    assert recorded == sampler.read_order_digest(entry["num_rows"], "batch", 1234)  # this torch: the same
    assert check(packed_cfg, world_size=8) == []
    real = sampler.read_order
    monkeypatch.setattr(sampler, "read_order", lambda *args: real(*args)[::-1].copy())  # another torch
    (v,) = check(packed_cfg, world_size=8)
    here = sampler.read_order_digest(entry["num_rows"], "batch", 1234)
    assert (v.rule_id, v.severity) == ("artifact.balance_layout", "advisory")
    assert v.fields == {"pack read order sha256": recorded[:16], "read order sha256 here": here[:16]}
    assert v.rule == (
        f"torch here permutes the {entry['num_rows']} rows (seed 1234) otherwise than where the pack was made, so "
        f"the batch sampler will not read the balanced steps; training is correct but that balance does not hold"
    )
    assert v.fix == "re-run `mbridge-seqpack pack` in this environment (same sampler, seed, DP size and global batch)"


def test_metadata_has_what_megatron_bridge_reads_and_the_seal(artifact: Path) -> None:
    entries = json.loads((artifact / "4096_metadata.jsonl").read_text())
    balance = entries[0]["balance"]  # the training rows are work-balanced (placement/balance.py), for DP 8
    assert (balance["data_parallel"], balance["micro_batches"], balance["rows_rebalanced"]) == (8, 1, True)
    assert balance["row_cost_cv"] < balance["row_cost_cv_before"] and "balance" not in entries[1]
    assert 1.0 <= balance["straggler_ratio"] < 1.01  # 40 rows: five steps of 8 ranks x 1 row
    assert [e["split"] for e in entries] == ["training", "validation"]
    for e in entries:
        assert {"max_samples_per_bin", "dataset_max_seqlen", "min_packed_seqlen", "pack_size"} <= set(e)
        fp = e["fingerprint"]
        assert (
            fp["pack_size"],
            fp["pad_seq_to_mult"],
            fp["algorithm"],
            fp["seed"],
            fp["eos_id"],
            fp["vocab_size"],
            fp["dataset_kwargs"],
            fp["megatron_bridge_version"],
        ) == (4096, 4, "best_fit_decreasing+balanced", 7, 0, 8192, "{}", "0.6.2")
        assert len(fp["input_sha256"]) == 64 and len(fp["tokenizer_sha256"]) == 64
        sums = e["checksums"]
        assert set(sums["columns"]) == {"input_ids", "loss_mask", "seq_start_id", "sequence_index"}
        assert sums["file_bytes"] == (artifact / f"{e['split']}_4096.idx.parquet").stat().st_size
    assert entries[0]["stats"]["num_sequences"] == 1799


def test_inspect_and_verify_pass_on_a_good_pack(artifact: Path, tmp_path: Path) -> None:
    from mbridge_seqpack.cli.histogram import draw_histogram
    from mbridge_seqpack.thd.verify import verify_artifact

    report = inspect_artifact(artifact)
    draw_histogram(report, tmp_path / "hist.png")
    assert report.ok, report.to_text()
    assert [(s.name, s.sequences, s.sealed) for s in report.splits] == [
        ("training", 1799, True),
        ("validation", 435, True),
    ]
    assert (tmp_path / "hist.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for split in report.splits:  # what the plot draws: every sequence's trained length and every row's fill
        assert len(split.sequence_lengths) == split.sequences and len(split.row_fill) == split.rows
        assert int(split.sequence_lengths.sum()) == int(split.row_fill.sum()) == split.tokens
        assert 0 < int(split.row_fill.min()) and int(split.row_fill.max()) <= split.pack_size
    assert report.to_text().endswith("inspect: OK")
    checked = verify_artifact(artifact, max_rows=3)
    assert checked.ok, checked.to_text()
    assert checked.passed == {
        "static cu_seqlens": 6,
        "attention parity": 6,
        "loss parity": 6,
        "CP2 partition round trip": 6,
    }


def test_round_trip_through_megatron_bridge_packed_dataset(artifact: Path, megatron_bridge: Any) -> None:
    """Every row comes back from GPTSFTPackedParquetDataset's collate with static cu_seqlens, and every input
    record appears exactly once."""
    import pyarrow.parquet as pq
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split

    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    path = artifact / "training_4096.idx.parquet"
    dataset = build_gpt_sft_split(
        path,
        tokenizer=load_megatron_tokenizer(TOKENIZER),
        seq_length=4096,
        memmap_workers=1,
        seed=1234,
        packed_sequence_size=4096,
        pack_metadata_path=artifact / "4096_metadata.jsonl",
        pad_cu_seqlens=True,
        pad_seq_to_mult=4,
        dataset_kwargs={"pad_to_max_length": True},
    )
    assert type(dataset).__name__ == "GPTSFTPackedParquetDataset"
    from mbridge_seqpack.thd import StaticTHDLayout, static_thd_batch

    layout = StaticTHDLayout.from_pack_metadata(artifact / "4096_metadata.jsonl", 4096)
    table = pq.read_table(str(path)).to_pylist()
    capacity = None
    for number, row in enumerate(table):
        batch = dataset.collate_fn([dataset[number]])
        again = static_thd_batch(batch, layout)  # Megatron-Bridge's pad_cu_seqlens already made it static
        for key in ("cu_seqlens_q", "cu_seqlens_q_padded", "cu_seqlens_kv", "cu_seqlens_kv_padded", "tokens"):
            assert torch.equal(again[key], batch[key]), key
        cu_padded = batch["cu_seqlens_q_padded"][0].tolist()
        assert batch["tokens"].shape == (1, 4096)
        capacity = capacity or len(cu_padded)
        assert len(cu_padded) == capacity
        bounds = row["seq_start_id"] + [len(row["input_ids"])]
        assert cu_padded[: len(bounds)] == [b - i for i, b in enumerate(bounds)]  # each segment loses its last token
    assert sorted(i for row in table for i in row["sequence_index"]) == list(range(1799))


def _flip(path: Path, offset: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))
    return bytes(data)


def test_every_byte_flip_and_truncation_is_detected(tmp_path: Path, megatron_bridge: Any) -> None:
    from mbridge_seqpack.thd.verify import verify_artifact

    out = run_pack({"training": small_jsonl(tmp_path / "t.jsonl", 120)}, tmp_path / "p", pack_size=1024).directory
    path = out / "training_1024.idx.parquet"
    good = path.read_bytes()
    rng = random.Random(0)
    for offset in sorted(rng.sample(range(len(good)), 60)) + [0, len(good) - 1]:
        path.write_bytes(good)
        _flip(path, offset)
        report = inspect_artifact(out)
        assert not report.ok, offset
        assert report.all_problems[0].endswith("re-run mbridge-seqpack pack"), report.all_problems
        assert not verify_artifact(out, max_rows=1).ok
    for cut in (1, 100, len(good) // 2, len(good) - 8):
        path.write_bytes(good[:cut])
        problems = inspect_artifact(out).all_problems
        assert len(problems) == 1 and problems[0].endswith("re-run mbridge-seqpack pack"), problems
    path.write_bytes(good)
    assert inspect_artifact(out).ok


def test_value_checks_on_an_unsealed_pack(tmp_path: Path) -> None:
    """A pack written by another tool: structure and values still checked, reported as unsealed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "training_64.idx.parquet"
    pq.write_table(
        pa.table({"input_ids": [[5, 6, 0, 7, 0]], "loss_mask": [[0, 0, 0, 0, 0]], "seq_start_id": [[0, 3]]}), str(path)
    )
    report = inspect_artifact(tmp_path)
    (split,) = report.splits
    assert not split.sealed and split.notes[0].startswith("unsealed: no mbridge_seqpack fingerprint")
    assert split.problems == ["no sequence has any loss token: the loss mask is empty"]


def test_interrupted_pack_leaves_nothing_that_looks_like_a_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, megatron_bridge: Any
) -> None:
    import mbridge_seqpack.pipeline.pack as pipeline
    import mbridge_seqpack.tokenization.local as local
    from mbridge_seqpack.pipeline.engine import LocalEngine

    src = small_jsonl(tmp_path / "train.jsonl")
    out = tmp_path / "out"
    # where each stage is looked up: the local engine's tokenization and writer, the pipeline's metadata
    for owner, stage in ((local, "tokenize_split"), (LocalEngine, "write_split"), (pipeline, "write_metadata")):
        real = getattr(owner, stage)

        def dying(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            _real(*args, **kwargs)
            raise KeyboardInterrupt

        monkeypatch.setattr(owner, stage, staticmethod(dying) if isinstance(owner, type) else dying)
        with pytest.raises(KeyboardInterrupt):
            run_pack({"training": src, "validation": src}, out, pack_size=2048)
        monkeypatch.setattr(owner, stage, staticmethod(real) if isinstance(owner, type) else real)
        assert not out.exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == [".out.lock"]
    run_pack({"training": src}, out, pack_size=2048)
    assert inspect_artifact(out).ok


def test_output_directory_rules(tmp_path: Path, megatron_bridge: Any) -> None:
    import fcntl

    src = small_jsonl(tmp_path / "train.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    (out / "old_file").write_text("x")
    with pytest.raises(
        ArtifactError,
        match=r"--output .*/out: not empty; choose an empty directory or pass "
        r"--overwrite",
    ):
        pack_jsonl({"training": src}, tokenizer=TOKENIZER, output_dir=out, options=PackOptions(pack_size=2048))
    run_pack({"training": src}, out, pack_size=2048)  # overwrite: the stale file is gone with the old contents
    assert sorted(p.name for p in out.iterdir()) == ["2048_metadata.jsonl", "training_2048.idx.parquet"]
    with open(tmp_path / ".out.lock", "w") as held:  # a concurrent pack holds the lock
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ArtifactError, match="another mbridge-seqpack pack is writing there right now"):
            run_pack({"training": src}, out, pack_size=2048)
    as_file = tmp_path / "file"
    as_file.write_text("x")
    with pytest.raises(ArtifactError, match="is a file, not a directory"):
        run_pack({"training": src}, as_file, pack_size=2048)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"input": null, "output": "a"}', "field 'input' must be a string, got NoneType null"),
        ('{"input": 3.5, "output": "a"}', "field 'input' must be a string, got float 3.5"),
        ('{"input": ["x"], "output": "a"}', "field 'input' must be a string, got list"),
        ('{"input": "\\ud800", "output": "a"}', "field 'input' holds a lone surrogate"),
        ('{"output": "a"}', "missing field 'input'"),
        ("[1, 2]", "each line must be a JSON object, got list"),
        ('{"input": "a", "output": ', "not valid JSON"),
    ],
)
def test_strict_input_names_file_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    from mbridge_seqpack.tokenization.sequences import InputError, check_jsonl

    src = tmp_path / "in.jsonl"
    src.write_text('{"input": "q", "output": "a"}\n' + line + "\n")
    with pytest.raises(InputError) as info:
        check_jsonl(src, {})
    assert str(info.value).startswith(f"{src}:2: ")
    assert message in str(info.value)


def test_cli_errors_have_no_traceback(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"input": "q", "output": "a"}\n{"input": "\xff", "output": "a"}\n')
    garbage_tok = tmp_path / "tok"
    garbage_tok.mkdir()
    (garbage_tok / "tokenizer.json").write_text("not json")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o500)
    cases = [
        (["pack", str(bad), "--pack-size", "64"], f"{bad}:2: not UTF-8"),
        (["pack", "--pack-size", "64", "--tokenizer", str(tmp_path / "nope")], "tokenizer"),
        (
            ["pack", "--pack-size", "64", "--pad-seq-to-mult", "128", "--output", str(tmp_path / "o")],
            "--pad-seq-to-mult 128 must be at most --pack-size 64",
        ),
        (["pack", "--pack-size", "64", "--output", str(bad)], "is a file, not a directory"),
        (["inspect", str(tmp_path / "missing")], "no such file or directory"),
        (["pack"], "pack needs --pack-size N"),
    ]
    for argv, expected in cases:
        done = subprocess.run(
            [sys.executable, "-m", "mbridge_seqpack", *argv], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and expected in unwrap(done.stderr), (argv, done.stderr)
    readonly.chmod(0o700)


def test_stale_pack_rule(artifact: Path, packed_cfg: Any) -> None:
    packed_cfg.dataset.do_validation = False  # no validation split is prepared at launch into the sealed folder
    specs = packed_cfg.dataset.offline_packing_specs
    train = str(artifact / "training_4096.idx.parquet")
    specs.packed_train_data_path = train
    specs.packed_metadata_path = str(artifact / "4096_metadata.jsonl")
    found = pack_rule(packed_cfg)
    assert [v.rule_id for v in found] == ["artifact.fingerprint_mismatch"]
    assert found[0].fields == {
        "dataset.offline_packing_specs.packed_train_data_path": train,
        "artifact pad_seq_to_mult": 4,
        "dataset.offline_packing_specs.pad_seq_to_mult": 1,
    }
    specs.pad_seq_to_mult = 4
    assert pack_rule(packed_cfg) == []
    specs.packed_train_data_path = str(artifact / "training_*.idx.parquet")  # a glob of the same file
    assert pack_rule(packed_cfg) == []


def test_directory_path_that_holds_validation_data_is_refused(artifact: Path, packed_cfg: Any) -> None:
    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    specs.packed_train_data_path = str(artifact)  # Megatron-Bridge reads every .parquet of the directory
    (v,) = pack_rule(packed_cfg)
    assert v.rule == (
        "resolves to 2 file(s) holding split(s) ['training', 'validation']; Megatron-Bridge would "
        "read all of them as training data"
    )


def test_rule_refuses_corrupted_interrupted_and_mixed_packs(artifact: Path, packed_cfg: Any, tmp_path: Path) -> None:
    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    train = copy / "training_4096.idx.parquet"
    specs.packed_train_data_path = str(train)
    _flip(train, _footer_offset(train))  # the footer is read at validate() (O(metadata))
    (v,) = pack_rule(packed_cfg)
    assert v.rule.endswith(
        "its Parquet footer differs from the seal: the file was modified or corrupted - re-run mbridge-seqpack pack"
    )
    shutil.copy(artifact / "training_4096.idx.parquet", train)
    _flip(train, 1000)  # a row group: left to the launch's content check, which names it
    assert pack_rule(packed_cfg) == []
    (problem,) = content_plan(packed_cfg).run()
    assert problem.startswith(f"{train}: row group 0 (rows 0..")
    shutil.copy(artifact / "training_4096.idx.parquet", train)
    (copy / "4096_metadata.jsonl").unlink()  # an interrupted pack has no metadata
    (v,) = pack_rule(packed_cfg)
    assert "no <N>_metadata.jsonl next to it: the pack is incomplete" in v.rule
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(artifact / "training_4096.idx.parquet", mixed / "training_4096.idx.parquet")
    shutil.copy(artifact / "training_4096.idx.parquet", mixed / "training_8192.idx.parquet")
    shutil.copy(artifact / "4096_metadata.jsonl", mixed / "4096_metadata.jsonl")
    shutil.copy(artifact / "4096_metadata.jsonl", mixed / "8192_metadata.jsonl")
    specs.packed_train_data_path = str(mixed)
    assert "2 metadata files" in pack_rule(packed_cfg)[0].rule
    specs.packed_train_data_path = str(tmp_path / "nowhere")
    (v,) = pack_rule(packed_cfg)
    assert v.rule.startswith("Megatron-Bridge finds no packed data there")


def test_rule_tokenizer_and_metadata_mismatch(artifact: Path, packed_cfg: Any, tmp_path: Path) -> None:
    packed_cfg.dataset.do_validation = False  # `other` is a training-only pack: no split is prepared into it
    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    specs.packed_train_data_path = str(artifact / "training_4096.idx.parquet")
    other_tok = tmp_path / "tok"
    shutil.copytree(TOKENIZER, other_tok)
    (other_tok / "tokenizer_config.json").write_text(
        (TOKENIZER / "tokenizer_config.json").read_text().replace("}", ', "model_max_length": 7}', 1)
    )
    packed_cfg.tokenizer.tokenizer_model = str(other_tok)
    (v,) = pack_rule(packed_cfg)
    assert v.rule.startswith("the pack was tokenized with another tokenizer")
    packed_cfg.tokenizer.tokenizer_model = str(TOKENIZER)
    other = tmp_path / "other"
    run_pack({"training": small_jsonl(tmp_path / "s.jsonl")}, other, pad_seq_to_mult=4)
    specs.packed_metadata_path = str(other / "4096_metadata.jsonl")
    (v,) = pack_rule(packed_cfg)
    assert v.rule.startswith("packed_metadata_path was written by a different pack run")


def test_sigkill_mid_pack_leaves_no_pack_and_the_next_pack_cleans_up(tmp_path: Path) -> None:
    """A real kill -9 while the pack is being written: no output directory appears, inspect and the rule see
    nothing, and the next pack into the same place succeeds and removes the dead run's staging directory."""
    import os
    import signal
    import time

    from tests.support.fork_server import fork_context, pack_child  # the fork server the kill tests share (one import)

    src = small_jsonl(tmp_path / "train.jsonl", 400)
    out = tmp_path / "out"
    argv = ["pack", str(src), "--pack-size", "1024", "--output", str(out)]
    proc = fork_context().Process(target=pack_child, args=(argv, None))
    proc.start()
    deadline = time.time() + 300
    while time.time() < deadline and not list(tmp_path.glob(".out.staging-*")):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    assert list(tmp_path.glob(".out.staging-*")), "the pack was killed before it started writing"
    assert not out.exists()
    with pytest.raises(ArtifactError, match="no such file or directory"):
        inspect_artifact(out)
    run_pack({"training": src}, out, pack_size=1024)
    assert inspect_artifact(out).ok
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == [".out.lock"]


def _footer_offset(path: Path) -> int:
    """A byte of the Parquet footer that no reader needs (the writer's name): a flip there leaves a readable
    file whose footer differs from its seal."""
    data = path.read_bytes()
    return data.rindex(b"parquet-cpp-arrow") + 3


def test_only_rank_zero_reads_footers(
    artifact: Path, packed_cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank validates at start-up: rank 0 reads the footers, the others compare sizes only (rank 0's error
    stops the job), so a 1,024-GPU start does not read the pack 1,024 times."""
    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    specs.packed_train_data_path = str(copy / "training_4096.idx.parquet")
    _flip(copy / "training_4096.idx.parquet", _footer_offset(copy / "training_4096.idx.parquet"))
    monkeypatch.setenv("RANK", "5")
    assert pack_rule(packed_cfg) == []
    monkeypatch.setenv("RANK", "0")
    (v,) = pack_rule(packed_cfg)
    assert "its Parquet footer differs from the seal" in v.rule


def test_a_sealed_file_that_lost_its_fingerprint_is_corrupted_not_foreign(
    artifact: Path, packed_cfg: Any, tmp_path: Path
) -> None:
    """A byte flip in the fingerprint's key leaves a readable file with no fingerprint; the metadata beside it
    still seals that file name, so inspect and the config rule refuse it instead of passing it as unsealed."""
    import pyarrow.parquet as pq

    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    train = copy / "training_4096.idx.parquet"
    pq.write_table(pq.read_table(str(train)).replace_schema_metadata(None), str(train))
    expected = (
        "no mbridge_seqpack fingerprint, but 4096_metadata.jsonl seals this file: it was modified or corrupted "
        "- re-run mbridge-seqpack pack"
    )
    report = inspect_artifact(copy)
    assert [s.problems for s in report.splits if s.path == train] == [[expected]]
    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    specs.packed_train_data_path = str(train)
    (v,) = pack_rule(packed_cfg)
    assert v.rule_id == "artifact.fingerprint_mismatch"
    assert v.rule == f"{train}: {expected}"
    other = tmp_path / "foreign" / "training_4096.idx.parquet"  # the same unsealed file without a seal beside it
    other.parent.mkdir()
    shutil.copy(train, other)
    specs.packed_train_data_path = str(other)
    assert pack_rule(packed_cfg) == []


def test_pack_from_a_recipe_lays_out_for_its_sampler_seed_dp_and_global_batch(
    tmp_path: Path, megatron_bridge: Any
) -> None:
    from mbridge_seqpack.cli.main import main
    from mbridge_seqpack.recipes.targets import build_target
    from mbridge_seqpack.rules.context import RuleContext

    out = tmp_path / "p"
    overrides = ["dataset.seed=77", "train.global_batch_size=16"]
    argv = ["pack", str(DATA / "training.jsonl"), "--recipe", "llama3_8b_sft_packed_8k", "--output", str(out)]
    assert main([*argv, "--tokenizer", str(TOKENIZER), *overrides]) == 0
    cfg, info = build_target("llama3_8b_sft_packed_8k", overrides)
    ctx = RuleContext.build(cfg, info.world_size)
    (entry,) = json.loads(next(out.glob("*_metadata.jsonl")).read_text())  # the training split only
    balance = entry["balance"]
    assert cfg.dataset.dataloader_type == "batch"
    assert (balance["sampler"], balance["sampler_seed"]) == ("batch", 77)
    assert ctx.topology.data_parallel == 4  # 8 GPUs at TP 2: global batch 16 is 4 rows per rank per step
    assert (balance["data_parallel"], balance["micro_batches"]) == (4, 4)
    cfg.dataset.offline_packing_specs.packed_train_data_path = str(next(out.glob("training_*.idx.parquet")))
    assert "artifact.balance_layout" not in {v.rule_id for v in check(cfg, world_size=info.world_size)}


def test_stale_staging_cleanup_matches_the_output_name_literally(tmp_path: Path) -> None:
    """Packing into ``p[1]`` clears its own leftovers only: ``p1``'s live staging directory (which the glob
    ``p[1]`` would match) survives."""
    from mbridge_seqpack.artifact.store import staged_directory

    live = tmp_path / ".p1.staging-4242"
    live.mkdir()
    stale = tmp_path / ".p[1].staging-4243"
    stale.mkdir()
    with staged_directory(tmp_path / "p[1]", overwrite=False) as staging:
        (staging / "x").write_text("x")
    assert live.is_dir() and not stale.exists()
    assert (tmp_path / "p[1]" / "x").read_text() == "x"


def test_tokenization_scratch_stays_inside_the_staging_directory(
    tmp_path: Path, megatron_bridge: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the system temporary directory unusable, a pack still succeeds: its input chunks and index files live
    under the staging directory and go with it, so a killed pack leaves nothing elsewhere."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmp"))
    result = run_pack({"training": small_jsonl(tmp_path / "small.jsonl")}, tmp_path / "out")
    assert (result.directory / "training_4096.idx.parquet").is_file()
    assert not (tmp_path / "no-such-tmp").exists()


def test_byte_identical_to_megatron_bridge_prep_sharegpt(tmp_path: Path, megatron_bridge: Any) -> None:
    """ShareGPT ``conversations`` records, which Megatron-Bridge's chat dataset normalises, pack as it packs them."""
    tok = chat_tokenizer(tmp_path)
    share = chat_corpus(tmp_path / "share.jsonl", 200, sharegpt=True)
    kwargs = {"chat": True, "use_hf_tokenizer_chat_template": True}
    ours = run_pack({"training": share}, tmp_path / "ours", pack_size=2048, dataset_kwargs=kwargs, tokenizer=tok)
    mine = packed_sequences(ours.directory / "training_2048.idx.parquet")
    assert sum(mine.values()) == 200
    assert mine == packed_sequences(_megatron_bridge_prep(share, tok, tmp_path, 2048, 1, kwargs))


@pytest.mark.parametrize("loss_mode", ["completion", "full"])
def test_dataset_preprocessing_is_honoured_byte_for_byte(tmp_path: Path, megatron_bridge: Any, loss_mode: str) -> None:
    """A recipe's ``dataset.preprocessing`` (prompt/completion columns, loss mode) reaches the pack exactly as
    Megatron-Bridge's builder folds it in (``normalize_gpt_sft_dataset_kwargs``)."""
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetConfig
    from megatron.bridge.data.sft_processing import PromptCompletionSFTPreprocessingConfig

    from mbridge_seqpack.tokenization.dataset_kwargs import config_dataset_kwargs

    rows = [json.loads(line) for line in (DATA / "training.jsonl").read_text().splitlines()[:200]]
    data = tmp_path / "pc.jsonl"
    data.write_text("".join(json.dumps({"question": r["input"], "reply": r["output"]}) + "\n" for r in rows))
    dataset = GPTSFTDatasetConfig(
        seq_length=4096,
        dataset_root=str(tmp_path),
        preprocessing=PromptCompletionSFTPreprocessingConfig(
            prompt_column="question", completion_column="reply", loss_mode=loss_mode
        ),
    )
    kwargs = config_dataset_kwargs(dataset)
    assert kwargs["prompt_completion_config"].loss_mode == loss_mode
    ours = run_pack({"training": data}, tmp_path / "ours", dataset_kwargs=kwargs)
    mine = packed_sequences(ours.directory / "training_4096.idx.parquet")
    assert sum(mine.values()) == 200
    assert mine == packed_sequences(_megatron_bridge_prep(data, TOKENIZER, tmp_path, 4096, 1, kwargs))
    masks = [sum(mask) == len(mask) - 1 for (_, mask) in mine]  # "full": every token but the last is trained
    assert all(masks) if loss_mode == "full" else not any(masks)


def test_a_pack_made_with_other_content_settings_is_refused(tmp_path: Path, packed_cfg: Any) -> None:
    """dataset_kwargs that change tokens or loss masks, and the longest sequence kept, must match the config."""
    (tmp_path / "root").mkdir()
    small = small_jsonl(tmp_path / "root" / "training.jsonl")
    packed_cfg.dataset.dataset_root = str(tmp_path / "root")  # the data the packs are made from
    other = run_pack({"training": small}, tmp_path / "eos", dataset_kwargs={"add_eos": False})
    specs = packed_cfg.dataset.offline_packing_specs
    specs.packed_train_data_path = str(other.directory / "training_4096.idx.parquet")
    (v,) = pack_rule(packed_cfg)
    assert "add_eos: pack false, config true" in v.rule
    assert v.fields["dataset.dataset_kwargs.add_eos"] == "true"
    assert_the_hook_refuses(packed_cfg)
    packed_cfg.dataset.dataset_kwargs = {**(packed_cfg.dataset.dataset_kwargs or {}), "add_eos": False}
    assert pack_rule(packed_cfg) == []
    shorter = run_pack({"training": small}, tmp_path / "short", max_seq_length=2048, dataset_kwargs={"add_eos": False})
    specs.packed_train_data_path = str(shorter.directory / "training_4096.idx.parquet")
    (v,) = pack_rule(packed_cfg)
    assert v.fields["artifact max_seq_length"] == 2048
    assert "kept sequences up to 2048 tokens" in v.rule


def _point(cfg: Any, directory: Path) -> None:
    specs = cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    specs.packed_train_data_path = str(directory / "training_4096.idx.parquet")
    specs.packed_val_data_path = str(directory / "validation_4096.idx.parquet")
    specs.packed_metadata_path = str(directory / "4096_metadata.jsonl")


@pytest.mark.parametrize(
    "edit",
    ["rewrite", "remove", "rewrite_and_reseal"],
)
def test_the_metadata_megatron_bridge_reads_is_sealed(
    artifact: Path, packed_cfg: Any, tmp_path: Path, edit: str
) -> None:
    """max_samples_per_bin sizes the static cu_seqlens: rewriting or dropping it is refused by inspect and by the
    config-time rule, and a resealed wrong value is caught against the rows."""
    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    meta = copy / "4096_metadata.jsonl"
    entries = json.loads(meta.read_text())
    if edit == "remove":
        del entries[0]["max_samples_per_bin"]
    else:
        entries[0]["max_samples_per_bin"] += 3
    if edit == "rewrite_and_reseal":
        entries[0][ENTRY_SEAL] = entry_digest(entries[0])
    meta.write_text(json.dumps(entries))
    report = inspect_artifact(copy)
    assert not report.ok
    problems = " ".join(p for s in report.splits for p in s.problems)
    if edit == "rewrite_and_reseal":
        assert "metadata disagrees with the rows on what Megatron-Bridge reads: max_samples_per_bin=" in problems
    else:
        assert "was edited or is unsealed" in problems
        _point(packed_cfg, copy)
        assert any("was edited or is unsealed" in v.rule for v in pack_rule(packed_cfg))


def test_swapped_split_files_are_refused(artifact: Path, packed_cfg: Any, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    train, val = copy / "training_4096.idx.parquet", copy / "validation_4096.idx.parquet"
    train.rename(tmp_path / "t")
    val.rename(train)
    (tmp_path / "t").rename(val)
    report = inspect_artifact(copy)
    assert not report.ok
    assert any("named for another split" in p for s in report.splits for p in s.problems)
    _point(packed_cfg, copy)
    assert pack_rule(packed_cfg)


def test_300_random_bit_flips_are_all_caught(artifact: Path, packed_cfg: Any, tmp_path: Path) -> None:
    """One flipped bit anywhere in the three files: inspect refuses the pack, and so does the launch (the
    config-time rule, or the content check it defers the row groups to; tests/artifact/test_integrity.py runs the
    launch's own gate and Megatron-Bridge's dataset)."""
    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    _point(packed_cfg, copy)
    assert inspect_artifact(copy).ok and pack_rule(packed_cfg) == []
    files = [copy / "training_4096.idx.parquet", copy / "validation_4096.idx.parquet", copy / "4096_metadata.jsonl"]
    rng = random.Random(20)
    missed = []
    for trial in range(300):
        path = files[trial % 3]
        data = bytearray(path.read_bytes())
        offset, bit = rng.randrange(len(data)), 1 << rng.randrange(8)
        data[offset] ^= bit
        path.write_bytes(bytes(data))
        try:
            caught_by_inspect = not inspect_artifact(copy).ok
            caught_by_check = bool(pack_rule(packed_cfg)) or bool(content_plan(packed_cfg).run())
        finally:
            data[offset] ^= bit
            path.write_bytes(bytes(data))
        if not (caught_by_inspect and caught_by_check):
            missed.append((path.name, offset, bit, caught_by_inspect, caught_by_check))
    assert missed == []


def test_a_pack_size_that_is_not_a_multiple_packs_as_megatron_bridge_does(
    tmp_path: Path, megatron_bridge: Any
) -> None:
    """4094 with pad_seq_to_mult=4: Megatron-Bridge pads sequences to at most the largest multiple below (4092);
    the pack holds the same sequences."""
    ours = run_pack({"training": DATA / "training.jsonl"}, tmp_path / "ours", pack_size=4094, pad_seq_to_mult=4)
    mine = packed_sequences(ours.directory / "training_4094.idx.parquet")
    assert sum(mine.values()) == 1799
    assert mine == packed_sequences(_megatron_bridge_prep(DATA / "training.jsonl", TOKENIZER, tmp_path, 4094, 4, {}))
    assert inspect_artifact(ours.directory).ok


def test_chat_records_longer_than_the_pack_are_refused_or_dropped_as_megatron_bridge_drops_them(
    tmp_path: Path, megatron_bridge: Any, capsys: pytest.CaptureFixture
) -> None:
    """Chat records are not truncated: Megatron-Bridge's prep skips those longer than max_seq_length
    (create_hist); the pack refuses by default and, with overflow="drop", keeps exactly the same sequences and
    records how many it dropped."""
    from mbridge_seqpack.cli.main import main

    tok = chat_tokenizer(tmp_path)
    chat = chat_corpus(tmp_path / "chat.jsonl", 120)
    kwargs = {"chat": True, "use_hf_tokenizer_chat_template": True}
    with pytest.raises(InputError, match=r"sequence\(s\) longer than 128 tokens .* pass --overflow drop"):
        run_pack({"training": chat}, tmp_path / "refused", pack_size=128, dataset_kwargs=kwargs, tokenizer=tok)
    ours = run_pack(
        {"training": chat}, tmp_path / "ours", pack_size=128, dataset_kwargs=kwargs, tokenizer=tok, overflow="drop"
    )
    mine = packed_sequences(ours.directory / "training_128.idx.parquet")
    assert mine == packed_sequences(_megatron_bridge_prep(chat, tok, tmp_path, 128, 1, kwargs))
    (entry,) = json.loads((ours.directory / "128_metadata.jsonl").read_text())
    assert entry["dropped_sequences"] == 120 - sum(mine.values()) > 0
    code = main(
        ["pack", str(chat), "--chat", "--tokenizer", str(tok), "--pack-size", "128", "--overflow", "drop"]
        + ["--output", str(tmp_path / "cli")]
    )
    assert code == 0
    said = " ".join(capsys.readouterr().out.split())  # the summary wraps at 100 columns
    assert f"{entry['dropped_sequences']} dropped (longer than the pack)" in said


def test_an_explicit_pack_is_compared_with_the_file_it_was_made_from(packed_cfg: Any, tmp_path: Path) -> None:
    """An explicit packed path: the launch trains on the pack and never reads dataset_root (Megatron-Bridge's builder
    skips its prep when the pack exists), so the pack is compared with the JSONL it was made from, recorded in its
    seal: that file changed since packing is refused; dataset_root naming other data is not what the launch reads."""
    source = small_jsonl(tmp_path / "made_from.jsonl")
    pack = tmp_path / "pack"
    run_pack({"training": source}, pack, pad_seq_to_mult=4)
    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    specs.packed_train_data_path = str(pack / "training_4096.idx.parquet")
    assert pack_rule(packed_cfg) == []  # dataset_root (the embedded corpus) is other data: not read
    source.write_text(source.read_text() + source.read_text().splitlines(keepends=True)[0])
    (v,) = pack_rule(packed_cfg)
    assert v.rule.startswith(f"the pack was made from another training file than {source.resolve()} (")
    assert v.fields["pack input"] == str(source.resolve())


def test_a_pack_made_without_the_configured_preprocessing_is_refused(artifact: Path, packed_cfg: Any) -> None:
    """dataset.preprocessing (here: chat) changes what the prep tokenizes: a prompt/answer pack is stale for it."""
    from megatron.bridge.data.sft_processing import ChatSFTPreprocessingConfig

    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    specs.packed_train_data_path = str(artifact / "training_4096.idx.parquet")
    assert pack_rule(packed_cfg) == []
    packed_cfg.dataset.preprocessing = ChatSFTPreprocessingConfig(loss_mode="full")
    (v,) = pack_rule(packed_cfg)
    assert "chat: pack false, config true" in v.rule and "chat_loss_mode" in v.rule


def _untruncated_lengths(src: Path, tmp: Path, kwargs: dict[str, Any]) -> np.ndarray:
    """Every example's length as Megatron-Bridge's own dataset makes it when nothing needs cutting."""
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split

    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    dataset = build_gpt_sft_split(
        src,
        tokenizer=load_megatron_tokenizer(TOKENIZER),
        seq_length=1 << 20,
        memmap_workers=1,
        seed=0,
        packed_sequence_size=-1,
        is_test=True,
        dataset_kwargs={**kwargs, "index_mapping_dir": str(tmp / "index-whole")},
    )
    return np.array([dataset[i]["token_count"] for i in range(len(dataset))])


@pytest.mark.parametrize("form", ["template", "prompt_completion"])
def test_truncated_examples_are_counted_and_packed_as_megatron_bridge_truncates_them(
    tmp_path: Path, megatron_bridge: Any, form: str
) -> None:
    """Megatron-Bridge's prep cuts examples longer than max_seq_length silently; the pack holds the same cut
    sequences and its metadata says how many were cut and by how many tokens (its own dataset, uncut, tells)."""
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetConfig
    from megatron.bridge.data.sft_processing import PromptCompletionSFTPreprocessingConfig

    from mbridge_seqpack.tokenization.dataset_kwargs import config_dataset_kwargs

    rows = [json.loads(line) for line in (DATA / "training.jsonl").read_text().splitlines()[:300]]
    data = tmp_path / "data.jsonl"
    kwargs: dict[str, Any] = {}
    if form == "prompt_completion":
        data.write_text("".join(json.dumps({"question": r["input"], "reply": r["output"]}) + "\n" for r in rows))
        preprocessing = PromptCompletionSFTPreprocessingConfig(prompt_column="question", completion_column="reply")
        kwargs = config_dataset_kwargs(
            GPTSFTDatasetConfig(seq_length=256, dataset_root=str(tmp_path), preprocessing=preprocessing)
        )
    else:
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    whole = _untruncated_lengths(data, tmp_path, kwargs)
    assert (whole > 256).sum() > 10  # the corpus does need cutting at this size
    ours = run_pack({"training": data}, tmp_path / "ours", pack_size=256, dataset_kwargs=kwargs)
    entry = ours.splits["training"]
    assert entry.truncated_sequences == int((whole > 256).sum())
    assert entry.truncated_tokens == int(np.maximum(whole - 256, 0).sum())
    mine = packed_sequences(ours.directory / "training_256.idx.parquet")
    assert mine == packed_sequences(_megatron_bridge_prep(data, TOKENIZER, tmp_path, 256, 1, kwargs))
    assert inspect_artifact(ours.directory).ok  # the counts are sealed with the rest of the entry
