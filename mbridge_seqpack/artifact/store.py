"""Sealed packed artifacts that Megatron-Bridge reads unchanged and that refuse corruption and staleness.

Layout of one artifact directory (Megatron-Bridge's names, so ``packed_*_path`` point straight at it)::

    training_<N>.idx.parquet     input_ids / loss_mask / seq_start_id (+ sequence_index: the input record)
    validation_<N>.idx.parquet   optional
    <N>_metadata.jsonl           JSON list, one entry per split: max_samples_per_bin, dataset_max_seqlen, ...,
                                 the fingerprint and the checksums (file sha256 and size, one sha256 per column)

The fingerprint names every input that changes the tokens (input file, tokenizer files and settings, EOS id,
vocabulary, ``dataset_kwargs`` i.e. keys, template and chat settings, lengths, alignment, packer, seed, plugin and
Megatron-Bridge versions); it is also stored in each Parquet file's schema metadata. A pack is built in a
temporary sibling directory, fsync'ed and renamed into place, under a lock file, so an interrupted or
concurrent run never leaves anything that looks like a pack.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import numpy as np

from mbridge_seqpack.artifact.pack_phases import reached
from mbridge_seqpack.artifact.row_group_seal import seal_tiles
from mbridge_seqpack.artifact.row_tokens import gather_tokens
from mbridge_seqpack.digests import RACY_SECONDS, FileStamp, note_read
from mbridge_seqpack.errors import ArtifactError, os_reason
from mbridge_seqpack.tokenization.sequences import TokenizedSequences

if TYPE_CHECKING:
    from mbridge_seqpack.artifact.pack_entry import PackEntry

__all__ = [
    "Fingerprint",
    "FINGERPRINT_KEY",
    "ArtifactError",
    "RowSources",
    "build_rows",
    "write_split",
    "write_row_groups",
    "row_group_bounds",
    "sealed_checksums",
    "date_back",
    "ColumnDigests",
    "write_metadata",
    "read_parquet_fingerprint",
    "split_paths",
    "metadata_path",
    "column_checksums",
    "list_column",
    "digest_columns",
    "staged_directory",
    "check_output",
    "SPLITS",
    "PREP_ARGUMENTS",
    "entry_seal_problem",
]

FINGERPRINT_KEY = b"mbridge_seqpack"
FORMAT = "mbridge_seqpack.packed/2"
SPLITS = ("training", "validation")


@dataclass(frozen=True)
class Fingerprint:
    """Every input that changes the packed rows."""

    input_sha256: str
    tokenizer: str
    tokenizer_sha256: str
    eos_id: int
    vocab_size: int
    dataset_kwargs: str  # canonical JSON: template, keys, chat settings, add_eos, ...
    max_seq_length: int
    pack_size: int
    pad_seq_to_mult: int
    algorithm: str
    seed: int
    plugin_version: str
    megatron_bridge_version: str
    format: str = FORMAT
    input_bytes: int | None = None  # the input's size: a launch compares it in O(1), the digest in the background
    # canonical JSON of the tokenizer config fields the launch's tokenizer build reads
    # (tokenization/tokenizer_settings.py: type, chat template, HF kwargs, special tokens, ...)
    tokenizer_settings: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Fingerprint":
        """The record as a sealed file or metadata entry holds it; a field a pack of an earlier version did not
        write reads None, and keys this version does not know are ignored."""
        return cls(**{f.name: data.get(f.name, f.default if f.name == "format" else None) for f in fields(cls)})

    def settings(self) -> dict[str, Any]:
        """Everything but the input file's digest and size: two splits of one pack run share these."""
        return {key: value for key, value in self.to_dict().items() if key not in ("input_sha256", "input_bytes")}


