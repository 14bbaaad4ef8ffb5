"""Parquet files written in parts (consecutive row groups, one part per worker) joined into the one file a single
writer would have written, byte for byte.

A Parquet file is ``PAR1``, its row groups, a Thrift-encoded footer (``FileMetaData``), the footer's length and
``PAR1``. A row group's bytes do not depend on where it sits (page headers hold sizes, not offsets); only the
footer holds absolute offsets. So the parts' row-group bytes are copied one after another and one footer is
written: the first part's, with every part's row groups (their offsets moved by where they now start) and the
row count summed. The footer is read and written with Thrift's compact protocol (re-encoding an unchanged footer
gives its bytes back, tested). Column/offset indexes and bloom filters would sit after the row groups with
absolute offsets: a part holding any is refused (``pyarrow`` writes none by default, nor does ``write_split``).
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import Any

from mbridge_seqpack.artifact.store import ArtifactError  # parts that cannot be joined into one file

__all__ = ["stitch_parquet", "read_footer", "encode_footer"]

MAGIC = b"PAR1"

# compact protocol types
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)

# parquet.thrift field ids this module reads or moves
FILE_NUM_ROWS, FILE_ROW_GROUPS = 3, 4
GROUP_COLUMNS, GROUP_FILE_OFFSET, GROUP_ORDINAL = 1, 5, 7
CHUNK_FILE_OFFSET, CHUNK_META, CHUNK_OFFSET_INDEX, CHUNK_COLUMN_INDEX = 2, 3, 4, 6
META_DATA_PAGE, META_INDEX_PAGE, META_DICTIONARY_PAGE, META_BLOOM_FILTER = 9, 10, 11, 14

Field = list  # [field id, compact type, value]; a struct is a list of fields in the order they were written


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def _read_struct(buf: bytes, pos: int) -> tuple[list[Field], int]:
    fields: list[Field] = []
    last = 0
    while True:
        header = buf[pos]
        pos += 1
        if header == 0:
            return fields, pos
        kind, delta = header & 0x0F, header >> 4
        if delta:
            field_id = last + delta
        else:
            raw, pos = _varint(buf, pos)
            field_id = _unzigzag(raw)
        last = field_id
        if kind in (_TRUE, _FALSE):
            value: Any = kind == _TRUE
        else:
            value, pos = _read_value(buf, pos, kind)
        fields.append([field_id, kind, value])


def _read_value(buf: bytes, pos: int, kind: int) -> tuple[Any, int]:
    if kind == _BYTE:
        return buf[pos], pos + 1
    if kind in (_I16, _I32, _I64):
        raw, pos = _varint(buf, pos)
        return _unzigzag(raw), pos
    if kind == _DOUBLE:
        return bytes(buf[pos : pos + 8]), pos + 8
    if kind == _BINARY:
        size, pos = _varint(buf, pos)
        return bytes(buf[pos : pos + size]), pos + size
    if kind in (_LIST, _SET):
        header = buf[pos]
        pos += 1
        element, size = header & 0x0F, header >> 4
        if size == 15:
            size, pos = _varint(buf, pos)
        items = []
        for _ in range(size):
            if element in (_TRUE, _FALSE):  # a list's booleans are one byte each
                items.append(buf[pos])
                pos += 1
            else:
                item, pos = _read_value(buf, pos, element)
                items.append(item)
        return (element, items), pos
    if kind == _STRUCT:
        return _read_struct(buf, pos)
    raise ArtifactError(f"Thrift compact type {kind} is not used by Parquet footers")


def _write_varint(out: bytearray, value: int) -> None:
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _write_struct(out: bytearray, fields: list[Field]) -> None:
    last = 0
    for field_id, kind, value in fields:
        written = (_TRUE if value else _FALSE) if kind in (_TRUE, _FALSE) else kind
        delta = field_id - last
        if 0 < delta <= 15:
            out.append((delta << 4) | written)
        else:
            out.append(written)
            _write_varint(out, (field_id << 1) ^ (field_id >> 63))
        last = field_id
        if kind not in (_TRUE, _FALSE):
            _write_value(out, kind, value)
    out.append(0)


def _write_value(out: bytearray, kind: int, value: Any) -> None:
    if kind == _BYTE:
        out.append(value)
    elif kind in (_I16, _I32, _I64):
        _write_varint(out, (value << 1) ^ (value >> 63))
    elif kind in (_DOUBLE, _BINARY):
        if kind == _BINARY:
            _write_varint(out, len(value))
        out.extend(value)
    elif kind in (_LIST, _SET):
        element, items = value
        if len(items) < 15:
            out.append((len(items) << 4) | element)
        else:
            out.append(0xF0 | element)
            _write_varint(out, len(items))
        for item in items:
            if element in (_TRUE, _FALSE):
                out.append(item)
            else:
                _write_value(out, element, item)
    elif kind == _STRUCT:
        _write_struct(out, value)


def read_footer(path: Path) -> tuple[list[Field], int]:
    """(the ``FileMetaData`` fields, where the footer starts) of a Parquet file."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(4)
        handle.seek(max(size - 8, 0))
        tail = handle.read(8)
        if size < 12 or head != MAGIC or tail[4:] != MAGIC:
            raise ArtifactError(f"{path}: not a Parquet file")
        length = struct.unpack("<i", tail[:4])[0]
        start = size - 8 - length
        if not 4 <= start:
            raise ArtifactError(f"{path}: footer length {length} does not fit the file")
        handle.seek(start)
        footer = handle.read(length)
    fields, end = _read_struct(footer, 0)
    if end != length:
        raise ArtifactError(f"{path}: footer has {length - end} bytes after its end")
    return fields, start


