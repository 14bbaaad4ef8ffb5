"""What the plugin installs in a training process so that no corrupted pack byte is trained on (zero user code).

1. **Verified reads.** ``GPTSFTPackedParquetDataset._ensure_reader`` (Megatron-Bridge's data/packing/parquet.py,
   called in each DataLoader worker the first time a file is read) is wrapped: for a file ``pack`` sealed with
   row-group tiles it returns a :class:`~mbridge_seqpack.artifact.verified_parquet.VerifiedParquetFile`, whose
   ``read_row_group`` parses only bytes that matched their seal. A tile that differs raises in ``__getitem__``,
   which the DataLoader re-raises in the training loop before that batch reaches the model. Unsealed files
   (Megatron-Bridge's own prep) and remote storage (Multi-Storage Client) are read as before, except that an
   unsealed file is refused where a seal key is set (artifact/seal_key.py: only packs sealed with it train).
2. **The content check, joined before the first optimizer step.** :func:`arm` (called by the hook after
   ``validate()`` passes) starts :class:`~mbridge_seqpack.artifact.content_check.BackgroundCheck` on rank 0 and
   wraps ``megatron.bridge.training.train.train_step``, which ``train()`` looks up in its module at call time
   (tested). The first ``train_step`` waits for the check, every rank takes part in one small ``all_reduce`` of
   the verdict (in rounds of :data:`ROUND_SECONDS`, so no rank sits in a collective long enough for a NCCL
   timeout), and all ranks raise :class:`ContentCheckError` before the forward pass when a byte differs.

In ``warn`` mode both warn (rank 0) and go on; ``off`` does nothing.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from mbridge_seqpack.artifact.content_check import FOUND_IN, BackgroundCheck, ContentCheckError, ContentPlan
from mbridge_seqpack.artifact.row_group_seal import CorruptedPackError
from mbridge_seqpack.artifact.seal_key import unsealed_problem
from mbridge_seqpack.artifact.verified_parquet import VerifiedParquetFile, find_seal
from mbridge_seqpack.errors import ArtifactError
from mbridge_seqpack.ranks import is_rank_zero

__all__ = ["install", "uninstall", "set_mode", "arm", "disarm", "gate", "is_armed", "TRAIN_MODULE", "ROUND_SECONDS"]

TRAIN_MODULE = "megatron.bridge.training.train"
#: the longest any rank waits inside one collective while rank 0 finishes the content check
ROUND_SECONDS = 30.0
_FLAG = "__mbridge_seqpack_launch_guard__"


class PackContentWarning(UserWarning):
    """A pack byte that differs from its seal, in ``warn`` mode (training goes on with it)."""


@dataclass
class _State:
    mode: Callable[[], str | None] = lambda: None
    ensure_reader: Any = None  # the original GPTSFTPackedParquetDataset._ensure_reader while installed
    train_step: Any = None  # the original train_step while the gate is installed
    check: BackgroundCheck | None = None  # rank 0's content check of the armed launch
    armed_key: Any = None
    gate_pending: bool = False
    warned: set[str] = field(default_factory=set)


_state = _State()


def _mode() -> str | None:
    try:
        return _state.mode()
    except Exception:  # noqa: BLE001  (the hook's mode getter must never break a read)
        return "error"


def _warn_once(key: str, text: str) -> None:
    if key not in _state.warned and is_rank_zero():
        _state.warned.add(key)
        warnings.warn(f"mbridge_seqpack: {text} (warn mode: training goes on)", PackContentWarning, stacklevel=3)


class _GuardedReader(VerifiedParquetFile):
    """Verified reads; in ``warn`` mode a tile that differs is warned about and read as it is."""

    def read_row_group(self, i: int, columns: list[str] | None = None, **kwargs: Any) -> Any:
        try:
            return super().read_row_group(i, columns=columns, **kwargs)
        except CorruptedPackError as exc:
            if _mode() != "warn":
                raise
            _warn_once(f"{self.path}:{i}", str(exc))
            import pyarrow.parquet as pq

            return pq.ParquetFile(self.path).read_row_group(i, columns=columns, **kwargs)


def _guarded_reader(dataset: Any, file_idx: int) -> VerifiedParquetFile | None:
    """The verified reader of one file of ``dataset``, or None to read it as Megatron-Bridge does."""
    from megatron.core.msc_utils import MultiStorageClientFeature

    if _mode() in (None, "off") or MultiStorageClientFeature.is_enabled():
        return None
    path = dataset._parquet_paths[file_idx]
    try:
        seal = find_seal(path)
        unkeyed = unsealed_problem() if seal is None else None
        if unkeyed is not None:  # a seal key is set: a file swapped in after validate() is not read either
            raise ArtifactError(f"{path}: {unkeyed}")
        if seal is None or seal.tiles is None:
            return None  # unsealed, or sealed with one digest per file: the content check covers it
        reader = _GuardedReader(path, seal.tiles)
    except (ArtifactError, OSError) as exc:
        if _mode() == "warn":
            _warn_once(str(path), str(exc))
            return None
        raise
    indexed = list(dataset._file_row_group_offsets[file_idx])
    if indexed != reader.row_group_offsets():  # the dataset indexed a footer other than the sealed one
        reader.close()
        raise CorruptedPackError(
            f"{path}: the row groups Megatron-Bridge indexed ({indexed[-1]} rows in {len(indexed) - 1} groups) are "
            f"not the sealed ones ({reader.row_group_offsets()[-1]} rows): the file changed while the datasets "
            "were built - re-run mbridge-seqpack pack"
        )
    return reader


def _wrap_ensure_reader(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _ensure_reader(self: Any, file_idx: int) -> Any:
        if file_idx in self._parquet_files:
            return self._parquet_files[file_idx][0]
        reader = _guarded_reader(self, file_idx)
        if reader is None:
            return original(self, file_idx)
        self._parquet_files[file_idx] = (reader, None)
        return reader

    setattr(_ensure_reader, _FLAG, True)
    return _ensure_reader


def set_mode(mode: Callable[[], str | None]) -> None:
    """Where the guard reads the mode (``error``, ``warn``, ``off``; the hook's ``current_mode``)."""
    _state.mode = mode


def _wrap_reader() -> None:
    """Wrap ``GPTSFTPackedParquetDataset._ensure_reader`` once. Where the hook is installed while Megatron-Bridge's
    packages are still importing (the zero-code start-up hook fires when its config module is loaded), the
    dataset module may not be importable yet: :func:`arm` tries again at ``validate()``."""
    if _state.ensure_reader is not None:
        return
    try:
        from megatron.bridge.data.packing.parquet import GPTSFTPackedParquetDataset
    except ImportError:
        return
    current = GPTSFTPackedParquetDataset.__dict__["_ensure_reader"]
    if getattr(current, _FLAG, False):  # a reloaded module left a wrapper behind
        current = current.__wrapped__
    _state.ensure_reader = current
    GPTSFTPackedParquetDataset._ensure_reader = _wrap_ensure_reader(current)


def install(mode: Callable[[], str | None]) -> None:
    """Wrap Megatron-Bridge's packed Parquet reader (idempotent); ``mode`` gives the hook's current mode."""
    set_mode(mode)
    _wrap_reader()


def uninstall() -> None:
    """Put every wrapped function back exactly and forget the armed launch."""
    if _state.ensure_reader is not None:
        from megatron.bridge.data.packing.parquet import GPTSFTPackedParquetDataset

        GPTSFTPackedParquetDataset._ensure_reader = _state.ensure_reader
        _state.ensure_reader = None
    disarm()


# --- the gate before the first optimizer step ---------------------------------------------------------------


def _wrap_train_step(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def train_step(*args: Any, **kwargs: Any) -> Any:
        if _state.gate_pending:
            gate()
        return original(*args, **kwargs)

    setattr(train_step, _FLAG, True)
    return train_step


def _patch_train_module(module: Any) -> None:
    if _state.train_step is None and not getattr(module.train_step, _FLAG, False):
        _state.train_step = module.train_step
        module.train_step = _wrap_train_step(module.train_step)


class _PatchAfterLoad(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        if _state.gate_pending:
            _patch_train_module(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _WaitForTrain(importlib.abc.MetaPathFinder):
    """Patches ``train_step`` when Megatron-Bridge's training loop is imported after ``validate()``."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != TRAIN_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchAfterLoad(spec.loader)
        return spec


def arm(plan: ContentPlan) -> None:
    """After ``validate()`` passed for a config that reads offline packs: rank 0 starts reading ``plan`` in the
    background (once per distinct plan), and every rank's first ``train_step`` waits for the verdict."""
    if _mode() in (None, "off"):
        return
    _wrap_reader()
    if is_rank_zero() and plan and plan.key() != _state.armed_key:
        _state.armed_key = plan.key()
        _state.check = BackgroundCheck(plan)
    _state.gate_pending = True
    module = sys.modules.get(TRAIN_MODULE)
    if module is not None:
        _patch_train_module(module)
    elif not any(isinstance(f, _WaitForTrain) for f in sys.meta_path):
        sys.meta_path.insert(0, _WaitForTrain())


def is_armed() -> bool:
    return _state.gate_pending


def disarm() -> None:
    """Restore ``train_step`` and drop the pending verdict (uninstall, tests)."""
    module = sys.modules.get(TRAIN_MODULE)
    if _state.train_step is not None and module is not None:
        module.train_step = _state.train_step
    _state.train_step = None
    _state.gate_pending = False
    _state.check = None
    _state.armed_key = None
    for finder in [f for f in sys.meta_path if isinstance(f, _WaitForTrain)]:
        sys.meta_path.remove(finder)


def _reduce(pending: int, failed: int) -> tuple[int, int]:
    """The maximum of (pending, failed) over every rank (this rank's own values without a process group)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return pending, failed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return pending, failed
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    status = torch.tensor([pending, failed], dtype=torch.int32, device=device)
    dist.all_reduce(status, op=dist.ReduceOp.MAX)
    return int(status[0]), int(status[1])


def other_rank_text(found: int) -> str:
    """What a rank that did not read the files says when rank 0's check found ``found`` (a FOUND_IN code)."""
    return f"rank 0's content check found {FOUND_IN.get(found, FOUND_IN[1])} (rank 0's error names the file)"


def gate() -> None:
    """The first ``train_step``: rank 0 joins its content check; every rank learns the verdict; a byte that
    differs stops every rank here (``error`` mode), before the forward pass and the first optimizer step."""
    check = _state.check
    problems: list[str] = []
    announced = False
    entered = time.perf_counter()
    while True:
        done = check is None or check.wait(ROUND_SECONDS)
        if check is not None and not done and not announced and is_rank_zero():
            print(f"mbridge_seqpack: waiting for the pack content check ({check.progress()} read)", flush=True)
            announced = True
        found = 0
        if done and check is not None:
            problems = check.verdict()
            found = check.found_in() if problems else 0
        pending, failed = _reduce(0 if done else 1, found)
        if not pending:
            break
    _state.gate_pending = False
    _state.check, _state.armed_key = None, None  # this launch passed its gate; a later validate() arms anew
    if not failed:
        if check is not None and is_rank_zero():
            print(
                f"mbridge_seqpack: pack content check passed: {check.progress().split(' of ')[-1]} read in "
                f"{check.seconds or 0:.1f} s while the model was built; the first step waited "
                f"{time.perf_counter() - entered:.1f} s for it",
                flush=True,
            )
        return
    text = "; ".join(problems) if problems else other_rank_text(failed)
    if _mode() == "warn":
        _warn_once("gate", text)
        return
    raise ContentCheckError(
        f"mbridge_seqpack: stopped before the first optimizer step: {text}. Nothing was trained on these bytes"
    )