#: every argument Megatron-Bridge's builder passes to its packing prep (``GPTSFTDatasetBuilder._prepare_packed_split``
#: calls ``prepare_gpt_sft_packed_data``), and the fingerprint fields that seal what it changes in the rows; an empty
#: tuple: the rows do not depend on it (where the files go, the tokenizer process count).
#: tests/tokenization/test_pack_tokenizer.py reads the call from Megatron-Bridge's source and fails on an argument
#: missing here.
PREP_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "input_path": ("input_sha256", "input_bytes"),
    "output_path": (),
    "output_metadata_path": (),
    "packed_sequence_size": ("pack_size",),
    "tokenizer": ("tokenizer", "tokenizer_sha256", "tokenizer_settings", "eos_id", "vocab_size"),
    "max_seq_length": ("max_seq_length",),
    "seed": ("seed",),
    "dataset_kwargs": ("dataset_kwargs",),
    "pad_seq_to_mult": ("pad_seq_to_mult",),
    "num_tokenizer_workers": (),
    "dataset_builder": ("megatron_bridge_version",),  # its code: build_gpt_sft_split of that version
}


def split_paths(directory: str | Path, pack_size: int) -> dict[str, Path]:
    """Megatron-Bridge's file names for the packed splits."""
    d = Path(directory)
    return {split: d / f"{split}_{pack_size}.idx.parquet" for split in SPLITS}


def metadata_path(directory: str | Path, pack_size: int) -> Path:
    """Megatron-Bridge's metadata file name (JSON despite the ``.jsonl`` suffix)."""
    return Path(directory) / f"{pack_size}_metadata.jsonl"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_output(output: Path, *, overwrite: bool) -> Path:
    """Refuse an --output that is a file, a symbolic link to nothing, or non-empty without ``overwrite`` (before any
    slow work starts; a parent that cannot be written is refused when the staging directory's lock is taken, before
    tokenizing)."""
    output = Path(output).absolute()
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArtifactError(f"--output {output}: cannot create its parent directory ({os_reason(exc)})") from None
    if output.is_symlink() and not output.exists():  # the pack's final rename would fail on it, after all the work
        raise ArtifactError(
            f"--output {output}: a symbolic link that resolves to nothing (a loop, or a missing target); remove it "
            "or choose another --output"
        )
    if output.exists() and not output.is_dir():
        raise ArtifactError(f"--output {output}: is a file, not a directory; choose another --output")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise ArtifactError(
            f"--output {output}: not empty; choose an empty directory or pass --overwrite "
            f"(the old contents are replaced only once the new pack is complete)"
        )
    return output


def _exchange(one: Path, other: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system or the file
    system does not offer it."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_cwd, rename_exchange = -100, 2
    done = renameat2(at_cwd, os.fsencode(one), at_cwd, os.fsencode(other), rename_exchange)
    return done == 0


@contextlib.contextmanager
def staged_directory(output: Path, *, overwrite: bool) -> Iterator[Path]:
    """Yield an empty staging directory next to ``output``; on success it replaces ``output`` atomically.

    A lock file (``.<name>.lock``, ``flock``) refuses a second concurrent pack into the same place; a
    non-empty ``output`` is refused unless ``overwrite``. On any failure the staging directory is removed. An
    existing ``output`` is exchanged with the staging directory in one ``renameat2`` where the file system allows,
    so a kill leaves the old pack or the new one, never neither. A killed pack leaves its staging (or ``.old``)
    directory and the lock file: the next pack into the same place removes the directories under the lock; the
    lock file stays (removing it would let two packs lock different files) and is harmless: ``flock`` is released
    with the process that held it.
    """
    import fcntl
    import glob

    output = check_output(output, overwrite=overwrite)
    parent = output.parent
    try:
        lock = open(parent / f".{output.name}.lock", "w")
    except OSError as exc:
        raise ArtifactError(
            f"--output {output}: cannot write in {parent} ({os_reason(exc)}); choose a writable --output"
        ) from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ArtifactError(
                f"--output {output}: another mbridge-seqpack pack is writing there right now; "
                f"wait for it or choose another --output"
            ) from None
        literal = glob.escape(output.name)  # "p[1]" must not match (and delete) "p1"'s live staging directory
        for stale in (*parent.glob(f".{literal}.staging-*"), *parent.glob(f".{literal}.old-*")):
            shutil.rmtree(stale, ignore_errors=True)  # left by a killed pack; we hold the lock, nobody else writes
        staging = parent / f".{output.name}.staging-{os.getpid()}"
        staging.mkdir()
        try:
            yield staging
            for child in staging.iterdir():
                with open(child, "rb") as f:
                    os.fsync(f.fileno())
            _fsync_dir(staging)
            reached("renaming")
            old = parent / f".{output.name}.old-{os.getpid()}"
            if output.exists() and _exchange(staging, output):  # one step: the output is never missing
                reached("swapping")
                old = staging  # now holds the replaced pack
            else:
                if output.exists():  # a file system without renameat2(RENAME_EXCHANGE): two renames
                    os.replace(output, old)
                    reached("swapping")
                os.replace(staging, output)
            _fsync_dir(parent)
            shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def list_column(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """(row offsets from 0, values as int64) of an Arrow list column (chunked or not, sliced or not)."""
    array = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    offsets = array.offsets.to_numpy().astype(np.int64)
    values = array.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]].astype(np.int64)
    return offsets - offsets[0], values


