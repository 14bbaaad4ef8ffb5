"""Every byte of a packed Parquet file under a digest: the file cut into tiles, one per row group and one for the
footer, each sealed with its sha256.

A Parquet file is ``PAR1``, its row groups one after another, then the footer (``FileMetaData``, its length,
``PAR1``). Tile ``k`` runs from the first byte of row group ``k`` (tile 0 from byte 0, so it holds the leading
magic) to the first byte of row group ``k + 1``; the last row group's tile ends where the footer starts, and the
footer's tile runs to the end of the file. The tiles cover the file exactly once, so a flip of any bit changes
exactly one tile's digest, and each tile can be verified alone:

- the footer (O(metadata)) at ``validate()``, by content, on rank 0 (a launch never trusts a file's stamp);
- a row group where Megatron-Bridge's packed dataset reads it (packing/verified_parquet.py: the bytes Arrow
  parses are the bytes that were hashed);
- all of them, in one sequential read, on rank 0 while the model is built (packing/content_check.py).

The seal lives in the metadata entry (``checksums.tiles``), which is itself sealed (``entry_sha256``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from mbridge_seqpack.errors import ArtifactError

__all__ = ["Tiles", "CorruptedPackError", "seal_tiles", "tile_bounds", "read_tile", "verify_tiles", "REPACK_HINT"]

REPACK_HINT = "re-run mbridge-seqpack pack (or restore the file from where it was packed)"
_CHUNK = 8 << 20


class CorruptedPackError(ArtifactError):
    """Bytes of a sealed pack that differ from their seal: the file changed or was corrupted after packing."""


def _chunk_start(column: Any) -> int:
    dictionary = column.dictionary_page_offset
    return int(dictionary if dictionary is not None and dictionary > 0 else column.data_page_offset)


def tile_bounds(metadata: Any, size: int) -> list[int]:
    """Offsets of the tiles of a file with Parquet ``metadata`` and ``size`` bytes: ``[0, row group 1, ...,
    footer start, size]``. Refuses a file whose column chunks do not lie inside their row group's tile (not
    written sequentially: nothing ``pack`` writes)."""
    footer_start = size - 8 - int(metadata.serialized_size)
    groups = metadata.num_row_groups
    columns = range(metadata.num_columns)
    starts = [min(_chunk_start(metadata.row_group(g).column(c)) for c in columns) for g in range(groups)]
    bounds = [0, *starts[1:], footer_start, size] if groups else [0, footer_start, size]
    if any(b >= a for a, b in zip(bounds[1:], bounds)):
        raise ArtifactError(f"row groups are not laid out in order ({bounds[:8]}...); cannot seal them one by one")
    for g in range(groups):
        for c in range(metadata.num_columns):
            column = metadata.row_group(g).column(c)
            start = _chunk_start(column)
            if not bounds[g] <= start <= start + int(column.total_compressed_size) <= bounds[g + 1]:
                raise ArtifactError(f"row group {g}: column chunk {c} lies outside its bytes; cannot seal it")
    return bounds


@dataclass(frozen=True)
class Tiles:
    """The seal of one file: tile offsets (``len(digests) + 1``), each tile's sha256, the row group count (the
    tiles before the footer are row groups; an empty file has one tile holding only the leading magic) and the
    rows of each row group (so a message can say which rows a broken tile holds)."""

    offsets: tuple[int, ...]
    digests: tuple[str, ...]
    row_groups: int
    rows: tuple[int, ...]

    KEY = "tiles"

    @property
    def size(self) -> int:
        return self.offsets[-1]

    @property
    def footer(self) -> int:
        """The footer's tile index."""
        return len(self.digests) - 1

    def span(self, tile: int) -> tuple[int, int]:
        return self.offsets[tile], self.offsets[tile + 1]

    def describe(self, tile: int) -> str:
        """What a tile holds, for a message: the row group and its rows, or the footer."""
        if tile == self.footer:
            return "the Parquet footer (schema, row-group index)"
        if tile >= self.row_groups:
            return "the file header"
        first = sum(self.rows[:tile])
        return f"row group {tile} (rows {first}..{first + self.rows[tile] - 1})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "offsets": list(self.offsets),
            "sha256": list(self.digests),
            "row_groups": self.row_groups,
            "rows": list(self.rows),
        }

    @classmethod
    def of_checksums(cls, checksums: Any) -> Tiles | None:
        """The tiles recorded in a metadata entry's ``checksums``; None for a pack sealed before tiles existed
        (one sha256 for the whole file only). A malformed record raises."""
        raw = checksums.get(cls.KEY) if isinstance(checksums, dict) else None
        if raw is None:
            return None
        try:
            tiles = cls(
                tuple(int(o) for o in raw["offsets"]),
                tuple(str(d) for d in raw["sha256"]),
                int(raw["row_groups"]),
                tuple(int(r) for r in raw["rows"]),
            )
        except (KeyError, TypeError, ValueError):
            raise ArtifactError(f"malformed tile seal in the metadata; {REPACK_HINT}") from None
        if len(tiles.offsets) != len(tiles.digests) + 1 or len(tiles.rows) != tiles.row_groups or tiles.offsets[0]:
            raise ArtifactError(f"malformed tile seal in the metadata; {REPACK_HINT}")
        return tiles


