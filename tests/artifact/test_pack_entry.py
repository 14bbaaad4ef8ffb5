"""The typed metadata entry (artifact/pack_entry.py): a file Megatron-Bridge's own prep writes and a file this
plugin's pack writes both read into ``PackEntry`` and re-serialize to their own bytes; keys neither writes and
present nulls survive, so the entry's seal still holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.artifact.pack_entry import MEGATRON_BRIDGE_KEYS, PackEntry
from mbridge_seqpack.artifact.store import ENTRY_SEAL, entry_digest, entry_seal_problem
from mbridge_seqpack.errors import ArtifactError
from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir


def _small_jsonl(path: Path, first: int, n: int = 40) -> Path:
    lines = (embedded_data_dir() / "training.jsonl").read_text().splitlines()[first : first + n]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_megatron_bridges_own_metadata_round_trips_byte_for_byte(tmp_path: Path, megatron_bridge: Any) -> None:
    """Two splits prepared by ``prepare_gpt_sft_packed_data`` into one file (it appends its entry to the list there,
    data/packing/offline.py), written with its ``json.dump``."""
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.bridge.data.packing.offline import prepare_gpt_sft_packed_data

    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    meta = tmp_path / "2048_metadata.jsonl"
    tokenizer = load_megatron_tokenizer(embedded_tokenizer_dir())
    for split, first in (("training", 0), ("validation", 40)):
        prepare_gpt_sft_packed_data(
            input_path=_small_jsonl(tmp_path / f"{split}.jsonl", first),
            output_path=tmp_path / f"{split}_2048.idx.parquet",
            output_metadata_path=meta,
            packed_sequence_size=2048,
            tokenizer=tokenizer,
            max_seq_length=2048,
            seed=0,
            dataset_kwargs={"index_mapping_dir": str(tmp_path / "index")},
            pad_seq_to_mult=1,
            num_tokenizer_workers=1,
            dataset_builder=build_gpt_sft_split,
        )
    text = meta.read_text()
    entries = [PackEntry.from_json(e) for e in json.loads(text)]
    assert json.dumps([e.to_json() for e in entries]) == text  # json.dump's own separators, keys in its order
    for raw, entry in zip(json.loads(text), entries):
        assert tuple(raw) == MEGATRON_BRIDGE_KEYS == entry.keys  # the six keys, in create_packing_strategy's order
        assert entry.extra == {} and not entry.sealed and entry.split is None
        assert isinstance(entry.max_samples_per_bin, int) and entry.max_samples_per_bin >= 1
        assert entry.pack_size == 2048 and 0 < entry.min_packed_seqlen <= 2048
        assert 0 < entry.dataset_max_seqlen <= 2048 and isinstance(entry.packing_efficiency, float)


def test_the_packs_own_metadata_round_trips_with_every_key_typed(tmp_path: Path, megatron_bridge: Any) -> None:
    from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl

    source = _small_jsonl(tmp_path / "train.jsonl", 0)
    result = pack_jsonl(
        {"training": source, "validation": source},
        tokenizer=embedded_tokenizer_dir(),
        output_dir=tmp_path / "packed",
        options=PackOptions(pack_size=2048, data_parallel=2),
    )
    text = result.metadata.read_text()
    entries = [PackEntry.from_json(e) for e in json.loads(text)]
    assert json.dumps([e.to_json() for e in entries], indent=1, sort_keys=True) == text
    for entry in entries:
        assert entry.extra == {}, "a key the pack writes has no field of its own"
        assert entry_seal_problem(entry) is None and entry.sealed
        assert set(MEGATRON_BRIDGE_KEYS) <= set(entry.keys)
    # what pack_jsonl returns is what it sealed, less the seals
    returned = {name: e.to_json() for name, e in result.splits.items()}
    for entry in entries:
        sealed = {k: v for k, v in entry.to_json().items() if k != ENTRY_SEAL}
        assert returned[str(entry.split)] == sealed
    assert entries[0].balance is not None and entries[1].balance is None  # only the training rows are balanced


def test_unknown_keys_and_nulls_survive_in_their_place() -> None:
    raw = {"zeta": [1, 2], "max_samples_per_bin": 3, "balance": None, "extra": "x", "keys": 7, "split": "training"}
    entry = PackEntry.from_json(raw)
    assert list(entry.to_json().items()) == list(raw.items())
    assert entry.extra == {"zeta": [1, 2], "extra": "x", "keys": 7}
    assert (entry.max_samples_per_bin, entry.balance, entry.split) == (3, None, "training")


def test_the_seal_covers_keys_this_version_does_not_know() -> None:
    """Why unknown keys are kept: a sealed entry with one still passes its seal once read and written back, and an
    edit of that key is still caught."""
    raw = {"split": "training", "max_samples_per_bin": 3, "from_a_later_version": {"a": 1}}
    raw[ENTRY_SEAL] = entry_digest(raw)
    assert entry_seal_problem(PackEntry.from_json(raw)) is None
    edited = {**raw, "from_a_later_version": {"a": 2}}
    assert entry_seal_problem(PackEntry.from_json(edited)) == "edited or is unsealed"


def test_fields_set_in_code_follow_the_keys_read() -> None:
    from dataclasses import replace

    entry = replace(PackEntry.from_json({"split": "training", "zeta": 1}), checksums={"file_bytes": 1}, num_rows=2)
    assert list(entry.to_json()) == ["split", "zeta", "num_rows", "checksums"]
    assert PackEntry(pack_size=8).to_json() == {"pack_size": 8}


@pytest.mark.parametrize("data", [[1], "entry", 3, None])
def test_an_entry_that_is_not_an_object_is_refused(data: Any) -> None:
    with pytest.raises(ArtifactError, match=f"^a metadata entry must be a JSON object, got {type(data).__name__}$"):
        PackEntry.from_json(data)
