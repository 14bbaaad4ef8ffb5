"""CPU tensors that stand for device tensors: the code a GPU run executes, run on the host.

A run on CPU (the minimal launch, the router correction, the capture verdicts' runs) calls Megatron's code as the GPU
run would: that code moves tensors to the device (``.cuda()``, ``.to("cuda")``), creates them there
(``device="cuda"``, ``torch.cuda.current_device()``) and branches on ``tensor.device`` / ``tensor.is_cuda``.
:class:`DeviceTracker` is a ``TorchFunctionMode`` that knows which CPU tensors would live on the device (those moved
or created there and everything computed from them) and answers for them as the device would, keeping the data on
the host. :func:`cuda_stand_ins` replaces the few ``torch.cuda`` entry points Megatron calls (streams, events, the
current device, ``synchronize``) with host stand-ins for the run.

Each host read of a device tensor passes through :meth:`DeviceTracker.record` and :meth:`DeviceTracker.check_read`,
which do nothing here: the recorder that regenerates the capture verdicts (``devtools/capture/recorder.py``, outside
the wheel) records them.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["DeviceTracker", "cuda_stand_ins", "patched"]

_T = torch.Tensor
#: the C getters of ``Tensor.device`` / ``Tensor.is_cuda`` (a mode sees ``<getter>.__get__``)
_DEVICE_GETTER = torch._C.TensorBase.__dict__["device"]
_IS_CUDA_GETTER = torch._C.TensorBase.__dict__["is_cuda"]
_STAND_IN_DEVICE = torch.device("cuda", 0)


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # an ordinal: torch.cuda.current_device()
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def to_target(args: tuple, kwargs: dict) -> tuple[str | None, tuple, dict]:
    """Where ``Tensor.to(...)`` moves a tensor ("cuda", "cpu" or None for a dtype change) and the call's arguments
    with a CUDA device replaced by the CPU."""
    rest, kw = list(args[1:]), dict(kwargs)
    target: str | None = None
    if "device" in kw:
        target = "cuda" if _is_cuda(kw["device"]) else "cpu"
        if target == "cuda":
            kw["device"] = "cpu"
    elif rest and isinstance(rest[0], torch.Tensor):
        target = None  # .to(other): other's device is this run's device already
    elif rest and isinstance(rest[0], (str, torch.device, int)) and not isinstance(rest[0], bool):
        target = "cuda" if _is_cuda(rest[0]) else "cpu"
        if target == "cuda":
            rest[0] = "cpu"
    return target, (args[0], *rest), kw


class DeviceTracker(TorchFunctionMode):
    """Tracks which CPU tensors stand for device tensors, and answers for them as the device would."""

    def __init__(self) -> None:
        super().__init__()
        self._device: WeakIdKeyDictionary = WeakIdKeyDictionary()

    # ---- device tensors ------------------------------------------------------------------------------------
    def on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mark ``tensor`` as a device tensor (it stands for one on the GPU)."""
        self._device[tensor] = True
        return tensor

    def is_device(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor) and value in self._device

    def _any_device(self, args: tuple, kwargs: dict) -> bool:
        leaves, _ = tree_flatten((args, kwargs))
        return any(self.is_device(leaf) for leaf in leaves)

    def _mark_all(self, out: Any) -> Any:
        leaves, _ = tree_flatten(out)
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                self._device[leaf] = True
        return out

    def stand_ins(self) -> contextlib.AbstractContextManager[None]:
        """The ``torch.cuda`` stand-ins a run with this tracker needs (:func:`cuda_stand_ins`)."""
        return cuda_stand_ins(self)

    # ---- host reads: seen, not recorded (the verdicts' recorder records them) ---------------------------------
    def record(self, op: str, skip: int = 2) -> None:
        """A host read of a device tensor (``op``), ``skip`` frames above the caller."""

    def check_read(self, func: Callable, args: tuple, kwargs: dict) -> None:
        """``func`` called with a device tensor among its arguments: a host read if it reads values or sizes."""

    # ---- the mode ------------------------------------------------------------------------------------------
    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if getattr(func, "__module__", None) == "torch.distributed.distributed_c10d":
            return func(*args, **kwargs)
        # a device tensor says it is one (code branches on .device / .is_cuda)
        owner = getattr(func, "__self__", None)
        if owner is _DEVICE_GETTER or owner is _IS_CUDA_GETTER:
            if self.is_device(args[0]):
                return _STAND_IN_DEVICE if owner is _DEVICE_GETTER else True
            return func(*args, **kwargs)
        if func is _T.get_device and self.is_device(args[0]):
            return 0
        # moves between host and device
        if func is _T.cuda:
            out = args[0].detach().clone() if not self.is_device(args[0]) else args[0]
            return self.on_device(out.requires_grad_(args[0].requires_grad) if out is not args[0] else out)
        if func is _T.cpu:
            if self.is_device(args[0]):
                self.record("device-to-host copy (.cpu())")
                return args[0].detach().clone().requires_grad_(args[0].requires_grad)
            return func(*args, **kwargs)
        if func is _T.to:
            target, call_args, call_kwargs = to_target(args, kwargs)
            if target == "cpu" and self.is_device(args[0]):
                self.record("device-to-host copy (.to('cpu'))")
                out = func(*call_args, **call_kwargs)
                return out.detach().clone() if out is args[0] else out
            out = func(*call_args, **call_kwargs)
            if target == "cuda" or self.is_device(args[0]):
                if out is args[0] and not self.is_device(out):
                    out = out.clone()
                self.on_device(out)
            return out
        if func in (_T.record_stream, _T.pin_memory):
            return args[0] if func is _T.pin_memory else None
        if func is _T.copy_ and len(args) >= 2:
            if self.is_device(args[1]) and not self.is_device(args[0]):
                self.record("device-to-host copy (copy_ into a host tensor)")
                return func(*args, **kwargs)
        # value reads and value-dependent shapes
        device_args = self._any_device(args, kwargs)
        if device_args:
            self.check_read(func, args, kwargs)
        # creation on the device
        created_on_device = False
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
            created_on_device = True
        out = func(*args, **kwargs)
        if created_on_device or device_args:
            if isinstance(out, (bool, int, float, str)) or out is None:
                return out
            self._mark_all(out)
        return out


