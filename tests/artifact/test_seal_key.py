"""#43 item 2: what the seal protects. Without a key it detects corruption and accidental edits; a deliberate edit
that recomputes the hashes with the plugin's own functions passes (shown here, as docs/packing.md says). With a key
(HMAC-SHA256), a forged metadata entry and a forged tile are refused by ``check`` and by the launch's verified
reader, and the seal records that it is keyed, never the key."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.artifact.seal_key import ENTRY_HMAC, KEY_ENV, KEY_FILE_ENV, KEYED
from mbridge_seqpack.artifact.store import ENTRY_SEAL, ArtifactError, column_checksums, entry_digest
from tests.support.packs import pack_rule, run_pack, small_jsonl
from tests.support.stderr_text import unwrap

pytestmark = pytest.mark.slow

KEY = "k3y-for-the-tests-0123456789abcdef"
SPLIT = "training_4096.idx.parquet"


@pytest.fixture
def made(tmp_path: Path, packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(pack directory, a config training on it) for a pack made with ``KEY`` set, or without when asked."""

    def make(keyed: bool) -> tuple[Path, Any]:
        (tmp_path / "root").mkdir(exist_ok=True)
        source = small_jsonl(tmp_path / "root" / "training.jsonl")
        if keyed:
            monkeypatch.setenv(KEY_ENV, KEY)
        else:
            monkeypatch.delenv(KEY_ENV, raising=False)
        monkeypatch.delenv(KEY_FILE_ENV, raising=False)
        run_pack({"training": source}, tmp_path / "pack")
        packed_cfg.dataset.dataset_root = str(tmp_path / "root")
        packed_cfg.dataset.offline_packing_specs.packed_train_data_path = str(tmp_path / "pack" / SPLIT)
        return tmp_path / "pack", packed_cfg

    return make


def _entries(pack: Path) -> list[dict[str, Any]]:
    return json.loads((pack / "4096_metadata.jsonl").read_text())


def _write(pack: Path, entries: list[dict[str, Any]]) -> None:
    (pack / "4096_metadata.jsonl").write_text(json.dumps(entries))


def _forge_entry(pack: Path) -> None:
    """A deliberate edit of a key Megatron-Bridge sizes cu_seqlens from, its sha256 seal recomputed."""
    entries = _entries(pack)
    entries[0]["max_samples_per_bin"] += 1
    entries[0][ENTRY_SEAL] = entry_digest(entries[0])
    _write(pack, entries)