def _digest_of_offsets(offsets: np.ndarray) -> Any:
    """A column's seal digest: sha256 over its row offsets, then its values (fed with ``_feed_values``)."""
    return hashlib.sha256(np.ascontiguousarray(offsets, dtype=np.int64).tobytes())


def _feed_values(digest: Any, values: np.ndarray) -> None:
    digest.update(np.ascontiguousarray(values, dtype=np.int64).tobytes())


def digest_columns(columns: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, str]:
    """sha256 of every (offsets, values) column, as the seal records them."""
    out = {}
    for name, (offsets, values) in sorted(columns.items()):
        digest = _digest_of_offsets(offsets)
        _feed_values(digest, values)
        out[name] = digest.hexdigest()
    return out


def column_checksums(table_or_columns: Any) -> dict[str, str]:
    """sha256 of every list column (row offsets and values, as int64), from a pyarrow table or column dict."""
    columns = (
        dict(zip(table_or_columns.column_names, table_or_columns.columns))
        if hasattr(table_or_columns, "column_names")
        else table_or_columns
    )
    return digest_columns({name: list_column(column) for name, column in columns.items()})


@dataclass(frozen=True)
class RowSources:
    """Where every packed row's sequences come from: sequences of one bin in input order, bins in id order.

    Per-sequence and per-row arrays only (a few bytes per sequence); the tokens are gathered a batch of rows
    at a time, so writing a pack never holds all of its tokens at once.
    """

    order: np.ndarray  # sequence ids, row by row
    starts: np.ndarray  # every entry of ``order``: its first token in the tokenized arrays
    sizes: np.ndarray  # every entry of ``order``: its token count
    seq_offsets: np.ndarray  # row -> its first entry in ``order`` (rows + 1)
    token_offsets: np.ndarray  # row -> its first token in the written column (rows + 1)
    seq_start: np.ndarray  # every entry of ``order``: its start within its row

    @classmethod
    def of(cls, seqs: TokenizedSequences, bins: np.ndarray) -> "RowSources":
        placed = np.flatnonzero(bins >= 0)
        order = placed[np.lexsort((placed, bins[placed]))]  # by bin, then input index
        row_of = bins[order]
        num_rows = int(row_of.max()) + 1 if order.size else 0
        sizes = np.diff(seqs.offsets)[order]
        seg_offsets = np.zeros(order.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=seg_offsets[1:])
        per_row_seqs = np.bincount(row_of, minlength=num_rows)
        seq_offsets = np.zeros(num_rows + 1, dtype=np.int64)
        np.cumsum(per_row_seqs, out=seq_offsets[1:])
        token_offsets = seg_offsets[seq_offsets]
        seq_start = seg_offsets[:-1] - np.repeat(token_offsets[:-1], per_row_seqs)
        return cls(order, seqs.offsets[:-1][order], sizes, seq_offsets, token_offsets, seq_start)

    @property
    def num_rows(self) -> int:
        return int(self.seq_offsets.size - 1)

    def batches(self, max_rows: int = 500, max_tokens: int = 1 << 20) -> Iterator[tuple[int, int]]:
        """(first, end) rows of consecutive batches with at most ``max_rows`` rows and, beyond one row,
        ``max_tokens`` tokens (about 40 MB of transient buffers while a batch is gathered and encoded)."""
        first = 0
        while first < self.num_rows:
            end = int(np.searchsorted(self.token_offsets, self.token_offsets[first] + max_tokens, side="right")) - 1
            end = min(max(end, first + 1), first + max_rows, self.num_rows)
            yield first, end
            first = end

    def values(self, seqs: TokenizedSequences, first: int = 0, end: int | None = None) -> dict[str, tuple]:
        """(row offsets from 0, values) of every column for rows ``first:end``; ``loss_mask`` copied as stored
        (label-aligned, as Megatron-Bridge writes it)."""
        end = self.num_rows if end is None else end
        lo, hi = int(self.seq_offsets[first]), int(self.seq_offsets[end])
        token_offsets = self.token_offsets[first : end + 1] - self.token_offsets[first]
        seq_offsets = self.seq_offsets[first : end + 1] - lo
        ids, mask = gather_tokens(seqs, self.starts[lo:hi], self.sizes[lo:hi])
        return {
            "input_ids": (token_offsets, ids),
            "loss_mask": (token_offsets, mask),
            "seq_start_id": (seq_offsets, self.seq_start[lo:hi].astype(np.int64)),
            "sequence_index": (seq_offsets, self.order[lo:hi].astype(np.int64)),
        }

    def columns(self, seqs: TokenizedSequences, first: int = 0, end: int | None = None) -> dict[str, Any]:
        """Arrow columns of rows ``first:end`` (:meth:`values` as large lists)."""
        return _arrow_columns(self.values(seqs, first, end))