def encode_footer(fields: list[Field]) -> bytes:
    out = bytearray()
    _write_struct(out, fields)
    return bytes(out)


def _field(fields: list[Field], field_id: int) -> Field | None:
    return next((field for field in fields if field[0] == field_id), None)


def _moved_group(group: list[Field], shift: int, ordinal: int, path: Path) -> list[Field]:
    """A row group's fields with its offsets moved by ``shift`` bytes and its ordinal set (when written)."""
    out = []
    for field_id, kind, value in group:
        if field_id == GROUP_FILE_OFFSET:
            value += shift
        elif field_id == GROUP_ORDINAL:
            value = ordinal
        elif field_id == GROUP_COLUMNS:
            value = (value[0], [_moved_chunk(chunk, shift, path) for chunk in value[1]])
        out.append([field_id, kind, value])
    return out


def _moved_chunk(chunk: list[Field], shift: int, path: Path) -> list[Field]:
    out = []
    for field_id, kind, value in chunk:
        if field_id in (CHUNK_OFFSET_INDEX, CHUNK_COLUMN_INDEX):
            raise ArtifactError(f"{path}: has page indexes (written after the row groups); write parts without them")
        if field_id == CHUNK_FILE_OFFSET and value:  # 0: not set (parquet-cpp leaves the deprecated field at 0)
            value += shift
        elif field_id == CHUNK_META:
            value = [
                [fid, k, v + shift if fid in (META_DATA_PAGE, META_INDEX_PAGE, META_DICTIONARY_PAGE) else v]
                for fid, k, v in value
            ]
            if _field(value, META_BLOOM_FILTER) is not None:
                raise ArtifactError(f"{path}: has bloom filters (written after the row groups); write parts without")
        out.append([field_id, kind, value])
    return out


def stitch_parquet(parts: list[Path], target: Path) -> None:
    """Write ``target``: the row groups of ``parts`` in order, under the first part's footer (same schema and
    key-value metadata required) with every row group listed and the row counts summed."""
    if not parts:
        raise ArtifactError("no parts to stitch")
    footers = [read_footer(part) for part in parts]
    first = footers[0][0]
    for part, (fields, _) in zip(parts[1:], footers[1:]):
        others = [f for f in fields if f[0] not in (FILE_NUM_ROWS, FILE_ROW_GROUPS)]
        if others != [f for f in first if f[0] not in (FILE_NUM_ROWS, FILE_ROW_GROUPS)]:
            raise ArtifactError(f"{part}: schema or metadata differs from {parts[0]}; parts of one file only")
    groups: list[list[Field]] = []
    rows = 0
    position = len(MAGIC)
    with open(target, "wb") as out:
        out.write(MAGIC)
        for part, (fields, footer_start) in zip(parts, footers):
            shift = position - len(MAGIC)
            listed = _field(fields, FILE_ROW_GROUPS)
            for group in listed[2][1] if listed else []:
                groups.append(_moved_group(group, shift, len(groups), part))
            rows += _field(fields, FILE_NUM_ROWS)[2]
            with open(part, "rb") as source:
                source.seek(len(MAGIC))
                remaining = footer_start - len(MAGIC)
                shutil.copyfileobj(_Limited(source, remaining), out, 1 << 22)
            position += footer_start - len(MAGIC)
        merged = []
        for field_id, kind, value in first:
            if field_id == FILE_NUM_ROWS:
                value = rows
            elif field_id == FILE_ROW_GROUPS:
                value = (value[0], groups)
            merged.append([field_id, kind, value])
        footer = encode_footer(merged)
        out.write(footer)
        out.write(struct.pack("<i", len(footer)))
        out.write(MAGIC)


class _Limited:
    """The next ``remaining`` bytes of a file, for ``shutil.copyfileobj``."""

    def __init__(self, handle: Any, remaining: int) -> None:
        self.handle, self.remaining = handle, remaining

    def read(self, size: int = -1) -> bytes:
        size = self.remaining if size < 0 else min(size, self.remaining)
        data = self.handle.read(size)
        self.remaining -= len(data)
        return data
