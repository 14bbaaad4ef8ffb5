"""PackedCollator produces exactly Megatron-Bridge's packed collate_fn batch on real packed rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mbridge_seqpack.artifact.collate import PackedCollator
from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
from mbridge_seqpack.recipes.kit import embedded_data_dir, embedded_tokenizer_dir


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    out = {}
    for mult in (1, 4):
        d = tmp_path_factory.mktemp(f"mult{mult}")
        pack_jsonl(
            {"training": embedded_data_dir() / "training.jsonl"},
            tokenizer=embedded_tokenizer_dir(),
            output_dir=d,
            options=PackOptions(pack_size=2048, pad_seq_to_mult=mult),
            overwrite=True,
        )
        out[mult] = d
    return out


@pytest.mark.parametrize("mult", [1, 4])
@pytest.mark.parametrize(
    ("fixed_width", "pad_cu", "answer_only"),
    [(True, True, True), (True, False, True), (False, False, True), (False, False, False)],
)
def test_same_batch_as_megatron_bridge(
    artifacts: dict[int, Path], megatron_bridge: Any, mult: int, fixed_width: bool, pad_cu: bool, answer_only: bool
) -> None:
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.bridge.training.tokenizers.config import TokenizerConfig
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    tok = build_tokenizer(
        TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(embedded_tokenizer_dir()))
    )
    art = artifacts[mult]
    dataset = build_gpt_sft_split(
        art / "training_2048.idx.parquet",
        tokenizer=tok,
        seq_length=2048,
        memmap_workers=1,
        seed=1,
        packed_sequence_size=2048,
        pack_metadata_path=art / "2048_metadata.jsonl",
        pad_cu_seqlens=pad_cu,
        pad_seq_to_mult=mult,
        dataset_kwargs={"pad_to_max_length": fixed_width, "answer_only_loss": answer_only},
    )
    collate = PackedCollator(
        max_seq_length=2048,
        eos_id=tok.eos_id,
        pad_to_max_length=fixed_width,
        pad_seq_to_mult=mult,
        pad_seq_length_to_mult=dataset.pad_seq_length_to_mult,
        answer_only_loss=answer_only,
        pad_cu_seqlens=pad_cu,
        pack_metadata=json.loads((art / "2048_metadata.jsonl").read_text()),
    )
    items = [dataset[i] for i in range(len(dataset))]
    for chunk in (items[:1], items[:3], items[-5:]):
        expected, got = dataset.collate_fn(chunk), collate(chunk)
        assert expected.keys() == got.keys()
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert (value.dtype, value.shape) == (got[key].dtype, got[key].shape), key
                assert torch.equal(value, got[key]), key
            else:
                assert value == got[key], key


def test_collator_argument_errors() -> None:
    with pytest.raises(ValueError, match=r"^pad_cu_seqlens=True needs pack_metadata"):
        PackedCollator(max_seq_length=8, eos_id=0, pad_to_max_length=True, pad_cu_seqlens=True)
    with pytest.raises(ValueError, match=r"^pad_cu_seqlens=True requires pad_to_max_length=True$"):
        PackedCollator(max_seq_length=8, eos_id=0, pad_cu_seqlens=True, pack_metadata=[{}])
