"""The seal of a packed artifact: which files and metadata a packed path names, and whether a sealed file is the
one its metadata describes (size, sha256, fingerprint, entry seal, footer), checked before any byte is parsed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from mbridge_seqpack.artifact.pack_entry import PackEntry
from mbridge_seqpack.artifact.row_group_seal import CorruptedPackError, Tiles, read_tile
from mbridge_seqpack.artifact.store import ArtifactError, entry_seal_problem, split_paths
from mbridge_seqpack.digests import note_read, verified_sha256

__all__ = [
    "REPACK",
    "SPLIT_NAMES",
    "resolve_files",
    "find_metadata",
    "entry_for",
    "lost_fingerprint_problem",
    "seal_problems",
]

REPACK = "re-run mbridge-seqpack pack"
SPLIT_NAMES = ("training", "validation", "test")


def resolve_files(target: str | Path) -> list[Path]:
    """The Parquet files a packed path names: a file, or every ``*.parquet``/``*.pq`` of a directory (as
    Megatron-Bridge's packed dataset resolves a directory)."""
    path = Path(target)
    if path.is_dir():
        files = sorted({*path.glob("*.parquet"), *path.glob("*.pq")})
        if not files:
            raise ArtifactError(f"{target}: no .parquet files in this directory; pass a pack directory")
        return files
    if not path.is_file():
        raise ArtifactError(f"{target}: no such file or directory")
    return [path]


def find_metadata(directory: Path) -> tuple[Path | None, list[PackEntry] | None, str | None]:
    """(path, entries, problem) of the ``<N>_metadata.jsonl`` in ``directory``."""
    note_read(directory)  # a verdict on the folder depends on what it holds (hook.py keys its cache on it)
    metas = sorted(directory.glob("*_metadata.jsonl"))
    for meta in metas:
        note_read(meta)
    if not metas:
        return None, None, None
    if len(metas) > 1:
        return None, None, f"{len(metas)} metadata files ({', '.join(m.name for m in metas)}): packs are mixed"
    try:
        entries = json.loads(metas[0].read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return metas[0], None, f"{metas[0].name}: unreadable metadata ({exc})"
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return metas[0], None, f"{metas[0].name}: metadata must be a JSON list of objects"
    return metas[0], [PackEntry.from_json(entry) for entry in entries], None


def entry_for(entries: list[PackEntry] | None, info: dict[str, Any]) -> PackEntry | None:
    """The metadata entry of the split a sealed file says it holds."""
    return next((e for e in reversed(entries or []) if e.split == info.get("split")), None)  # last wins


def lost_fingerprint_problem(path: Path, meta: Path | None, entries: list[PackEntry] | None) -> str | None:
    """A file without a fingerprint where the metadata beside it seals a file of that very name: its footer was
    damaged (a byte flip in the fingerprint's key), not written by another tool, so it must not pass as unsealed."""
    for entry in entries or []:
        if not entry.sealed:
            continue
        try:
            sealed = split_paths(path.parent, int(entry.pack_size)).get(str(entry.split))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if sealed is not None and sealed.name == path.name:
            return (
                f"no mbridge_seqpack fingerprint, but {meta.name if meta else 'the metadata'} seals this file: "
                f"it was modified or corrupted - {REPACK}"
            )
    return None


def seal_problems(
    path: Path,
    info: dict[str, Any],
    entry: PackEntry | None,
    meta: Path | None,
    *,
    contents: Literal["verify", "footer", "size"] = "verify",
) -> list[str]:
    """Compare one sealed file with its metadata entry before parsing it: its size always; then its sha256 read
    now (``verify``: every byte), or its footer's tile read now (``footer``, O(metadata): what ``validate()``
    does; the row groups are left to the launch's content check, artifact/content_check.py)."""
    if meta is None:
        return [f"no <N>_metadata.jsonl next to it: the pack is incomplete (interrupted?) - {REPACK}"]
    if entry is None:
        return [f"its split {info.get('split')!r} is not in {meta.name}: stale or mixed files - {REPACK}"]
    if entry.fingerprint != info.get("fingerprint"):
        return [f"fingerprint differs from {meta.name}: the files come from different pack runs - {REPACK}"]
    sealed = entry_seal_problem(entry)
    if sealed == "edited or is unsealed":
        return [
            f"its entry in {meta.name} was edited or is unsealed (Megatron-Bridge sizes cu_seqlens from "
            f"max_samples_per_bin / dataset_max_seqlen / min_packed_seqlen there) - {REPACK}"
        ]
    if sealed is not None:
        return [f"its entry in {meta.name}: {sealed} - {REPACK}"]
    named = path.name.split("_")[0]
    if named in SPLIT_NAMES and named != info.get("split"):  # a renamed file is fine, a swapped one is not
        return [
            f"the file is named for another split than the {info.get('split')!r} rows it holds (swapped?) - {REPACK}"
        ]
    sums = entry.checksums or {}
    if not isinstance(sums, dict) or "file_sha256" not in sums:
        return [f"{meta.name} has no checksums for it - {REPACK}"]
    size = path.stat().st_size
    if size != sums.get("file_bytes"):
        return [f"file is {size} bytes, the seal says {sums.get('file_bytes')}: truncated or modified - {REPACK}"]
    if contents == "verify" and verified_sha256(path, sums["file_sha256"]) != sums["file_sha256"]:
        return [f"sha256 differs from the seal: the file was modified or corrupted - {REPACK}"]
    if contents == "footer":
        return _footer_problems(path, sums)
    return []


def _footer_problems(path: Path, sums: dict[str, Any]) -> list[str]:
    """The footer's tile against its seal (a pack sealed before tiles has none to compare)."""
    import os

    try:
        tiles = Tiles.of_checksums(sums)
        if tiles is None:
            return []
        fd = os.open(path, os.O_RDONLY)
        try:
            read_tile(fd, path, tiles, tiles.footer)
        finally:
            os.close(fd)
    except CorruptedPackError:
        return [f"its Parquet footer differs from the seal: the file was modified or corrupted - {REPACK}"]
    except ArtifactError as exc:
        return [str(exc)]
    return []
