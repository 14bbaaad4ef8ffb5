"""Every byte a launch trains on, read and compared with its seal before the first optimizer step.

``validate()`` checks a pack in O(metadata) (sizes, metadata seal, the Parquet footers by content). What it defers
is a :class:`ContentPlan`: every row group of every sealed pack file the run reads, the JSONL the pack was made
from when the config names it (``dataset_root/<split>.jsonl``), and the tokenizer files. Rank 0 runs the plan in a
background thread (:class:`BackgroundCheck`) while Megatron-Bridge builds the model, loads the checkpoint and
builds the datasets (artifact/launch_guard.py starts it at ``validate()`` and joins it before the first
``train_step``). One sequential read per file; sha256 releases the GIL, so the build does not wait on it. The
thread imports nothing (a DataLoader worker forked while it runs must not inherit a held import lock). Measured:
``scripts/bench_content_check.py``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mbridge_seqpack.artifact.row_group_seal import CorruptedPackError, Tiles, verify_tiles
from mbridge_seqpack.digests import FileStamp, file_sha256, forget, remember, verified_sha256
from mbridge_seqpack.errors import ArtifactError
from mbridge_seqpack.tokenization.sequences import InputError, sealed_tokenizer_files, tokenizer_files_sha256

__all__ = ["ContentPlan", "PackFile", "SourceFile", "TokenizerFiles", "BackgroundCheck", "ContentCheckError"]


class ContentCheckError(ArtifactError):
    """The launch's content check found bytes that differ from their seal (or data that changed since packing)."""


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


@dataclass(frozen=True)
class PackFile:
    """A sealed pack file: its tiles, or (a pack sealed before tiles) its whole-file sha256."""

    path: Path
    file_bytes: int
    file_sha256: str
    tiles: Tiles | None

    def check(self, progress: Callable[[int], None]) -> str | None:
        try:
            if self.tiles is not None:
                verify_tiles(self.path, self.tiles, progress)
            elif verified_sha256(self.path, self.file_sha256) != self.file_sha256:
                return f"{self.path}: sha256 differs from the seal: the file was modified or corrupted after packing"
            else:
                progress(self.file_bytes)
        except CorruptedPackError as exc:
            forget(self.path)
            return str(exc)
        except OSError as exc:
            return f"{self.path}: cannot be read ({exc.strerror or exc})"
        return None


@dataclass(frozen=True)
class SourceFile:
    """The JSONL a pack split was made from, where the config names it: its sha256 must be the fingerprint's."""

    path: Path
    sha256: str
    split: str

    def check(self, progress: Callable[[int], None]) -> str | None:
        try:
            digest = verified_sha256(self.path, self.sha256)
        except OSError as exc:
            return f"{self.path}: cannot be read ({exc.strerror or exc})"
        progress(self.path.stat().st_size)
        if digest != self.sha256:
            return (
                f"the pack was made from another {self.split} file than {self.path} (sha256 differs, its size and "
                "modification time notwithstanding): the data changed since packing - re-run mbridge-seqpack pack"
            )
        return None


@dataclass(frozen=True)
class TokenizerFiles:
    """The configured tokenizer directory: one digest over its files, as the fingerprint records it."""

    directory: Path
    sha256: str

    def check(self, progress: Callable[[int], None]) -> str | None:
        read: dict[Path, tuple[str, FileStamp]] = {}

        def hashed(path: Path) -> str:
            stamp = FileStamp.of(path)
            read[path] = (file_sha256(path), stamp)
            progress(stamp.size)
            return read[path][0]

        try:
            digest = tokenizer_files_sha256(self.directory, hashed)
        except (InputError, OSError) as exc:
            return f"tokenizer {self.directory}: cannot be read ({exc})"
        for path, (sha, stamp) in read.items():  # the group matched its seal: each file's digest is a true record
            remember(path, sha, stamp) if digest == self.sha256 else forget(path)
        if digest != self.sha256:
            return (
                f"tokenizer {self.directory}: its files differ from those the pack was tokenized with (sha256, their "
                "sizes and modification times notwithstanding) - re-pack with this tokenizer"
            )
        return None

    @property
    def nbytes(self) -> int:
        try:
            return sum(
                (self.directory / n if n else self.directory).stat().st_size
                for n in sealed_tokenizer_files(self.directory)
            )
        except (InputError, OSError):
            return 0


#: what rank 0's content check found, by code (the ranks agree on the largest): the other ranks' message
FOUND_IN = {
    1: "pack bytes that differ from their seal",
    2: "a JSONL file that changed since the pack was made from it",
    3: "tokenizer files that differ from those the pack was tokenized with",
    4: "that the content check itself failed",
}
_KIND: dict[type, int] = {PackFile: 1, SourceFile: 2, TokenizerFiles: 3}


