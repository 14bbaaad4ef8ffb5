"""The tile seal (#35) on its own, without Megatron-Bridge: the tiles cover every byte of a Parquet file exactly once,
a flip of any single byte of a small file is caught by the tile that holds it (exhaustively), and the verified
reader returns what pyarrow reads from the file, parsing only bytes that matched their seal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mbridge_seqpack.artifact.row_group_seal import CorruptedPackError, Tiles, read_tile, seal_tiles, verify_tiles
from mbridge_seqpack.artifact.verified_parquet import VerifiedParquetFile
from mbridge_seqpack.errors import ArtifactError


def _file(path: Path, groups: int = 4, rows: int = 3) -> Path:
    rng = np.random.default_rng(0)
    writer = None
    for _ in range(groups):
        offsets = np.arange(0, rows * 16 + 1, 16, dtype=np.int64)
        table = pa.table(
            {
                "input_ids": pa.LargeListArray.from_arrays(
                    pa.array(offsets), pa.array(rng.integers(0, 999, rows * 16))
                ),
                "loss_mask": pa.LargeListArray.from_arrays(
                    pa.array(offsets), pa.array(rng.integers(0, 2, rows * 16), type=pa.int8())
                ),
                "seq_start_id": pa.LargeListArray.from_arrays(
                    pa.array(np.arange(rows + 1, dtype=np.int64)), pa.array(np.zeros(rows, dtype=np.int64))
                ),
            }
        )
        writer = writer or pq.ParquetWriter(str(path), table.schema)
        writer.write_table(table, row_group_size=rows)
    writer.close()
    return path


def test_the_tiles_cover_every_byte_exactly_once(tmp_path: Path) -> None:
    path = _file(tmp_path / "f.parquet")
    whole, tiles = seal_tiles(path)
    metadata = pq.read_metadata(str(path))
    assert tiles.row_groups == metadata.num_row_groups == 4 and tiles.rows == (3, 3, 3, 3)
    assert tiles.offsets[0] == 0 and tiles.offsets[-1] == path.stat().st_size
    assert all(a < b for a, b in zip(tiles.offsets, tiles.offsets[1:]))  # contiguous, none empty
    assert tiles.offsets[-2] == path.stat().st_size - 8 - metadata.serialized_size  # the last tile is the footer
    assert Tiles.of_checksums({"tiles": json.loads(json.dumps(tiles.to_dict()))}) == tiles
    verify_tiles(path, tiles)
    assert tiles.describe(2) == "row group 2 (rows 6..8)" and "footer" in tiles.describe(tiles.footer)


def test_every_single_byte_flip_is_caught_by_its_tile(tmp_path: Path) -> None:
    path = _file(tmp_path / "f.parquet", groups=2)
    _, tiles = seal_tiles(path)
    good = path.read_bytes()
    for offset in range(len(good)):
        data = bytearray(good)
        data[offset] ^= 0x01 << (offset % 8)
        path.write_bytes(bytes(data))
        holder = next(t for t in range(len(tiles.digests)) if tiles.offsets[t] <= offset < tiles.offsets[t + 1])
        with pytest.raises(CorruptedPackError, match=tiles.describe(holder).split(" (")[0]):
            verify_tiles(path, tiles)
    path.write_bytes(good)


def test_the_verified_reader_reads_what_pyarrow_reads_and_nothing_unsealed(tmp_path: Path) -> None:
    path = _file(tmp_path / "f.parquet")
    _, tiles = seal_tiles(path)
    verified, plain = VerifiedParquetFile(path, tiles), pq.ParquetFile(str(path))
    for group in (3, 0, 2, 1, 3):
        for columns in (None, ["input_ids", "seq_start_id", "loss_mask"]):
            assert verified.read_row_group(group, columns=columns).equals(plain.read_row_group(group, columns=columns))
    assert verified.row_group_offsets() == [0, 3, 6, 9, 12]
    data = bytearray(path.read_bytes())
    data[tiles.offsets[2] + 10] ^= 0x40  # row group 2, after the reader was opened
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptedPackError, match=r"row group 2 \(rows 6..8\) differs from its seal"):
        verified.read_row_group(2)
    assert verified.read_row_group(1).equals(plain.read_row_group(1))  # the others still read
    verified.close()
    data[tiles.offsets[-2] + 5] ^= 0x01  # the footer: refused when the file is opened
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptedPackError, match="the Parquet footer"):
        VerifiedParquetFile(path, tiles)
    path.write_bytes(bytes(data[:-1]))
    with pytest.raises(CorruptedPackError, match="truncated or modified"):
        VerifiedParquetFile(path, tiles)
    with open(path, "rb") as handle, pytest.raises(CorruptedPackError, match="truncated"):
        read_tile(handle.fileno(), path, tiles, tiles.footer)


def test_a_malformed_tile_record_is_refused() -> None:
    assert Tiles.of_checksums({"file_sha256": "0" * 64}) is None  # sealed before tiles: one digest per file
    for bad in ({"offsets": [0, 5]}, {"offsets": [0, 5], "sha256": ["a", "b"], "row_groups": 1, "rows": [1]}):
        with pytest.raises(ArtifactError, match="malformed tile seal"):
            Tiles.of_checksums({"tiles": bad})
