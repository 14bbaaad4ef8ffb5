"""``pack``: JSONL splits -> tokenized sequences -> bins -> one self-describing artifact directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mbridge_seqpack.packing.artifact import (
    Fingerprint,
    build_rows,
    metadata_path,
    split_paths,
    write_metadata,
    write_split,
)
from mbridge_seqpack.packing.packer import pack_lengths, packing_stats
from mbridge_seqpack.packing.sequences import file_sha256, load_tokenizer, tokenize_jsonl, tokenizer_identity

__all__ = ["PackResult", "pack_jsonl"]


@dataclass(frozen=True)
class PackResult:
    """What was written, and how well each split packed."""

    directory: Path
    metadata: Path
    splits: dict[str, dict[str, Any]]


def _split_entry(name: str, seqs: Any, bins: np.ndarray, pack_size: int, fingerprint: Fingerprint) -> dict[str, Any]:
    lengths = seqs.lengths
    stats = packing_stats(lengths, bins, pack_size)
    placed = bins >= 0
    return {
        "split": name,
        # the keys Megatron-Bridge's GPTSFTPackedDataset reads for pad_cu_seqlens
        "dataset_max_seqlen": int(lengths[placed].max()),
        "max_samples_per_bin": stats.max_sequences_per_bin,
        "min_packed_seqlen": stats.min_bin_tokens,
        "pack_size": pack_size,
        "packing_factor": round(int(placed.sum()) / stats.num_bins, 2),
        "packing_efficiency": round(stats.efficiency * 100, 2),
        "num_rows": stats.num_bins,
        "stats": stats.to_dict(),
        "fingerprint": fingerprint.to_dict(),
    }


def pack_jsonl(
    inputs: dict[str, str | Path],
    *,
    tokenizer: str | Path,
    pack_size: int,
    output_dir: str | Path,
    pad_seq_to_mult: int = 1,
    seed: int = 0,
    overflow: str = "error",
    prompt_key: str = "input",
    answer_key: str = "output",
    eos_token: str | None = None,
    progress: bool = False,
) -> PackResult:
    """Pack each split (``{"training": path, "validation": path}``) into ``output_dir``."""
    from mbridge_seqpack import __version__

    if "training" not in inputs:
        raise ValueError("pack needs a training split (inputs['training'])")
    unknown = set(inputs) - {"training", "validation"}
    if unknown:
        raise ValueError(f"unknown split(s) {sorted(unknown)}; use 'training' and 'validation'")
    if not isinstance(pack_size, int) or pack_size < 1:
        raise ValueError(f"pack_size must be a positive integer, got {pack_size!r}")
    if pad_seq_to_mult < 1 or pack_size % pad_seq_to_mult:
        raise ValueError(f"pack_size {pack_size} must be a multiple of pad_seq_to_mult {pad_seq_to_mult}")
    tok, eos_id = load_tokenizer(tokenizer, eos_token)
    tok_sha = tokenizer_identity(tokenizer)
    out = Path(output_dir)
    entries = []
    for split, source in inputs.items():
        if not Path(source).is_file():
            raise ValueError(f"{split} input {source} does not exist")
        fingerprint = Fingerprint(input_sha256=file_sha256(source), tokenizer=str(tokenizer), tokenizer_sha256=tok_sha,
                                  pack_size=pack_size, pad_seq_to_mult=pad_seq_to_mult,
                                  algorithm="best_fit_decreasing", seed=seed, plugin_version=__version__)
        seqs = tokenize_jsonl(source, tok, eos_id, prompt_key=prompt_key, answer_key=answer_key,
                              pad_seq_to_mult=pad_seq_to_mult, progress=progress)
        bins = pack_lengths(seqs.lengths, pack_size, seed=seed, overflow=overflow)  # type: ignore[arg-type]
        entry = _split_entry(split, seqs, bins, pack_size, fingerprint)
        write_split(split_paths(out, pack_size)[split], build_rows(seqs, bins), entry)
        entries.append(entry)
    meta = metadata_path(out, pack_size)
    write_metadata(meta, entries)
    return PackResult(out, meta, {e["split"]: e for e in entries})