def _forge_tile(pack: Path) -> None:
    """One token changed, the file rewritten, every checksum the entry holds (file, tiles, columns) and its sha256
    seal recomputed with the plugin's own functions."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mbridge_seqpack.artifact.row_group_seal import seal_tiles

    path = pack / SPLIT
    table = pq.read_table(str(path))
    rows = table.column("input_ids").to_pylist()
    rows[0][1] = rows[0][1] + 1
    edited = table.set_column(
        table.column_names.index("input_ids"), "input_ids", pa.array(rows, type=table.schema.field("input_ids").type)
    ).replace_schema_metadata(table.schema.metadata)
    pq.write_table(edited, str(path), row_group_size=500)
    whole, tiles = seal_tiles(path)
    entries = _entries(pack)
    entries[0]["checksums"] = {
        "file_sha256": whole,
        "file_bytes": path.stat().st_size,
        "columns": column_checksums(edited),
        tiles.KEY: tiles.to_dict(),
    }
    entries[0][ENTRY_SEAL] = entry_digest(entries[0])
    _write(pack, entries)


def _find_seal(pack: Path) -> Any:
    from mbridge_seqpack.artifact.verified_parquet import find_seal

    return find_seal(pack / SPLIT)


def test_a_keyed_pack_records_that_it_is_keyed_never_the_key(made: Any) -> None:
    pack, cfg = made(keyed=True)
    (entry,) = _entries(pack)
    assert entry[KEYED] == "hmac-sha256" and len(entry[ENTRY_HMAC]) == 64
    key = KEY.encode()
    shown = [key, key.hex().encode(), key.hex().upper().encode(), base64.b64encode(key), base64.b32encode(key)]
    for path in sorted(p for p in pack.rglob("*") if p.is_file()):  # the metadata, the Parquet files and footers
        data = path.read_bytes()
        assert not [form for form in shown if form in data], path
    assert pack_rule(cfg) == []
    assert _find_seal(pack) is not None


@pytest.mark.parametrize("forge", [_forge_entry, _forge_tile], ids=["entry", "tile"])
def test_without_a_key_a_forgery_with_recomputed_hashes_passes(made: Any, forge: Any) -> None:
    """The documented limit of the plain seal (docs/packing.md): it is not a signature."""
    pack, cfg = made(keyed=False)
    forge(pack)
    assert pack_rule(cfg) == []
    assert _find_seal(pack) is not None


@pytest.mark.parametrize("forge", [_forge_entry, _forge_tile], ids=["entry", "tile"])
def test_with_a_key_a_forged_entry_or_tile_is_refused(made: Any, forge: Any) -> None:
    pack, cfg = made(keyed=True)
    forge(pack)
    (v,) = pack_rule(cfg)
    assert "its keyed seal (HMAC-SHA256) does not match" in v.rule
    with pytest.raises(ArtifactError, match="keyed seal"):
        _find_seal(pack)


def test_with_a_key_a_stripped_keyed_seal_is_refused(made: Any) -> None:
    pack, cfg = made(keyed=True)
    entries = _entries(pack)
    for entry in entries:
        del entry[KEYED], entry[ENTRY_HMAC]
        entry[ENTRY_SEAL] = entry_digest(entry)
    _write(pack, entries)
    (v,) = pack_rule(cfg)
    assert "a seal key is set" in v.rule and "no keyed seal" in v.rule


def test_a_keyed_pack_without_the_key_says_what_to_set(made: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pack, cfg = made(keyed=True)
    monkeypatch.delenv(KEY_ENV)
    (v,) = pack_rule(cfg)
    assert f"it is sealed with a key (hmac-sha256); set {KEY_ENV} or {KEY_FILE_ENV}" in v.rule
    monkeypatch.setenv(KEY_ENV, KEY.upper())  # another key
    (v,) = pack_rule(cfg)
    assert "another key sealed it" in v.rule


def test_the_key_file_flag_keys_the_pack_and_a_short_key_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from mbridge_seqpack.cli.main import main

    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    data = small_jsonl(tmp_path / "in.jsonl")
    (tmp_path / "short.key").write_text("abc\n")
    out = tmp_path / "o"
    assert (
        main(
            [
                "pack",
                str(data),
                "--pack-size",
                "4096",
                "--output",
                str(out),
                "--seal-key-file",
                str(tmp_path / "short.key"),
            ]
        )
        == 2
    )
    assert "the seal key has 3 bytes; use at least 16" in unwrap(capsys.readouterr().err)
    assert not out.exists()
    (tmp_path / "good.key").write_text(KEY + "\n")
    argv = [
        "pack",
        str(data),
        "--pack-size",
        "4096",
        "--output",
        str(out),
        "--seal-key-file",
        str(tmp_path / "good.key"),
    ]
    assert main(argv) == 0
    (entry,) = _entries(out)
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "good.key"))
    from mbridge_seqpack.artifact.pack_entry import PackEntry
    from mbridge_seqpack.artifact.store import entry_seal_problem

    assert entry[KEYED] == "hmac-sha256" and entry_seal_problem(PackEntry.from_json(entry)) is None
    monkeypatch.setenv(KEY_ENV, KEY)  # the file wins over the variable; the same key either way
    assert entry_seal_problem(PackEntry.from_json(entry)) is None


def _substitute_megatron_bridge_pack(pack: Path) -> None:
    """The #52 attack: the Parquet file replaced by an unsealed one of other tokens, written by Megatron-Bridge's own
    writer (data/packing/parquet.py write_packed_parquet), and the metadata by its three keys only. Write access is
    all it takes; no key is needed."""
    from megatron.bridge.data.packing.parquet import write_packed_parquet

    rows = [{"input_ids": [7] * 64, "loss_mask": [1] * 64, "seq_start_id": [0]} for _ in range(8)]
    write_packed_parquet(rows, pack / SPLIT)
    _write(pack, [{"max_samples_per_bin": 2, "dataset_max_seqlen": 64, "min_packed_seqlen": 64}])


def test_with_a_key_an_unsealed_megatron_bridge_pack_swapped_in_is_refused(
    made: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the key set only packs sealed with it are trained on: the substituted pack is refused at validate()
    with the variable and the command that seals it; without a key it is Megatron-Bridge's own pack and passes."""
    pack, cfg = made(keyed=True)
    _substitute_megatron_bridge_pack(pack)
    assert _find_seal(pack) is None  # it carries no seal at all: nothing for the keyed seal to refuse
    (v,) = pack_rule(cfg)
    assert unwrap(v.rule) == (
        f"{pack / SPLIT}: not sealed, and a seal key is set ({KEY_ENV}/{KEY_FILE_ENV}): only packs sealed with that "
        f"key are trained on; seal it with `{KEY_ENV}=<the key> mbridge-seqpack pack --recipe ... (or "
        "--seal-key-file FILE)`, the same key"
    )
    monkeypatch.delenv(KEY_ENV)
    assert pack_rule(cfg) == []