def seal_tiles(path: str | Path) -> tuple[str, Tiles]:
    """(whole-file sha256, tiles) of a written file, in one sequential read."""
    import pyarrow.parquet as pq

    path = Path(path)
    size = path.stat().st_size
    metadata = pq.read_metadata(str(path))
    bounds = tile_bounds(metadata, size)
    whole = hashlib.sha256()
    digests = []
    with open(path, "rb") as handle:
        for start, end in zip(bounds, bounds[1:]):
            tile = hashlib.sha256()
            for block in _blocks(handle, start, end):
                whole.update(block)
                tile.update(block)
            digests.append(tile.hexdigest())
    rows = tuple(metadata.row_group(g).num_rows for g in range(metadata.num_row_groups))
    return whole.hexdigest(), Tiles(tuple(bounds), tuple(digests), metadata.num_row_groups, rows)


def _blocks(handle: Any, start: int, end: int) -> Iterator[bytes]:
    handle.seek(start)
    remaining = end - start
    while remaining:
        block = handle.read(min(remaining, _CHUNK))
        if not block:
            raise CorruptedPackError(f"{getattr(handle, 'name', 'file')}: ends early (truncated); {REPACK_HINT}")
        remaining -= len(block)
        yield block


def _mismatch(path: str | Path, tiles: Tiles, tile: int) -> CorruptedPackError:
    return CorruptedPackError(
        f"{path}: {tiles.describe(tile)} differs from its seal (sha256 of bytes {tiles.offsets[tile]}.."
        f"{tiles.offsets[tile + 1] - 1}): the file was modified or corrupted after packing; {REPACK_HINT}"
    )


def read_tile(fd: int, path: str | Path, tiles: Tiles, tile: int) -> bytes:
    """Tile ``tile`` of the open file ``fd``, read once and returned only if it matches its seal."""
    start, end = tiles.span(tile)
    data = os.pread(fd, end - start, start)
    if len(data) != end - start:
        raise CorruptedPackError(f"{path}: ends before byte {end} (truncated); {REPACK_HINT}")
    if hashlib.sha256(data).hexdigest() != tiles.digests[tile]:
        raise _mismatch(path, tiles, tile)
    return data


def verify_tiles(path: str | Path, tiles: Tiles, progress: Any = None) -> None:
    """Read the whole file once and compare every tile with its seal (raises :class:`CorruptedPackError` naming
    the first tile that differs); ``progress(bytes)`` is called as the bytes go by."""
    size = os.stat(path).st_size
    if size != tiles.size:
        raise CorruptedPackError(
            f"{path}: {size} bytes, the seal says {tiles.size}: truncated or modified; {REPACK_HINT}"
        )
    with open(path, "rb") as handle:
        for tile in range(len(tiles.digests)):
            digest = hashlib.sha256()
            for block in _blocks(handle, *tiles.span(tile)):
                digest.update(block)
                if progress is not None:
                    progress(len(block))
            if digest.hexdigest() != tiles.digests[tile]:
                raise _mismatch(path, tiles, tile)
