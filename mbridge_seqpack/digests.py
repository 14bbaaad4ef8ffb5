"""Remembered file digests: a hint that saves reading a file again, never the last word on it.

Full hashes are computed where the user asked for work on the data (``pack``, ``inspect``, ``verify``, a launch's
content check) and remembered with the file's stamp (real path, inode, size, modification time in ns) and the
sha256 of its last 64 KiB. A record is written only from bytes that matched what they are compared with: a file
``pack`` reads defines its seal (its input and tokenizer files); any other file is recorded only when its full hash
equals the sealed one (:func:`verified_sha256` with ``expected``). A hash that differs, or a stamp that changed,
evicts the record instead, so a corrupted file that was read once cannot leave a record behind that refuses the
good bytes put back under the same stamp.

Bytes can change under an unchanged stamp (a tool that restores the modification time, a block corrupted on
shared storage), so a record is only ever a hint: at ``validate()`` a recalled digest that agrees lets the check
defer the file to the launch's full content check (artifact/content_check.py), which reads every byte before the
first optimizer step; a recalled digest that disagrees is confirmed by reading the file before anything is
refused. Pack files themselves are not trusted by stamp at all: their footers are checked by content at
``validate()`` and their row groups by content at launch (artifact/row_group_seal.py).

A stamp is remembered only when the file's mtime is older than :data:`RACY_SECONDS`, as git does for its index:
a write within the file system's timestamp granularity of the hash would otherwise keep the stamp.

Records live under ``$MBRIDGE_SEQPACK_CACHE_DIR`` (default ``$XDG_CACHE_HOME/mbridge_seqpack`` or
``~/.cache/mbridge_seqpack``), one small JSON file per path, written atomically; an unwritable or corrupted
cache only costs the full hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator

__all__ = [
    "CACHE_ENV",
    "RACY_SECONDS",
    "FileStamp",
    "file_sha256",
    "verified_sha256",
    "launch_sha256",
    "recalled_sha256",
    "remember",
    "forget",
    "note_read",
    "recording_reads",
    "read_stamps",
]

CACHE_ENV = "MBRIDGE_SEQPACK_CACHE_DIR"
#: coarser than any file system's mtime granularity in use (ext4/xfs: ns..jiffies, Lustre: 1 s, FAT: 2 s)
RACY_SECONDS = 2.0
TAIL_BYTES = 1 << 16
_RECORD_VERSION = 1


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """Content hash of a whole file (inputs, tokenizer files, packed splits)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class FileStamp:
    """What changes when a file is written, truncated, replaced or swapped."""

    path: str
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str | Path) -> FileStamp:
        note_read(path)
        real = os.path.realpath(path)
        st = os.stat(real)
        return cls(real, st.st_ino, st.st_size, st.st_mtime_ns)

    def racy(self, now: float | None = None) -> bool:
        """Too recent to trust: a write within the timestamp granularity could leave the stamp unchanged."""
        return (time.time() if now is None else now) - self.mtime_ns / 1e9 < RACY_SECONDS


def _cache_dir() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mbridge_seqpack"


def _record_path(stamp: FileStamp) -> Path:
    return _cache_dir() / "digests" / f"{hashlib.sha256(stamp.path.encode()).hexdigest()[:40]}.json"


def _tail_sha256(path: str, size: int) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, size - TAIL_BYTES))
        return hashlib.sha256(f.read(TAIL_BYTES)).hexdigest()


def remember(path: str | Path, sha256: str, stamp: FileStamp) -> bool:
    """Record ``sha256`` for the file as ``stamp`` saw it (taken before hashing); False when not recorded
    (racy, changed since, or the cache is not writable). Callers record only digests that matched their seal (or,
    for ``pack``'s own inputs, define it)."""
    try:
        if FileStamp.of(path) != stamp or stamp.racy():
            return False
        record = {"version": _RECORD_VERSION, **asdict(stamp), "sha256": sha256}
        record["tail_sha256"] = _tail_sha256(stamp.path, stamp.size)
        target = _record_path(stamp)
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = target.with_name(f".{target.name}.{os.getpid()}")
        scratch.write_text(json.dumps(record, sort_keys=True))
        os.replace(scratch, target)
        return True
    except OSError:
        return False


def _evict(stamp: FileStamp) -> None:
    try:
        _record_path(stamp).unlink(missing_ok=True)
    except OSError:
        pass


def forget(path: str | Path) -> None:
    """Evict the record of ``path`` (a verification failed, or its stamp changed)."""
    try:
        _evict(FileStamp.of(path))
    except OSError:
        pass


def verified_sha256(path: str | Path, expected: str | None = None) -> str:
    """The full hash, read now. Remembered when ``expected`` is None (the read defines the seal: ``pack``'s
    inputs) or equal to it; a hash that differs from ``expected`` evicts any record of the file."""
    stamp = FileStamp.of(path)
    digest = file_sha256(stamp.path)
    if expected is None or digest == expected:
        remember(path, digest, stamp)
    else:
        forget(path)
    return digest


def _recalled(stamp: FileStamp) -> str | None:
    try:
        record = json.loads(_record_path(stamp).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != _RECORD_VERSION:
        return None
    if {k: record.get(k) for k in asdict(stamp)} != asdict(stamp) or stamp.racy():
        _evict(stamp)  # the file changed since: the record can only mislead
        return None
    try:
        if _tail_sha256(stamp.path, stamp.size) != record.get("tail_sha256"):
            _evict(stamp)
            return None
    except OSError:
        return None
    sha = record.get("sha256")
    return sha if isinstance(sha, str) else None


def recalled_sha256(path: str | Path) -> str | None:
    """The digest remembered for the file as it is stamped now (a hint), or None; O(1) plus a 64 KiB read."""
    try:
        return _recalled(FileStamp.of(path))
    except OSError:
        return None


def launch_sha256(path: str | Path, expected: str | None = None) -> str:
    """``expected`` when the remembered digest agrees with it (a hint: the launch's content check reads the file
    in full later), else the full hash read now (remembered only if it matches ``expected``)."""
    recalled = recalled_sha256(path)
    if recalled is not None and (expected is None or recalled == expected):
        return recalled
    return verified_sha256(path, expected)


#: the sets of paths being recorded (:func:`recording_reads`; nested recordings each get every read)
_RECORDINGS: list[set[str]] = []


def note_read(path: str | Path) -> None:
    """Say that a verdict depends on ``path`` (a file or a directory, present or not): a cache of the verdict is
    keyed on its stamp (hook.py). A no-op unless a recording is on."""
    if _RECORDINGS:
        name = os.path.abspath(os.fspath(path))
        for recorded in _RECORDINGS:
            recorded.add(name)


@contextlib.contextmanager
def recording_reads() -> Iterator[set[str]]:
    """Collect the paths :func:`note_read` is told of while the block runs."""
    recorded: set[str] = set()
    _RECORDINGS.append(recorded)
    try:
        yield recorded
    finally:
        _RECORDINGS.remove(recorded)


def read_stamps(paths: Iterable[str]) -> tuple[tuple[str, int, int, int] | tuple[str], ...] | None:
    """(path, inode, size, mtime_ns) of every path, (path,) for one that is missing, sorted; None when one was
    written too recently for its stamp to show a further write (:data:`RACY_SECONDS`)."""
    out: list[tuple[str, int, int, int] | tuple[str]] = []
    now = time.time()
    for path in sorted(paths):
        try:
            st = os.stat(path)
        except OSError:
            out.append((path,))
            continue
        if now - st.st_mtime_ns / 1e9 < RACY_SECONDS:
            return None
        out.append((path, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)
