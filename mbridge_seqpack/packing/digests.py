"""File digests a launch can trust without reading the file again.

Every rank validates the config when ``pretrain()``/``finetune()`` start, and rank 0 used to hash every pack
file (and the input JSONL) each time: minutes per launch for a 100 GB pack. Full hashes are computed where the
user asked for work on the data (``pack``, ``inspect``, ``verify``, the first launch that meets a file); each is
remembered with the file's stamp (real path, inode, size, modification time in ns) and the sha256 of its last
64 KiB (a Parquet footer). A launch then reads the stamp and the tail only: any write changes the modification
time (a truncated or swapped file changes size or inode as well) and falls back to the full hash.

A stamp is remembered only when the file's mtime is older than :data:`RACY_SECONDS`, as git does for its index:
a write within the file system's timestamp granularity of the hash would otherwise keep the stamp. ``pack``
dates its own files back by that much before hashing them (they are new and still under its lock), so a pack
is trusted from its first launch.

Records live under ``$MBRIDGE_SEQPACK_CACHE_DIR`` (default ``$XDG_CACHE_HOME/mbridge_seqpack`` or
``~/.cache/mbridge_seqpack``), one small JSON file per path, written atomically; an unwritable or corrupted
cache only costs the full hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "CACHE_ENV",
    "RACY_SECONDS",
    "FileStamp",
    "file_sha256",
    "verified_sha256",
    "launch_sha256",
    "date_back",
    "remember",
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
    (racy, changed since, or the cache is not writable)."""
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


def verified_sha256(path: str | Path) -> str:
    """The full hash, read now, and remembered for later launches."""
    stamp = FileStamp.of(path)
    digest = file_sha256(stamp.path)
    remember(path, digest, stamp)
    return digest


def _recalled(stamp: FileStamp) -> str | None:
    try:
        record = json.loads(_record_path(stamp).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != _RECORD_VERSION:
        return None
    if {k: record.get(k) for k in asdict(stamp)} != asdict(stamp) or stamp.racy():
        return None
    try:
        if _tail_sha256(stamp.path, stamp.size) != record.get("tail_sha256"):
            return None
    except OSError:
        return None
    sha = record.get("sha256")
    return sha if isinstance(sha, str) else None


def launch_sha256(path: str | Path) -> str:
    """The file's sha256 at O(1) cost when a full hash of this very file was remembered, else the full hash."""
    stamp = FileStamp.of(path)
    return _recalled(stamp) or verified_sha256(path)


def date_back(path: str | Path) -> FileStamp:
    """Set a just-written file's mtime :data:`RACY_SECONDS` (whole seconds) into the past, so the stamp taken now
    is trusted at once and any later write, even on a 1-second-granularity file system, changes it."""
    past = int(time.time() - RACY_SECONDS - 1) * 1_000_000_000
    os.utime(path, ns=(past, past))
    return FileStamp.of(path)
