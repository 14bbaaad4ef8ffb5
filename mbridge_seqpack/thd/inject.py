"""Static THD for full-iteration CUDA graphs, injected where Megatron reads the batch (no code in the user's step).

Megatron-Core's ``FullCudaGraphWrapper.data_read`` copies each raw micro batch into static device buffers before
the forward step runs; Megatron-Bridge's ``get_batch_from_iterator`` then reads ``max_seqlen_q``/``max_seqlen_kv``
back with ``.cpu()``. Inside the capture that device-to-host copy is illegal, so Megatron-Bridge's own packed
batches (``pad_cu_seqlens``: fixed ``cu_seqlens`` length, one ``max_seqlen`` from the pack metadata) cannot be
captured as they are. :func:`install` wraps ``data_read``:

- every raw THD batch (host tensors, straight from the collate) must keep the shapes of the first one, and its
  ``max_seqlen`` the first one's value (the one the graph is captured with): a change raises
  :class:`StaticShapeMismatchError` before ``data_read`` would fail in ``copy_`` or broadcast a one-entry
  tensor silently;
- the step receives the static buffers with ``max_seqlen`` as a host tensor of that value, so the read-back is a
  no-op and nothing in the captured step reads a device tensor on the host.

``mbridge_seqpack.install()`` (and so ``MBRIDGE_SEQPACK_MODE``, for ``pretrain()``/``finetune()`` and Megatron-Bridge's
recipe runner) installs it; batches without ``cu_seqlens`` pass through untouched.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import torch

from mbridge_seqpack.errors import SeqpackError
from mbridge_seqpack.modes import ACTIVE_MODES, env_mode
from mbridge_seqpack.switched import switched

__all__ = [
    "install",
    "uninstall",
    "is_installed",
    "installed",
    "data_read_is_wrapped",
    "autoload_present",
    "injection_state",
    "injection_active",
    "StaticShapeMismatchError",
    "HostMaxSeqlen",
    "host_max_seqlen",
]

HOST_KEYS = ("max_seqlen_q", "max_seqlen_kv", "max_seqlen")
THD_KEYS = ("cu_seqlens_q", "cu_seqlens")
_FLAG = "__mbridge_seqpack_static_thd__"
_original: Callable[..., Any] | None = None


class StaticShapeMismatchError(SeqpackError):
    """A packed batch whose shapes or ``max_seqlen`` differ from the batch the graph was captured with."""


def _wrapper_class() -> type:
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper

    return FullCudaGraphWrapper


def is_installed() -> bool:
    return _original is not None


def data_read_is_wrapped() -> bool:
    """Whether ``FullCudaGraphWrapper.data_read`` on the class is mbridge_seqpack's wrapper right now (what a
    full-iteration graph built in this process would call)."""
    return bool(getattr(_wrapper_class().__dict__.get("data_read"), _FLAG, False))


#: the start-up hook the wheel puts into site-packages (``integrations.autoload`` via one ``import`` line)
AUTOLOAD_PTH = "mbridge_seqpack_autoload.pth"


def autoload_present() -> bool:
    """Whether this interpreter's site directories hold the start-up hook, so a process launched from this
    environment with ``MBRIDGE_SEQPACK_MODE`` set installs the plugin (and the injection) when Megatron-Bridge's
    config module is imported."""
    import site
    import sys

    dirs = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    return any((Path(d) / AUTOLOAD_PTH).is_file() for d in dirs if isinstance(d, str) and d)


InjectionState = Literal["installed", "replaced", "launch", "missing"]


def injection_state() -> InjectionState:
    """Where the host ``max_seqlen`` injection stands for a full-iteration graph over packed batches:

    - ``installed``: the wrapper is on ``FullCudaGraphWrapper.data_read`` in this process;
    - ``replaced``: :func:`install` ran in this process (the plugin is live here, so this is a process that trains)
      but the class attribute is no longer the wrapper (reassigned or the module reloaded after it);
    - ``launch``: not installed here (a pre-launch check), and ``MBRIDGE_SEQPACK_MODE`` is on with the start-up hook
      present in this environment, so the launched process installs it;
    - ``missing``: none of these."""
    if data_read_is_wrapped():
        return "installed"
    if is_installed():
        return "replaced"
    if env_mode() in ACTIVE_MODES and autoload_present():
        return "launch"
    return "missing"


def injection_active() -> bool:
    """The injection will be on ``data_read`` where the graph is built: installed here, or launched with it."""
    return injection_state() in ("installed", "launch")


def installed(on: bool) -> contextlib.AbstractContextManager[None]:
    """The wrapper on ``data_read`` (``on``) or Megatron-Core's own, for the duration; the previous state after."""
    return switched(on, is_installed, install, uninstall)