# ---- torch.cuda stand-ins --------------------------------------------------------------------------------------


class _Event:
    def __init__(self, tracker: DeviceTracker | None = None, **_: Any) -> None:
        self._tracker = tracker

    def record(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        if self._tracker is not None:
            self._tracker.record("synchronization (Event.synchronize)")

    def query(self) -> bool:
        if self._tracker is not None:
            self._tracker.record("synchronization (Event.query)")
        return True

    def wait(self, stream: Any = None) -> None:
        return None

    def elapsed_time(self, other: Any) -> float:
        if self._tracker is not None:
            self._tracker.record("synchronization (Event.elapsed_time)")
        return 0.0


class _Stream(torch.Stream):
    """A host stream object (``torch.Stream`` on the CPU, so ``Tensor.record_stream`` accepts it)."""

    def __new__(cls, tracker: DeviceTracker | None = None, **_: Any) -> "_Stream":
        return super().__new__(cls, device="cpu")

    def __init__(self, tracker: DeviceTracker | None = None, **_: Any) -> None:
        self._tracker = tracker

    def wait_stream(self, other: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> _Event:
        return event if event is not None else _Event(self._tracker)

    def synchronize(self) -> None:
        if self._tracker is not None:
            self._tracker.record("synchronization (Stream.synchronize)")

    def query(self) -> bool:
        return True

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


@contextlib.contextmanager
def patched(patches: dict[tuple[Any, str], Any]) -> Iterator[None]:
    """Each ``(owner, name)`` set to its value for the block, put back after."""
    saved = {key: getattr(*key) for key in patches}
    try:
        for (owner, name), value in patches.items():
            setattr(owner, name, value)
        yield
    finally:
        for (owner, name), value in saved.items():
            setattr(owner, name, value)


def cuda_patches(tracker: DeviceTracker) -> dict[tuple[Any, str], Any]:
    """Host stand-ins for the ``torch.cuda`` calls Megatron makes around its device work (streams, events, the
    current device); ``torch.cuda.synchronize`` and ``torch.distributed.barrier`` pass through ``tracker.record``."""
    import torch.distributed as dist

    default = _Stream(tracker)

    def synchronize(device: Any = None) -> None:
        tracker.record("synchronization (torch.cuda.synchronize)")

    def barrier(*args: Any, **kwargs: Any) -> None:
        tracker.record("synchronization (torch.distributed.barrier)")

    return {
        (torch.cuda, "synchronize"): synchronize,
        (dist, "barrier"): barrier,
        (torch.cuda, "Stream"): lambda *args, **kwargs: _Stream(tracker),
        (torch.cuda, "Event"): lambda *args, **kwargs: _Event(tracker),
        (torch.cuda, "current_stream"): lambda device=None: default,
        (torch.cuda, "default_stream"): lambda device=None: default,
        (torch.cuda, "stream"): lambda stream=None: contextlib.nullcontext(stream),
        (torch.cuda, "current_device"): lambda: 0,
        **_cached_streams(),
    }


def _cached_streams() -> dict[tuple[Any, str], Any]:
    """Streams Megatron-Core keeps on a class for the whole process, made on first use
    (``MoEAlltoAllTokenDispatcher.cuda_dtoh_stream``): unset for the block, so the block's stand-ins make them and
    a stream made under an earlier block's tracker (its events recording there) is not reused."""
    try:
        from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
    except ImportError:  # Megatron-Core not installed (the device check's torch-only run): nothing cached
        return {}
    return {(MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream"): None}


def cuda_stand_ins(tracker: DeviceTracker) -> contextlib.AbstractContextManager[None]:
    """:func:`cuda_patches` in place for the block."""
    return patched(cuda_patches(tracker))