def _arrow_columns(values: dict[str, tuple]) -> dict[str, Any]:
    import pyarrow as pa

    kinds = {"loss_mask": pa.int8()}
    return {
        name: pa.LargeListArray.from_arrays(
            pa.array(offsets.astype(np.int64)), pa.array(v, type=kinds.get(name, pa.int64()))
        )
        for name, (offsets, v) in values.items()
    }


def build_rows(seqs: TokenizedSequences, bins: np.ndarray) -> dict[str, Any]:
    """Arrow columns of all packed rows at once (small packs, tests, benchmarks); ``write_split`` streams."""
    return RowSources.of(seqs, bins).columns(seqs)


class ColumnDigests:
    """:func:`digest_columns` of the columns a :class:`RowSources` writes, fed one batch at a time."""

    def __init__(self, layout: RowSources) -> None:
        self.digests = {}
        for name in ("input_ids", "loss_mask", "seq_start_id", "sequence_index"):
            offsets = layout.token_offsets if name in ("input_ids", "loss_mask") else layout.seq_offsets
            self.digests[name] = _digest_of_offsets(offsets)

    def update(self, values: dict[str, tuple]) -> None:
        for name, (_, column_values) in values.items():
            _feed_values(self.digests[name], column_values)

    def update_from_file(self, path: Path) -> None:
        """Feed the values of a written split file, one row group at a time (a file stitched from parts)."""
        import pyarrow.parquet as pq

        with pq.ParquetFile(str(path)) as handle:
            for group in range(handle.num_row_groups):
                table = handle.read_row_group(group, columns=list(self.digests))
                self.update({name: list_column(table.column(name)) for name in self.digests})

    def hexdigests(self) -> dict[str, str]:
        return {name: digest.hexdigest() for name, digest in sorted(self.digests.items())}