class HostMaxSeqlen:
    """Checks raw THD batches of one stage (training or validation) against the first one, and remembers each
    batch's host ``max_seqlen`` tensors. Reads host tensors only."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.shapes: dict[str, tuple[int, ...]] | None = None
        self.values: dict[str, int] = {}

    def check(self, batch: Any) -> dict[str, torch.Tensor] | None:
        """The host ``max_seqlen`` tensors to hand the step for ``batch``; None for a batch without THD keys."""
        if not isinstance(batch, dict) or not any(batch.get(k) is not None for k in THD_KEYS):
            return None
        shapes = {k: tuple(v.shape) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        if self.shapes is None:
            self.shapes = shapes
        elif shapes != self.shapes:
            changed = sorted(k for k in shapes.keys() | self.shapes.keys() if shapes.get(k) != self.shapes.get(k))
            raise StaticShapeMismatchError(
                f"full-iteration CUDA graph ({self.stage}): packed batch shapes changed for {', '.join(changed)}: "
                + "; ".join(f"{k} {self.shapes.get(k)} -> {shapes.get(k)}" for k in changed)
                + ". The graph replays the first shapes; pack with pad_to_max_length=True and "
                "offline_packing_specs.pad_cu_seqlens=True (fixed width, fixed cu_seqlens length)"
            )
        host = {}
        for key in HOST_KEYS:
            value = batch.get(key)
            if not isinstance(value, torch.Tensor):
                continue
            if value.device.type != "cpu":
                raise StaticShapeMismatchError(
                    f"full-iteration CUDA graph ({self.stage}): batch['{key}'] is on {value.device}; static THD "
                    "reads max_seqlen from the collate's host tensors (Megatron-Bridge's packed collate)"
                )
            number = int(value.reshape(-1)[0])
            if value.numel() != 1 or (value != number).any():
                raise StaticShapeMismatchError(
                    f"full-iteration CUDA graph ({self.stage}): batch['{key}'] holds {value.reshape(-1).tolist()}; "
                    "one micro batch needs one max_seqlen"
                )
            first = self.values.setdefault(key, number)
            if number != first:
                raise StaticShapeMismatchError(
                    f"full-iteration CUDA graph ({self.stage}): {key} changed from {first} to {number}; the graph "
                    "replays the captured value. Turn on offline_packing_specs.pad_cu_seqlens=True (one max_seqlen "
                    "from the pack metadata)"
                )
            host[key] = value.detach().clone()
        return host


class _Recording:
    """The raw data iterator as ``data_read`` calls it (``next``), checking and remembering each batch."""

    def __init__(self, iterator: Any, checker: HostMaxSeqlen, seen: list[dict[str, torch.Tensor] | None]) -> None:
        self._iterator, self._checker, self._seen = iterator, checker, seen

    def __iter__(self) -> "_Recording":
        return self

    def __next__(self) -> Any:
        batch = next(self._iterator)
        self._seen.append(self._checker.check(batch))
        return batch


def _recording(iterator: Any, checker: HostMaxSeqlen, seen: list[dict[str, torch.Tensor] | None]) -> Any:
    return None if iterator is None else _Recording(iterator, checker, seen)


def host_max_seqlen(static_batches: Iterator[Any], seen: list[dict[str, torch.Tensor] | None]) -> Iterator[Any]:
    """The static buffers ``data_read`` produced, each with its batch's host ``max_seqlen`` (a shallow copy: the
    device tensors are the buffers themselves, which the graph replays)."""
    out = []
    for static, host in zip(static_batches, seen, strict=True):
        out.append({**static, **host} if host else static)
    return iter(out)


def _checker(wrapper: Any, training: bool) -> HostMaxSeqlen:
    stage = "training" if training else "validation"
    checkers = wrapper.__dict__.setdefault("_mbridge_seqpack_checkers", {})
    return checkers.setdefault(stage, HostMaxSeqlen(stage))


def _make_data_read(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def data_read(self: Any, data_iterator: Any, model: Any, training: bool, num_microbatches: int) -> Any:
        checker = _checker(self, training)
        chunks = data_iterator if isinstance(data_iterator, list) else [data_iterator]
        seen: list[list[dict[str, torch.Tensor] | None]] = [[] for _ in chunks]
        recorded = [_recording(it, checker, s) for it, s in zip(chunks, seen)]
        data_list = original(
            self, recorded if isinstance(data_iterator, list) else recorded[0], model, training, num_microbatches
        )
        return [None if it is None else host_max_seqlen(it, s) for it, s in zip(data_list, seen)]

    setattr(data_read, _FLAG, True)
    return data_read


def install() -> None:
    """Wrap ``FullCudaGraphWrapper.data_read``; idempotent."""
    global _original
    if _original is not None:
        return
    cls = _wrapper_class()
    current = cls.__dict__["data_read"]
    if getattr(current, _FLAG, False):  # a reloaded module left a wrapper behind
        current = current.__wrapped__
    _original = current
    cls.data_read = _make_data_read(current)


def uninstall() -> None:
    """Put back the exact original ``data_read``; a no-op when not installed."""
    global _original
    if _original is None:
        return
    _wrapper_class().data_read = _original
    _original = None
