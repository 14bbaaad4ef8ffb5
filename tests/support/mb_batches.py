"""Megatron-Bridge's own packed batches for tests: the embedded corpus packed at 2048, read back through
Megatron-Bridge's ``build_gpt_sft_split`` and its ``collate_fn`` (what its data loader yields to the step)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir

PACK = 2048


def mb_packed_collate_batches(
    directory: Path, *, pad_seq_to_mult: int = 1, pad_cu_seqlens: bool = True, rows: int = 6, micro_batch: int = 1
) -> tuple[list[dict[str, Any]], Path]:
    """(collated micro batches of ``micro_batch`` rows over the first ``rows`` rows, the pack's metadata path)."""
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.bridge.training.tokenizers.config import TokenizerConfig
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    pack_jsonl(
        {"training": embedded_data_dir() / "training.jsonl"},
        tokenizer=embedded_tokenizer_dir(),
        output_dir=directory,
        options=PackOptions(pack_size=PACK, pad_seq_to_mult=pad_seq_to_mult),
        overwrite=True,
    )
    tokenizer = build_tokenizer(
        TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(embedded_tokenizer_dir()))
    )
    meta = directory / f"{PACK}_metadata.jsonl"
    dataset = build_gpt_sft_split(
        directory / f"training_{PACK}.idx.parquet",
        tokenizer=tokenizer,
        seq_length=PACK,
        memmap_workers=1,
        seed=1,
        packed_sequence_size=PACK,
        pack_metadata_path=meta,
        pad_cu_seqlens=pad_cu_seqlens,
        pad_seq_to_mult=pad_seq_to_mult,
        dataset_kwargs={"pad_to_max_length": True},
    )
    count = min(rows, len(dataset)) // micro_batch * micro_batch
    return [
        dataset.collate_fn([dataset[i + j] for j in range(micro_batch)]) for i in range(0, count, micro_batch)
    ], meta