def row_group_bounds(layout: RowSources, row_group_size: int = 500) -> list[tuple[int, int]]:
    """(first, end) rows of every row group ``write_split`` writes (at most ``row_group_size`` rows, as
    Megatron-Bridge's writer, and 1M tokens; one empty group for an empty split)."""
    return list(layout.batches(row_group_size)) if layout.num_rows else [(0, 0)]


def write_row_groups(
    path: Path,
    layout: RowSources,
    seqs: TokenizedSequences,
    bounds: list[tuple[int, int]],
    info: dict[str, Any],
    digests: "ColumnDigests | None" = None,
) -> None:
    """Write the row groups ``bounds`` of ``layout`` to ``path`` (``info`` in the schema metadata), one at a time;
    a part of a split when ``bounds`` are some of its groups (artifact/parquet_stitch.py joins them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mbridge_seqpack.textout import progress_bar

    metadata = {FINGERPRINT_KEY: json.dumps(info, sort_keys=True).encode()}
    try:
        with contextlib.ExitStack() as stack:
            writer = None
            # the driver's own write shows a bar on a terminal; a Ray part's worker has none to show it on
            rows = sum(end - first for first, end in bounds)
            bar = stack.enter_context(
                progress_bar(
                    total=rows, unit="row", desc=f"write {path.name}", enabled=None if digests is not None else False
                )
            )
            for first, end in bounds:
                values = layout.values(seqs, first, end)
                if digests is not None:
                    digests.update(values)
                table = pa.table(_arrow_columns(values)).replace_schema_metadata(metadata)
                if writer is None:
                    writer = stack.enter_context(pq.ParquetWriter(str(path), table.schema))
                    writer.write_table(table, row_group_size=max(end - first, 1))
                    if digests is not None:  # the driver's own write (a Ray part's worker is not the pack)
                        reached("writing")
                else:
                    writer.write_table(table, row_group_size=max(end - first, 1))
                bar.update(end - first)
                del table, values
                pa.default_memory_pool().release_unused()  # Arrow's allocator keeps freed batches otherwise
    except OSError as exc:
        raise ArtifactError(
            f"{path}: cannot be written ({os_reason(exc)}); free space or choose another --output"
        ) from None


def date_back(path: str | Path) -> FileStamp:
    """Set a just-written file's mtime :data:`~mbridge_seqpack.digests.RACY_SECONDS` (whole seconds) into the
    past, so the stamp taken now is trusted at once (digests.py) and any later write, even on a 1-second-granularity
    file system, changes it."""
    past = int(time.time() - RACY_SECONDS - 1) * 1_000_000_000
    os.utime(path, ns=(past, past))
    return FileStamp.of(path)


def sealed_checksums(path: Path, digests: "ColumnDigests") -> dict[str, Any]:
    """The seal of a written split file: its size, its sha256 and every tile's (each row group's bytes, the
    footer's: artifact/row_group_seal.py), read once, and the column digests. Dated back first, so that any
    later write changes its modification time even on a 1-second file system."""
    reached("sealing")
    date_back(path)
    whole, tiles = seal_tiles(path)
    return {
        "file_sha256": whole,
        "file_bytes": path.stat().st_size,
        "columns": digests.hexdigests(),
        tiles.KEY: tiles.to_dict(),
    }


def write_split(
    path: Path, seqs: TokenizedSequences, bins: np.ndarray, info: dict[str, Any], row_group_size: int = 500
) -> dict[str, Any]:
    """Write one packed split (``info`` in the schema metadata), one row group at a time; returns its checksums."""
    layout = RowSources.of(seqs, bins)
    digests = ColumnDigests(layout)
    write_row_groups(path, layout, seqs, row_group_bounds(layout, row_group_size), info, digests)
    return sealed_checksums(path, digests)


#: each metadata entry carries the sha256 of the rest of it: the fields Megatron-Bridge's packed dataset reads
#: (max_samples_per_bin, dataset_max_seqlen, min_packed_seqlen size the static cu_seqlens) and the checksums of every
#: file, tile and column cannot be edited or dropped by accident unnoticed. A deliberate edit that recomputes the
#: hashes passes it; the keyed seal (artifact/seal_key.py, an HMAC with a key the user holds) does not
ENTRY_SEAL = "entry_sha256"


def _entry_body(entry: dict[str, Any]) -> dict[str, Any]:
    from mbridge_seqpack.artifact.seal_key import ENTRY_HMAC

    return {key: value for key, value in entry.items() if key not in (ENTRY_SEAL, ENTRY_HMAC)}


def entry_digest(entry: dict[str, Any]) -> str:
    """sha256 of a metadata entry without its own seals, in canonical JSON."""
    return hashlib.sha256(json.dumps(_entry_body(entry), sort_keys=True).encode()).hexdigest()


def entry_seal_problem(packed: PackEntry) -> str | None:
    """Why a metadata entry fails its seal (``entry_sha256``, and the keyed seal where a key is set or the entry is
    keyed: artifact/seal_key.py), or None. The seal is over the entry as read, every key (pack_entry.py)."""
    from mbridge_seqpack.artifact.seal_key import keyed_problem, seal_key

    entry = packed.to_json()
    if entry.get(ENTRY_SEAL) != entry_digest(entry):
        return "edited or is unsealed"
    try:
        return keyed_problem(entry, _entry_body(entry), seal_key())
    except ArtifactError as exc:
        return f"cannot be checked with the seal key ({exc})"


def write_metadata(path: Path, entries: Sequence[PackEntry], key: bytes | None = None) -> None:
    """Write the metadata JSON list, each entry sealed, with ``key`` also keyed (HMAC-SHA256; the entry records
    ``seal_keyed``, never the key), inside the staging directory: the rename commits it."""
    from mbridge_seqpack.artifact.seal_key import ALGORITHM, ENTRY_HMAC, KEYED, entry_hmac

    sealed = []
    for packed in entries:
        entry = packed.to_json()
        body = {**entry, KEYED: ALGORITHM} if key is not None else entry
        seals = {ENTRY_SEAL: entry_digest(body)}
        if key is not None:
            seals[ENTRY_HMAC] = entry_hmac(_entry_body(body), key)
        sealed.append({**body, **seals})
    try:
        path.write_text(json.dumps(sealed, indent=1, sort_keys=True))
    except OSError as exc:
        raise ArtifactError(
            f"{path}: cannot be written ({os_reason(exc)}); free space or choose another --output"
        ) from None


def read_parquet_fingerprint(path: str | Path) -> dict[str, Any] | None:
    """The ``info`` this plugin stored in a packed Parquet file, or None for a foreign (unsealed) file."""
    import pyarrow.parquet as pq

    note_read(path)
    try:
        schema = pq.read_schema(str(path))
    except (OSError, ValueError, MemoryError) as exc:
        raise ArtifactError(
            f"{path}: not a readable Parquet file ({str(exc)[:120]}); re-run mbridge-seqpack pack"
        ) from None
    raw = (schema.metadata or {}).get(FINGERPRINT_KEY)
    if raw is None:
        return None
    try:
        info = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ArtifactError(f"{path}: corrupted mbridge_seqpack fingerprint; re-run mbridge-seqpack pack") from None
    if not isinstance(info, dict) or not isinstance(info.get("fingerprint"), dict):
        raise ArtifactError(f"{path}: corrupted mbridge_seqpack fingerprint; re-run mbridge-seqpack pack")
    return info
