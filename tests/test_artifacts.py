"""Packed artifacts: Megatron-Bridge's own packed dataset reads them; atomic writes; stale-pack rule."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mbridge_seqpack import check
from mbridge_seqpack.packing.artifact import ArtifactError
from mbridge_seqpack.packing.inspect_artifact import inspect_artifact
from mbridge_seqpack.packing.pipeline import pack_jsonl
from mbridge_seqpack.packing.sequences import load_tokenizer, tokenize_jsonl
from mbridge_seqpack.recipe_kit import embedded_data_dir, embedded_tokenizer_dir

DATA = embedded_data_dir()
TOKENIZER = embedded_tokenizer_dir()


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("packed") / "a"
    pack_jsonl({"training": DATA / "training.jsonl", "validation": DATA / "validation.jsonl"},
               tokenizer=TOKENIZER, pack_size=4096, output_dir=out, pad_seq_to_mult=4, seed=7)
    return out


def _small_jsonl(path: Path, n: int = 40) -> Path:
    rows = [json.loads(line) for line in (DATA / "training.jsonl").read_text().splitlines()[:n]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_metadata_has_what_megatron_bridge_reads(artifact: Path) -> None:
    entries = json.loads((artifact / "4096_metadata.jsonl").read_text())
    assert [e["split"] for e in entries] == ["training", "validation"]
    for e in entries:
        assert {"max_samples_per_bin", "dataset_max_seqlen", "min_packed_seqlen", "pack_size"} <= set(e)
        fp = e["fingerprint"]
        assert (fp["pack_size"], fp["pad_seq_to_mult"], fp["algorithm"], fp["seed"]) == (
            4096, 4, "best_fit_decreasing", 7)
        assert len(fp["input_sha256"]) == 64 and len(fp["tokenizer_sha256"]) == 64
    assert entries[0]["stats"]["num_sequences"] == 1799
    assert entries[0]["stats"]["gap_to_lower_bound"] == 0


def test_inspect_verifies_the_artifact(artifact: Path, tmp_path: Path) -> None:
    report = inspect_artifact(artifact, png=tmp_path / "hist.png")
    assert report.ok, report.to_text()
    train = report.splits[0]
    assert (train.name, train.sequences, train.pack_size) == ("training", 1799, 4096)
    assert sum(train.sequences_per_row.values()) == train.rows
    assert (tmp_path / "hist.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.to_text().endswith("verify: OK")


def test_round_trip_through_megatron_bridge_packed_dataset(artifact: Path, megatron_bridge: Any) -> None:
    """Every original sequence comes back from GPTSFTPackedParquetDataset's collate, tokens and loss mask."""
    import pyarrow.parquet as pq
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.bridge.training.tokenizers.config import TokenizerConfig
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    tok, eos = load_tokenizer(TOKENIZER)
    seqs = tokenize_jsonl(DATA / "training.jsonl", tok, eos, pad_seq_to_mult=4)
    mb_tok = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(TOKENIZER)))
    assert mb_tok.eos_id == eos
    path = artifact / "training_4096.idx.parquet"
    dataset = build_gpt_sft_split(  # exactly what Megatron-Bridge's GPT SFT builder runs for training
        path, tokenizer=mb_tok, seq_length=4096, memmap_workers=1, seed=1234, packed_sequence_size=4096,
        pack_metadata_path=artifact / "4096_metadata.jsonl", pad_cu_seqlens=True, pad_seq_to_mult=4,
        dataset_kwargs={"pad_to_max_length": True})
    assert type(dataset).__name__ == "GPTSFTPackedParquetDataset"
    order = pq.read_table(str(path), columns=["sequence_index"]).column("sequence_index").to_pylist()
    seen = []
    capacity = None
    for row in range(len(dataset)):
        batch = dataset.collate_fn([dataset[row]])
        tokens, labels, mask = batch["tokens"][0], batch["labels"][0], batch["loss_mask"][0]
        cu = batch["cu_seqlens_q"][0].tolist()
        cu_padded = batch["cu_seqlens_q_padded"][0].tolist()
        assert tokens.shape == (4096,)  # fixed width
        capacity = capacity or len(cu)
        assert len(cu) == capacity == len(cu_padded)  # static cu_seqlens shape on every row
        for k, index in enumerate(order[row]):
            lo, hi = seqs.offsets[index], seqs.offsets[index + 1]
            ids = seqs.tokens[lo:hi]
            real = int(seqs.original_tokens[index])
            start = cu_padded[k]
            assert cu_padded[k + 1] - start == hi - lo - 1  # aligned runtime length
            assert cu[k + 1] - cu[k] == real - 1  # logical length excludes alignment padding
            assert tokens[start:start + real - 1].tolist() == ids[:real - 1].tolist()
            assert labels[start:start + real - 1].tolist() == ids[1:real].tolist()
            expected = seqs.loss_mask[lo + 1:lo + real].astype(np.int64)
            assert mask[start:start + real - 1].tolist() == expected.tolist()
            assert mask[start + real - 1:cu_padded[k + 1]].sum() == 0  # padding never trains
            seen.append(index)
        assert mask[cu_padded[len(order[row])]:].sum() == 0  # row tail
    assert sorted(seen) == list(range(seqs.count))
    assert capacity == max(len(r) for r in order) + 2