@dataclass
class ContentPlan:
    """What a launch reads in full before its first optimizer step (rank 0)."""

    packs: list[PackFile] = field(default_factory=list)
    sources: list[SourceFile] = field(default_factory=list)
    tokenizer: TokenizerFiles | None = None

    def __bool__(self) -> bool:
        return bool(self.packs or self.sources or self.tokenizer)

    @property
    def nbytes(self) -> int:
        total = sum(p.file_bytes for p in self.packs)
        total += sum(s.path.stat().st_size for s in self.sources if s.path.is_file())
        return total + (self.tokenizer.nbytes if self.tokenizer is not None else 0)

    def key(self) -> tuple[Any, ...]:
        """Identity of the plan (the same files, sizes and seals): one check per launch, however often
        ``validate()`` runs."""
        return (
            tuple((str(p.path), p.file_sha256) for p in self.packs),
            tuple((str(s.path), s.sha256) for s in self.sources),
            (str(self.tokenizer.directory), self.tokenizer.sha256) if self.tokenizer else None,
        )

    def run(self, progress: Callable[[int], None] | None = None, kinds: list[int] | None = None) -> list[str]:
        """Read everything once; the problems found (empty: every byte matched its seal), and into ``kinds`` the
        :data:`FOUND_IN` code of each (what the other ranks are told)."""
        tick = progress or (lambda n: None)
        items: list[Any] = [*self.packs, *self.sources, *([self.tokenizer] if self.tokenizer else [])]
        problems = []
        for item in items:
            problem = item.check(tick)
            if problem is not None:
                problems.append(problem)
                if kinds is not None:
                    kinds.append(_KIND[type(item)])
        return problems

    def summary(self) -> str:
        """One line for ``check``: what ``validate()`` verified and what the launch verifies later."""
        if not self:
            return "no sealed pack found: nothing to verify (Megatron-Bridge's own prep makes an unsealed one)"
        tiled = [p for p in self.packs if p.tiles is not None]
        now = f"metadata, sizes and Parquet footers of {len(self.packs)} pack file(s)"
        if len(tiled) < len(self.packs):
            now = f"metadata and sizes of {len(self.packs)} pack file(s) (footers: {len(tiled)})"
        later = [f"{_size(sum(p.file_bytes for p in self.packs))} of pack bytes"] if self.packs else []
        later += [s.path.name for s in self.sources]
        if self.tokenizer is not None:
            later.append("the tokenizer files")
        reads = ", and each row group again as Megatron-Bridge reads it" if tiled else ""
        old = (
            f"; {len(self.packs) - len(tiled)} file(s) sealed without row-group digests (re-pack to verify reads)"
            if len(tiled) < len(self.packs)
            else ""
        )
        return (
            f"checked now: {now}; deferred: {', '.join(later)}, hashed on rank 0 while the model is built (the run "
            f"stops before its first optimizer step if any byte differs){reads}{old}"
        )


class BackgroundCheck:
    """:meth:`ContentPlan.run` in a daemon thread: started at ``validate()``, joined before the first step."""

    def __init__(self, plan: ContentPlan) -> None:
        self.plan = plan
        self.total = plan.nbytes
        self.done_bytes = 0
        self.problems: list[str] = []
        self.kinds: list[int] = []  # FOUND_IN codes of the problems
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.seconds: float | None = None
        self._thread = threading.Thread(target=self._run, name="mbridge_seqpack-content-check", daemon=True)
        self._thread.start()

    def _tick(self, nbytes: int) -> None:
        self.done_bytes += nbytes

    def _run(self) -> None:
        try:
            self.problems = self.plan.run(self._tick, self.kinds)
        except BaseException as exc:  # noqa: BLE001  (reported where the check is joined, never lost in a thread)
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - self.started

    def wait(self, timeout: float | None = None) -> bool:
        """True once finished (within ``timeout`` seconds)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def verdict(self) -> list[str]:
        """The problems found; call after :meth:`wait` returned True."""
        if self.error is not None:
            return [f"the content check itself failed ({type(self.error).__name__}: {self.error})"]
        return list(self.problems)

    def found_in(self) -> int:
        """The largest :data:`FOUND_IN` code of what was found (0: nothing); call after :meth:`wait`."""
        if self.error is not None:
            return 4
        return max(self.kinds, default=1 if self.problems else 0)

    def progress(self) -> str:
        return f"{_size(self.done_bytes)} of {_size(self.total)}"
