"""Parquet parts joined into one file: the very bytes one writer gives, checked against pyarrow's own writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mbridge_seqpack.artifact.parquet_stitch import ArtifactError, encode_footer, read_footer, stitch_parquet
from mbridge_seqpack.artifact.store import (
    ColumnDigests,
    RowSources,
    row_group_bounds,
    sealed_checksums,
    write_row_groups,
    write_split,
)
from mbridge_seqpack.placement.packer import pack_lengths
from mbridge_seqpack.tokenization.sequences import TokenizedSequences


def _table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 40, rows))]).astype(np.int64)
    values = rng.integers(0, 1 << 40, int(offsets[-1]), dtype=np.int64)
    column = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    mask = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values % 2, type=pa.int8()))
    return pa.table({"input_ids": column, "loss_mask": mask}).replace_schema_metadata({b"k": b"v"})


def _write(path: Path, table: pa.Table, groups: list[tuple[int, int]]) -> None:
    with pq.ParquetWriter(str(path), table.schema) as writer:
        for first, end in groups:
            writer.write_table(table.slice(first, end - first), row_group_size=max(end - first, 1))


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=9),
    cuts=st.lists(st.integers(1, 8), max_size=4),
    seed=st.integers(0, 2**31),
)
def test_parts_stitch_to_the_single_writers_bytes(tmp_path_factory, sizes, cuts, seed) -> None:
    """Any row groups, split into any consecutive parts: the stitched file is the single writer's, byte for byte
    (dictionary pages, statistics and all)."""
    tmp = tmp_path_factory.mktemp("stitch")
    table = _table(sum(sizes), seed)
    ends = np.cumsum(sizes).tolist()
    groups = list(zip([0, *ends[:-1]], ends))
    _write(tmp / "single.parquet", table, groups)
    splits = sorted({0, *[c for c in cuts if c < len(groups)], len(groups)})
    parts = []
    for k, (a, b) in enumerate(zip(splits, splits[1:])):
        parts.append(tmp / f"part{k}.parquet")
        _write(parts[-1], table, groups[a:b])
    stitch_parquet(parts, tmp / "joined.parquet")
    assert (tmp / "joined.parquet").read_bytes() == (tmp / "single.parquet").read_bytes()


def test_an_unchanged_footer_encodes_to_its_own_bytes(tmp_path: Path) -> None:
    _write(tmp_path / "a.parquet", _table(50, 1), [(0, 20), (20, 50)])
    fields, start = read_footer(tmp_path / "a.parquet")
    data = (tmp_path / "a.parquet").read_bytes()
    assert encode_footer(fields) == data[start:-8]


def test_a_split_written_in_parts_is_sealed_as_written_whole(tmp_path: Path) -> None:
    """``write_row_groups`` per part + stitch + the checksums read back = ``write_split``: file and seal."""
    rng = np.random.default_rng(5)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(2, 300, 700))]).astype(np.int64)
    seqs = TokenizedSequences(
        rng.integers(0, 50_000, offsets[-1], dtype=np.int64), rng.integers(0, 2, offsets[-1], dtype=np.int8), offsets
    )
    bins = pack_lengths(seqs.lengths, 1024, seed=0)
    info = {"split": "training", "n": 1}
    whole = write_split(tmp_path / "whole.parquet", seqs, bins, info, row_group_size=20)
    layout = RowSources.of(seqs, bins)
    bounds = row_group_bounds(layout, 20)
    assert len(bounds) > 3
    parts = [tmp_path / "p0.parquet", tmp_path / "p1.parquet", tmp_path / "p2.parquet"]
    for part, (a, b) in zip(parts, [(0, 1), (1, 3), (3, len(bounds))]):
        write_row_groups(part, layout, seqs, bounds[a:b], info)
    stitch_parquet(parts, tmp_path / "joined.parquet")
    digests = ColumnDigests(layout)
    digests.update_from_file(tmp_path / "joined.parquet")
    assert sealed_checksums(tmp_path / "joined.parquet", digests) == whole
    assert json.loads(pq.read_schema(str(tmp_path / "joined.parquet")).metadata[b"mbridge_seqpack"]) == info


def test_parts_of_different_files_are_refused(tmp_path: Path) -> None:
    _write(tmp_path / "a.parquet", _table(10, 1), [(0, 10)])
    other = _table(10, 2).replace_schema_metadata({b"k": b"other"})
    _write(tmp_path / "b.parquet", other, [(0, 10)])
    with pytest.raises(ArtifactError, match=r"b\.parquet: schema or metadata differs from .*a\.parquet"):
        stitch_parquet([tmp_path / "a.parquet", tmp_path / "b.parquet"], tmp_path / "out.parquet")


def test_parts_with_page_indexes_are_refused(tmp_path: Path) -> None:
    """A page index sits after the row groups at an absolute offset: joining would point it at the wrong bytes."""
    table = _table(10, 1)
    with pq.ParquetWriter(str(tmp_path / "a.parquet"), table.schema, write_page_index=True) as writer:
        writer.write_table(table)
    with pytest.raises(ArtifactError, match="has page indexes"):
        stitch_parquet([tmp_path / "a.parquet"], tmp_path / "out.parquet")


def test_a_file_that_is_not_parquet_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ArtifactError, match="not a Parquet file"):
        stitch_parquet([tmp_path / "a.parquet"], tmp_path / "out.parquet")