def test_interrupted_write_leaves_no_complete_looking_artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    import pyarrow.parquet as pq

    real_write = pq.write_table
    calls = {"n": 0}

    def dying_write(table: Any, where: str, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the validation split
            Path(where).write_bytes(b"PAR1 half written")
            raise KeyboardInterrupt
        real_write(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", dying_write)
    out = tmp_path / "out"
    src = _small_jsonl(tmp_path / "train.jsonl")
    with pytest.raises(KeyboardInterrupt):
        pack_jsonl({"training": src, "validation": src}, tokenizer=TOKENIZER, pack_size=2048, output_dir=out)
    assert sorted(p.name for p in out.iterdir()) == ["training_2048.idx.parquet"]  # no temp files, no metadata
    with pytest.raises(ArtifactError) as info:
        inspect_artifact(out)
    assert str(info.value) == (f"{out}: expected one <N>_metadata.jsonl, found 0; the artifact is incomplete "
                               "(an interrupted pack writes it last) - re-run mbridge-seqpack pack")


def test_corrupted_and_mixed_artifacts_are_refused(tmp_path: Path) -> None:
    src = _small_jsonl(tmp_path / "train.jsonl")
    out = tmp_path / "out"
    pack_jsonl({"training": src}, tokenizer=TOKENIZER, pack_size=2048, output_dir=out)
    data = out / "training_2048.idx.parquet"
    good = data.read_bytes()
    data.write_bytes(good[: len(good) // 2])
    with pytest.raises(ArtifactError, match=r"not a readable Parquet file .*; re-run mbridge-seqpack pack"):
        inspect_artifact(out)
    data.write_bytes(good)
    other = tmp_path / "other"
    pack_jsonl({"training": src}, tokenizer=TOKENIZER, pack_size=2048, output_dir=other, seed=99)
    (out / "2048_metadata.jsonl").write_bytes((other / "2048_metadata.jsonl").read_bytes())
    with pytest.raises(ArtifactError) as info:
        inspect_artifact(out)
    assert str(info.value) == (f"{data}: fingerprint differs from 2048_metadata.jsonl; the files come from "
                               "different pack runs - re-run mbridge-seqpack pack")


def test_overflow_drop_is_counted_and_verified(tmp_path: Path) -> None:
    src = _small_jsonl(tmp_path / "train.jsonl", n=200)
    with pytest.raises(ValueError, match=r"exceeds capacity 128 \(\d+ sequence\(s\) too long\)"):
        pack_jsonl({"training": src}, tokenizer=TOKENIZER, pack_size=128, output_dir=tmp_path / "x")
    result = pack_jsonl({"training": src}, tokenizer=TOKENIZER, pack_size=128, output_dir=tmp_path / "y",
                        overflow="drop")
    dropped = result.splits["training"]["stats"]["num_dropped"]
    assert dropped > 0
    report = inspect_artifact(tmp_path / "y")
    assert report.ok and report.splits[0].sequences == 200 - dropped


def test_stale_pack_rule(artifact: Path, packed_cfg: Any) -> None:
    specs = packed_cfg.dataset.offline_packing_specs
    train = str(artifact / "training_4096.idx.parquet")
    specs.packed_train_data_path = train
    specs.packed_metadata_path = str(artifact / "4096_metadata.jsonl")
    found = check(packed_cfg, world_size=8)
    assert [v.rule_id for v in found] == ["artifact.fingerprint_mismatch"]
    assert found[0].fields == {"dataset.offline_packing_specs.packed_train_data_path": train,
                               "artifact pad_seq_to_mult": 4, "dataset.offline_packing_specs.pad_seq_to_mult": 1}
    assert found[0].fix == (
        "re-pack: mbridge-seqpack pack INPUT.jsonl --pack-size 4096 --pad-seq-to-mult 1 --tokenizer TOKENIZER (or "
        "point dataset.offline_packing_specs.packed_train_data_path at a matching pack)")
    specs.pad_seq_to_mult = 4
    assert check(packed_cfg, world_size=8) == []
    for path in ("model.seq_length", "dataset.seq_length", "dataset.offline_packing_specs.packed_sequence_size"):
        from mbridge_seqpack.paths import set_path

        set_path(packed_cfg, path, 8192)
    (v,) = check(packed_cfg, world_size=8)
    assert v.fields == {"dataset.offline_packing_specs.packed_train_data_path": train, "artifact pack_size": 4096,
                        "dataset.offline_packing_specs.packed_sequence_size": 8192}


def test_stale_pack_rule_tokenizer_and_metadata(artifact: Path, packed_cfg: Any, tmp_path: Path) -> None:
    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult = 4
    specs.packed_train_data_path = str(artifact / "training_4096.idx.parquet")
    other_tok = tmp_path / "tok"
    other_tok.mkdir()
    (other_tok / "tokenizer.json").write_text((TOKENIZER / "tokenizer.json").read_text().replace('"<|pad|>"',
                                                                                                  '"<|PAD|>"'))
    packed_cfg.tokenizer.tokenizer_model = str(other_tok)
    (v,) = check(packed_cfg, world_size=8)
    assert v.rule_id == "artifact.fingerprint_mismatch"
    assert set(v.fields) == {"dataset.offline_packing_specs.packed_train_data_path", "artifact tokenizer_sha256",
                             "tokenizer.tokenizer_model sha256"}
    packed_cfg.tokenizer.tokenizer_model = str(TOKENIZER)
    foreign = tmp_path / "m.json"
    foreign.write_text('[{"max_samples_per_bin": 3, "dataset_max_seqlen": 10, "min_packed_seqlen": 1}]')
    specs.packed_metadata_path = str(foreign)
    (v,) = check(packed_cfg, world_size=8)
    assert v.rule.startswith("the metadata file was written by a different pack run")


def test_cli_pack_and_inspect_do_not_import_megatron(tmp_path: Path) -> None:
    import subprocess

    code = ("import sys; from mbridge_seqpack.cli import main\n"
            f"rc = main(['pack', '--pack-size', '4096', '--output', {str(tmp_path / 'p')!r}])\n"
            f"rc2 = main(['inspect', {str(tmp_path / 'p')!r}, '--png', {str(tmp_path / 'h.png')!r}])\n"
            "print('RC', rc, rc2, any(m.startswith('megatron') for m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RC 0 0 False" in done.stdout
    assert "packed into" in done.stdout and "verify: OK" in done.stdout


def test_verify_passes_on_a_good_pack_and_catches_loss_on_padding(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mbridge_seqpack.verify import verify_artifact

    src = _small_jsonl(tmp_path / "train.jsonl", n=60)
    out = tmp_path / "p"
    pack_jsonl({"training": src}, tokenizer=TOKENIZER, pack_size=1024, output_dir=out, pad_seq_to_mult=8)
    report = verify_artifact(out, max_rows=3)
    assert report.ok, report.to_text()
    assert report.cp_sizes == (2, 4)
    assert report.passed == {"static cu_seqlens": 3, "attention parity": 3, "loss parity": 3,
                             "padding has no loss": 3, "CP2 partition round trip": 3, "CP4 partition round trip": 3}
    path = out / "training_1024.idx.parquet"
    table = pq.read_table(str(path))
    ones = pa.array([[1] * len(r) for r in table.column("loss_mask").to_pylist()], type=pa.list_(pa.int8()))
    tampered = table.set_column(table.schema.get_field_index("loss_mask"), "loss_mask", ones)
    pq.write_table(tampered.replace_schema_metadata(table.schema.metadata), str(path))
    report = verify_artifact(out, max_rows=3)
    assert not report.ok
    assert any("alignment padding carries loss" in f for f in report.failures)
    assert inspect_artifact(out).splits[0].problems[0].startswith("padding carries loss on ")


def test_stale_pack_rule_on_an_unreadable_pack(packed_cfg: Any, tmp_path: Path) -> None:
    bad = tmp_path / "training_4096.idx.parquet"
    bad.write_bytes(b"PAR1 not really")
    packed_cfg.dataset.offline_packing_specs.packed_train_data_path = str(bad)
    (v,) = check(packed_cfg, world_size=8)
    assert v.rule_id == "artifact.fingerprint_mismatch"
    assert v.fields == {"dataset.offline_packing_specs.packed_train_data_path": str(bad)}
    assert v.rule.startswith(f"{bad}: not a readable Parquet file (")
    assert v.fix == ("re-run mbridge-seqpack pack and point dataset.offline_packing_specs.packed_train_data_path at "
                     "its output")


def test_inspect_catches_duplicated_and_broken_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = _small_jsonl(tmp_path / "train.jsonl", n=60)
    out = tmp_path / "p"
    pack_jsonl({"training": src}, tokenizer=TOKENIZER, pack_size=1024, output_dir=out)
    path = out / "training_1024.idx.parquet"
    table = pq.read_table(str(path))
    meta = table.schema.metadata
    index = table.column("sequence_index").to_pylist()
    index[0] = [index[1][0]] + index[0][1:]  # row 0's first sequence claims to be row 1's
    dup = table.set_column(table.schema.get_field_index("sequence_index"), "sequence_index",
                           pa.array(index, type=pa.list_(pa.int64())))
    pq.write_table(dup.replace_schema_metadata(meta), str(path))
    assert inspect_artifact(out).splits[0].problems == [
        "1 sequence(s) appear more than once", "1 sequence(s) of the input are missing (0 were dropped as too long)"]
    starts = table.column("seq_start_id").to_pylist()
    starts[0] = [0, starts[0][2], starts[0][1], *starts[0][3:]] if len(starts[0]) > 2 else [0, 5000]
    broken = table.set_column(table.schema.get_field_index("seq_start_id"), "seq_start_id",
                              pa.array(starts, type=pa.list_(pa.int32())))
    pq.write_table(broken.replace_schema_metadata(meta), str(path))
    problems = inspect_artifact(out).splits[0].problems
    assert "boundaries are not strictly increasing (a segment of fewer than 2 tokens)" in problems
