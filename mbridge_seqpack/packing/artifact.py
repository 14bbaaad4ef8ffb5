"""Packed artifacts Megatron-Bridge reads unchanged, that describe themselves and refuse staleness.

Layout of one artifact directory (Megatron-Bridge's names, so ``packed_*_path`` point straight at it)::

    training_<N>.idx.parquet     input_ids / loss_mask / seq_start_id (+ sequence_index, sequence_length)
    validation_<N>.idx.parquet   optional
    <N>_metadata.jsonl           JSON list, one entry per split: max_samples_per_bin, dataset_max_seqlen,
                                 min_packed_seqlen, ... and the fingerprint

The fingerprint (input hash, tokenizer hash, pack size, pad_seq_to_mult, algorithm, seed, plugin
version) is stored in the metadata and in each Parquet file's schema metadata. Files are written to a
temporary name and renamed; the metadata file is renamed last, so a directory without it is not a
complete artifact.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mbridge_seqpack.packing.sequences import TokenizedSequences

__all__ = ["Fingerprint", "FINGERPRINT_KEY", "ArtifactError", "build_rows", "write_split", "write_metadata",
           "read_parquet_fingerprint", "split_paths", "metadata_path"]

FINGERPRINT_KEY = b"mbridge_seqpack"
FORMAT = "mbridge_seqpack.packed/1"


class ArtifactError(ValueError):
    """A packed artifact that is missing, incomplete, corrupted or stale."""


@dataclass(frozen=True)
class Fingerprint:
    """Every input that changes the packed rows."""

    input_sha256: str
    tokenizer: str
    tokenizer_sha256: str
    pack_size: int
    pad_seq_to_mult: int
    algorithm: str
    seed: int
    plugin_version: str
    format: str = FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def split_paths(directory: str | Path, pack_size: int) -> dict[str, Path]:
    """Megatron-Bridge's file names for the packed splits."""
    d = Path(directory)
    return {"training": d / f"training_{pack_size}.idx.parquet", "validation": d / f"validation_{pack_size}.idx.parquet"}


def metadata_path(directory: str | Path, pack_size: int) -> Path:
    """Megatron-Bridge's metadata file name (JSON despite the ``.jsonl`` suffix)."""
    return Path(directory) / f"{pack_size}_metadata.jsonl"


def _atomic_write(path: Path, write: Any) -> None:
    """``write(tmp_path)`` then fsync + rename over ``path``; on any failure the temp file is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; artifacts are shared like any output
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_rows(seqs: TokenizedSequences, bins: np.ndarray) -> dict[str, Any]:
    """Arrow columns for the packed rows: sequences of one bin in input order, bins in id order."""
    import pyarrow as pa

    placed = np.flatnonzero(bins >= 0)
    order = placed[np.lexsort((placed, bins[placed]))]  # by bin, then input index
    row_of = bins[order]
    num_rows = int(row_of.max()) + 1 if order.size else 0
    sizes = np.diff(seqs.offsets)[order]
    # gather token/mask ranges in `order` with one vectorised index
    starts = seqs.offsets[:-1][order]
    seg_offsets = np.zeros(order.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=seg_offsets[1:])
    index = np.repeat(starts - seg_offsets[:-1], sizes) + np.arange(seg_offsets[-1], dtype=np.int64)
    tokens = seqs.tokens[index]
    mask = seqs.loss_mask[index]
    # stored loss mask is label-aligned: position j trains the prediction of token j+1 (Megatron-Bridge's shift)
    shifted = np.zeros_like(mask)
    shifted[:-1] = mask[1:]
    shifted[seg_offsets[1:] - 1] = 0  # last position of each sequence predicts nothing inside it
    per_row_seqs = np.bincount(row_of, minlength=num_rows)
    row_seq_offsets = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(per_row_seqs, out=row_seq_offsets[1:])
    row_token_offsets = seg_offsets[row_seq_offsets]
    seq_start = seg_offsets[:-1] - np.repeat(row_token_offsets[:-1], per_row_seqs)

    def lists(values: np.ndarray, offsets: np.ndarray, kind: Any) -> Any:
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=kind))

    return {
        "input_ids": lists(tokens.astype(np.int32), row_token_offsets, pa.int32()),
        "loss_mask": lists(shifted.astype(np.int8), row_token_offsets, pa.int8()),
        "seq_start_id": lists(seq_start.astype(np.int32), row_seq_offsets, pa.int32()),
        "sequence_index": lists(order.astype(np.int64), row_seq_offsets, pa.int64()),
        "sequence_length": lists(seqs.original_tokens[order].astype(np.int32), row_seq_offsets, pa.int32()),
    }


def write_split(path: Path, columns: dict[str, Any], info: dict[str, Any], row_group_size: int = 500) -> None:
    """Write one packed split atomically, with ``info`` (fingerprint + stats) in the schema metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(columns).replace_schema_metadata({FINGERPRINT_KEY: json.dumps(info, sort_keys=True).encode()})
    _atomic_write(path, lambda tmp: pq.write_table(table, str(tmp), row_group_size=row_group_size))


def write_metadata(path: Path, entries: list[dict[str, Any]]) -> None:
    """Write the metadata JSON list atomically (the artifact's commit point)."""
    _atomic_write(path, lambda tmp: tmp.write_text(json.dumps(entries, indent=1, sort_keys=True)))


def read_parquet_fingerprint(path: str | Path) -> dict[str, Any] | None:
    """The ``info`` this plugin stored in a packed Parquet file, or None for a foreign file."""
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(str(path))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: not a readable Parquet file ({exc}); re-run mbridge-seqpack pack") from None
    raw = (schema.metadata or {}).get(FINGERPRINT_KEY)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        raise ArtifactError(f"{path}: corrupted mbridge_seqpack fingerprint; re-run mbridge-seqpack pack") from None
