"""Megatron-Bridge's JSONL index cut short (a disk that filled up while ``<file>.idx.info`` was written): its
``safe_pickle_load`` raises EOFError when the index is read back. The pack's dataset build turns that into the
user's resource problem (exit 2, naming where), never a plugin bug."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.errors import InputError

ROOT = Path(__file__).resolve().parents[2] / "mbridge_seqpack" / "data"


def test_an_index_cut_short_is_the_disk_not_a_bug(tmp_path: Path, megatron_bridge: Any) -> None:
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer
    from mbridge_seqpack.tokenization.truncation import counting_gpt_sft_split

    source = tmp_path / "data.jsonl"
    source.write_text("".join((ROOT / "sft_sample" / "training.jsonl").read_text().splitlines(keepends=True)[:20]))
    index = tmp_path / "index"
    index.mkdir()
    kwargs: dict[str, Any] = dict(
        tokenizer=load_megatron_tokenizer(ROOT / "tokenizer"),
        seq_length=1024,
        memmap_workers=1,
        seed=1,
        packed_sequence_size=-1,
        dataset_kwargs={"index_mapping_dir": str(index)},
    )
    assert counting_gpt_sft_split(str(source), **kwargs) is not None  # Megatron-Bridge writes its index there
    (info,) = index.rglob("*.idx.info")
    info.write_bytes(b"")  # what a full disk leaves of it
    with pytest.raises(InputError) as raised:
        counting_gpt_sft_split(str(source), **kwargs)
    assert str(raised.value) == (
        f"Megatron-Bridge could not read back the index it wrote for {source} (EOFError: Ran out of input): the "
        f"disk holding {tmp_path} is most likely full; free space there and run again"
    )
