"""Reading a sealed pack so that Arrow parses only bytes that matched the seal.

Megatron-Bridge's ``GPTSFTPackedParquetDataset`` opens each file once per process (``_ensure_reader``) and reads
a whole row group whenever a row of another group is asked for (``pf.read_row_group``). A
:class:`VerifiedParquetFile` stands in for that ``pyarrow.parquet.ParquetFile``: the footer is read and checked
against its tile when the file is opened, and every ``read_row_group`` reads the group's tile once (one
``pread``), compares its sha256 with the seal and hands Arrow exactly those bytes (a file object that serves the
verified tile and zeros elsewhere; the footer is already parsed). Bytes that change on disk after the check are
never the ones parsed, and a tile that differs raises :class:`CorruptedPackError` before any of its rows reach a
batch. The cost is one sha256 of the compressed row group per read: ~1 ms per MB against Arrow's ~5-10 ms per MB
of decoding (``scripts/bench_verified_reads.py``).

:func:`find_seal` finds the seal of a file: the entry of ``<N>_metadata.jsonl`` beside it that names it.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from mbridge_seqpack.artifact.pack_entry import PackEntry
from mbridge_seqpack.artifact.row_group_seal import REPACK_HINT, CorruptedPackError, Tiles, read_tile
from mbridge_seqpack.artifact.seal import entry_for, find_metadata
from mbridge_seqpack.artifact.store import entry_seal_problem, read_parquet_fingerprint, split_paths
from mbridge_seqpack.errors import ArtifactError

__all__ = ["VerifiedParquetFile", "find_seal", "Seal"]

MAGIC = b"PAR1"


class Seal:
    """The sealed entry of one file and its tiles (None for a pack sealed with one sha256 per file)."""

    def __init__(self, path: Path, entry: PackEntry, tiles: Tiles | None) -> None:
        self.path, self.entry, self.tiles = path, entry, tiles

    @property
    def file_sha256(self) -> str:
        return str((self.entry.checksums or {})["file_sha256"])

    @property
    def file_bytes(self) -> int:
        return int((self.entry.checksums or {})["file_bytes"])


def _named_entry(path: Path, entries: list[PackEntry]) -> PackEntry | None:
    """The entry whose split file has this file's name (what ``pack`` wrote), without reading the file."""
    for entry in reversed(entries):
        try:
            named = split_paths(path.parent, int(entry.pack_size)).get(str(entry.split))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if named is not None and named.name == path.name and entry.sealed:
            return entry
    return None


def find_seal(path: str | Path) -> Seal | None:
    """The seal of a packed file, or None for a file nothing seals (Megatron-Bridge's own prep). A broken seal
    (metadata unreadable, edited or missing for a sealed file) raises :class:`ArtifactError`."""
    path = Path(path)
    meta, entries, problem = find_metadata(path.parent)
    if problem:
        raise ArtifactError(f"{path}: {problem}; {REPACK_HINT}")
    entry = _named_entry(path, entries or [])
    if entry is None:
        info = read_parquet_fingerprint(path)  # a renamed file: the split it says it holds (checked with the tile)
        if info is None:
            return None
        entry = entry_for(entries, info)
        if entry is None or meta is None:
            raise ArtifactError(f"{path}: sealed, but no metadata entry beside it describes it; {REPACK_HINT}")
    sealed = entry_seal_problem(entry)
    if sealed is not None:
        where = meta.name if meta else "the metadata"
        said = "was edited" if sealed == "edited or is unsealed" else f"fails its seal: {sealed}"
        raise ArtifactError(f"{path}: its entry in {where} {said}; {REPACK_HINT}")
    checksums = entry.checksums
    if not isinstance(checksums, dict) or "file_sha256" not in checksums:
        raise ArtifactError(f"{path}: the metadata has no checksums for it; {REPACK_HINT}")
    return Seal(path, entry, Tiles.of_checksums(checksums))


class _TileSource(io.RawIOBase):
    """A read-only file of ``size`` bytes holding one verified tile at ``start`` and zeros elsewhere: everything
    Arrow reads comes from memory that was hashed (it reads only the group's column chunks, which the verified
    footer places inside the tile). :meth:`load` swaps the tile for the next read."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size, self._start, self._data, self._pos = size, 0, b"", 0

    def load(self, start: int, data: bytes) -> None:
        self._start, self._data = start, data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        lo, hi = self._start, self._start + len(self._data)
        if (self._pos, end) == (lo, hi):  # Arrow's usual request (the group's column chunks): the tile itself
            out = self._data
        elif lo <= self._pos and end <= hi:
            out = self._data[self._pos - lo : end - lo]
        else:
            buffer = bytearray(max(0, end - self._pos))
            a, b = max(self._pos, lo), min(end, hi)
            if a < b:
                buffer[a - self._pos : b - self._pos] = self._data[a - lo : b - lo]
            out = bytes(buffer)
        self._pos = end
        return out

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class VerifiedParquetFile:
    """What ``GPTSFTPackedParquetDataset`` uses of a ``ParquetFile`` (``read_row_group``, ``metadata``,
    ``close``), reading only verified bytes."""

    def __init__(self, path: str | Path, tiles: Tiles) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path, self.tiles = str(path), tiles
        self._fd = os.open(self.path, os.O_RDONLY)
        try:
            size = os.fstat(self._fd).st_size
            if size != tiles.size:
                raise CorruptedPackError(
                    f"{path}: {size} bytes, the seal says {tiles.size}: truncated or modified; {REPACK_HINT}"
                )
            footer = read_tile(self._fd, self.path, tiles, tiles.footer)
            self.metadata = pq.read_metadata(pa.BufferReader(MAGIC + footer))
        except BaseException:
            os.close(self._fd)
            raise
        self.schema_arrow = self.metadata.schema.to_arrow_schema()
        # one reader over a source that holds only the tile just verified (the footer is parsed already: a reader
        # made per read would parse it again, milliseconds for thousands of row groups)
        self._source = _TileSource(tiles.size)
        self._reader = pq.ParquetFile(pa.PythonFile(self._source, mode="r"), metadata=self.metadata, pre_buffer=True)

    @property
    def num_row_groups(self) -> int:
        return self.metadata.num_row_groups

    def row_group_offsets(self) -> list[int]:
        """Cumulative rows at each row group (Megatron-Bridge's ``_file_row_group_offsets`` of this file)."""
        offsets = [0]
        for rows in self.tiles.rows:
            offsets.append(offsets[-1] + rows)
        return offsets

    def read_row_group(self, i: int, columns: list[str] | None = None, **kwargs: Any) -> Any:
        """Row group ``i``, parsed from its tile after the tile matched its seal."""
        if not 0 <= i < self.tiles.row_groups:
            raise IndexError(f"{self.path}: row group {i} of {self.tiles.row_groups}")
        self._source.load(self.tiles.offsets[i], read_tile(self._fd, self.path, self.tiles, i))
        try:
            return self._reader.read_row_group(i, columns=columns, **kwargs)
        finally:
            self._source.load(0, b"")  # nothing of it is kept past the read

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except (OSError, AttributeError):
            pass