def test_with_a_key_the_launch_reader_refuses_an_unsealed_file_swapped_in_after_validate(
    made: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file substituted between validate() and the first read: Megatron-Bridge's packed dataset, under the plugin,
    refuses it where a key is set (and reads it as its own pack where none is)."""
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split

    import mbridge_seqpack
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer
    from tests.support.packs import TOKENIZER

    pack, _ = made(keyed=True)
    _substitute_megatron_bridge_pack(pack)

    def read() -> Any:
        dataset = build_gpt_sft_split(
            pack / SPLIT,
            tokenizer=load_megatron_tokenizer(TOKENIZER),
            seq_length=4096,
            memmap_workers=1,
            seed=1,
            packed_sequence_size=4096,
            pad_seq_to_mult=1,
            dataset_kwargs={},
        )
        return dataset[0]

    with mbridge_seqpack.install():
        with pytest.raises(ArtifactError, match=f"not sealed, and a seal key is set \\({KEY_ENV}"):
            read()
        monkeypatch.delenv(KEY_ENV)
        assert read() is not None


def test_an_empty_key_variable_is_no_key(made: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``MBRIDGE_SEQPACK_SEAL_KEY=""`` (a launcher's declared, unset variable) is read as unset: a plainly sealed
    pack passes, a keyed one is refused with the variable to set (not every pack with "0 bytes")."""
    from mbridge_seqpack.artifact.seal_key import seal_key

    monkeypatch.setenv(KEY_ENV, "")
    assert seal_key() is None
    _, cfg = made(keyed=False)
    monkeypatch.setenv(KEY_ENV, "")
    assert pack_rule(cfg) == []
    _, cfg = made(keyed=True)
    monkeypatch.setenv(KEY_ENV, "")
    (v,) = pack_rule(cfg)
    assert f"it is sealed with a key (hmac-sha256); set {KEY_ENV} or {KEY_FILE_ENV}" in v.rule


def test_with_a_key_a_training_split_the_builder_would_prepare_unsealed_is_refused(
    packed_cfg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No pack in Megatron-Bridge's default location: its builder would prepare one at launch, unsealed; with the
    key set that is refused at validate() (without it, the launch prepares it as Megatron-Bridge does)."""
    (tmp_path / "root").mkdir()
    small_jsonl(tmp_path / "root" / "training.jsonl")
    packed_cfg.dataset.dataset_root = str(tmp_path / "root")
    packed_cfg.dataset.do_validation = False
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    monkeypatch.delenv(KEY_ENV, raising=False)
    assert pack_rule(packed_cfg) == []
    monkeypatch.setenv(KEY_ENV, KEY)
    (v,) = pack_rule(packed_cfg)
    assert unwrap(v.rule).startswith(
        "no training pack there: Megatron-Bridge's builder would prepare one, unsealed, and a seal key is set "
        f"({KEY_ENV}/{KEY_FILE_ENV}): only packs sealed with that key are trained on"
    )
    assert v.fix == (
        f"pack it first with this config: {KEY_ENV}=<the key> mbridge-seqpack pack --recipe ... (or --seal-key-file "
        "FILE)"
    )
