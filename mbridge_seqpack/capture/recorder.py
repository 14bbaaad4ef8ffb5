"""A recorder of host reads: what a CUDA-graph capture forbids, found by running the captured code on CPU tensors.

A CUDA graph records device work only. Inside ``torch.cuda.graph(...)`` every read of a device tensor's values on
the host (``.item()``, ``.tolist()``, ``if tensor:``, ``.cpu()``, ``.numpy()``, ``int(t)``, a slice bounded by a
tensor), every op whose output shape depends on device values (``nonzero``, ``masked_select``, ``unique``, boolean
indexing, ``repeat_interleave`` without ``output_size``) and every synchronization (``torch.cuda.synchronize``,
``Event.synchronize``, ``torch.distributed.barrier``) fails the capture or bakes one step's values into every
replay.

Here CPU tensors stand in for device tensors. :class:`HostReadRecorder` is a ``TorchFunctionMode`` that knows which
CPU tensors would live on the device: those moved there (``.cuda()``, ``.to("cuda")``), those created there
(``device="cuda"``, ``torch.cuda.current_device()``) and everything computed from them. A host read of such a tensor
is recorded with the frames of Megatron / Transformer Engine code that made it; reads of real host tensors (the
collate's, a host ``max_seqlen``) are not. While :meth:`HostReadRecorder.capturing` is off (the work
``FullCudaGraphWrapper`` does before the capture, ``data_read``) tensors are still tracked but nothing is recorded.
:func:`cuda_stand_ins` replaces the few ``torch.cuda`` entry points Megatron calls (streams, events, the current
device, ``synchronize``) with host stand-ins for the run, recording the synchronizing ones.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["HostRead", "HostReadRecorder", "cuda_stand_ins", "library_path", "site_of", "LIBRARY_ROOTS"]

#: the code whose reads count: frames under these package roots name the site of a read
LIBRARY_ROOTS = ("megatron/", "transformer_engine/")

_T = torch.Tensor
#: the C getters of ``Tensor.device`` / ``Tensor.is_cuda`` (a mode sees ``<getter>.__get__``)
_DEVICE_GETTER = torch._C.TensorBase.__dict__["device"]
_IS_CUDA_GETTER = torch._C.TensorBase.__dict__["is_cuda"]
_STAND_IN_DEVICE = torch.device("cuda", 0)
#: reads of a device tensor's values on the host
_VALUE_READS: dict[Any, str] = {
    _T.item: "item()",
    _T.tolist: "tolist()",
    _T.__bool__: "bool(tensor)",
    _T.__int__: "int(tensor)",
    _T.__float__: "float(tensor)",
    _T.__index__: "index(tensor)",
    _T.__complex__: "complex(tensor)",
    _T.numpy: "numpy()",
    _T.__format__: "format(tensor)",
    _T.__repr__: "repr(tensor)",
    _T.__array__: "numpy(tensor)",
    _T.__contains__: "in tensor",
    torch.equal: "torch.equal",
    torch.allclose: "torch.allclose",
    torch.is_nonzero: "torch.is_nonzero",
}
#: ops whose output shape depends on the values of a device tensor
_DATA_DEPENDENT: dict[Any, str] = {
    torch.nonzero: "nonzero",
    _T.nonzero: "nonzero",
    torch.argwhere: "argwhere",
    _T.argwhere: "argwhere",
    torch.masked_select: "masked_select",
    _T.masked_select: "masked_select",
    torch.unique: "unique",
    _T.unique: "unique",
    torch.unique_consecutive: "unique_consecutive",
    _T.unique_consecutive: "unique_consecutive",
    torch.bincount: "bincount",
    _T.bincount: "bincount",
}


#: factories whose sizes (or range ends) a device tensor would give only by being read on the host first
_FACTORIES: dict[Any, str] = {
    torch.arange: "torch.arange",
    torch.empty: "torch.empty",
    torch.zeros: "torch.zeros",
    torch.ones: "torch.ones",
    torch.rand: "torch.rand",
    torch.randn: "torch.randn",
    torch.randint: "torch.randint",
    torch.randperm: "torch.randperm",
    torch.eye: "torch.eye",
    torch.linspace: "torch.linspace",
}
#: tensors built from Python data: a list of device scalars is read element by element on the host
_FROM_DATA: dict[Any, str] = {
    torch.tensor: "torch.tensor",
    torch.as_tensor: "torch.as_tensor",
    _T.new_tensor: "new_tensor",
}
#: ``torch.distributed`` collectives that dispatch through ``__torch_function__`` (``distributed_c10d``'s
#: ``has_torch_function(relevant_args)``; ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` reach them too)
_COLLECTIVES = frozenset(
    (
        "isend irecv send recv broadcast all_reduce all_reduce_coalesced reduce all_gather all_gather_single "
        "all_gather_coalesced gather scatter reduce_scatter reduce_scatter_single all_to_all_single all_to_all"
    ).split()
)
#: object collectives: pickled on the host, their sizes and bytes read back (``distributed_c10d``; no dispatch)
OBJECT_COLLECTIVES = (
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
)
#: tensor methods whose size arguments (after ``self``) a device tensor would give only by a host read
_SIZED_METHODS: dict[Any, str] = {
    _T.view: "view",
    _T.reshape: "reshape",
    torch.reshape: "reshape",
    _T.expand: "expand",
    _T.repeat: "repeat",
    _T.tile: "tile",
    torch.tile: "tile",
    _T.new_empty: "new_empty",
    _T.new_zeros: "new_zeros",
    _T.new_ones: "new_ones",
    _T.new_full: "new_full",
    _T.unflatten: "unflatten",
    _T.resize_: "resize_",
}


@dataclass(frozen=True)
class HostRead:
    """One host read: what it was (``op``), where (``site``: the innermost library frame) and the library frames
    that led there (outermost first)."""

    op: str
    site: str
    stack: tuple[str, ...] = field(default=(), compare=False)

    def describe(self) -> str:
        return f"{self.op} at {self.site}"

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "site": self.site, "stack": list(self.stack)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HostRead":
        return cls(data["op"], data["site"], tuple(data.get("stack", ())))


def library_path(filename: str) -> str | None:
    """``megatron/core/x.py`` for a frame in an installed library (None for other code)."""
    path = filename.replace("\\", "/")
    for root in LIBRARY_ROOTS:
        at = path.rfind("/site-packages/" + root)
        if at >= 0:
            return path[at + len("/site-packages/") :]
    return None


def site_of(frames: list[tuple[str, int, str]]) -> tuple[str, tuple[str, ...]]:
    """(innermost library frame, all library frames outermost first) as ``path:line function``."""
    named = [f"{path}:{line} {fn}" for path, line, fn in frames]
    return (named[-1] if named else "<outside Megatron>"), tuple(named)


def traceback_site(exc: BaseException) -> str | None:
    """The innermost installed-library frame of ``exc``'s traceback as ``path:line function`` (None: none)."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        path = library_path(tb.tb_frame.f_code.co_filename)
        if path is not None:
            frames.append((path, tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    return site_of(frames)[0] if frames else None


def _library_frames(skip: int) -> list[tuple[str, int, str]]:
    frames = []
    frame = sys._getframe(skip)
    while frame is not None:
        path = library_path(frame.f_code.co_filename)
        if path is not None:
            frames.append((path, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return frames[::-1]


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # an ordinal: torch.cuda.current_device()
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def _to_target(args: tuple, kwargs: dict) -> tuple[str | None, tuple, dict]:
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


class HostReadRecorder(TorchFunctionMode):
    """Tracks which CPU tensors stand for device tensors and records every host read of one."""

    def __init__(self, real_device: str | None = None) -> None:
        super().__init__()
        self.reads: list[HostRead] = []
        self.real_device = real_device  # None: CPU tensors stand for device tensors; "cuda": the real ones
        self._device: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._recording = True
        self._thread = threading.get_ident()
        self._threads: set[int] = set()  # threads started while recording (they enter the mode themselves)

    # ---- device tensors ------------------------------------------------------------------------------------
    def on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mark ``tensor`` as a device tensor (it stands for one on the GPU)."""
        self._device[tensor] = True
        return tensor

    def is_device(self, value: Any) -> bool:
        if not isinstance(value, torch.Tensor):
            return False
        if self.real_device is not None:
            return value.device.type == self.real_device
        return value in self._device

    def _any_device(self, args: tuple, kwargs: dict) -> bool:
        leaves, _ = tree_flatten((args, kwargs))
        return any(self.is_device(leaf) for leaf in leaves)

    def _mark_all(self, out: Any) -> Any:
        leaves, _ = tree_flatten(out)
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                self._device[leaf] = True
        return out

    # ---- recording -----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def capturing(self, on: bool) -> Iterator[None]:
        """Record host reads (on) or only track device tensors (off: work done before the capture)."""
        previous, self._recording = self._recording, on
        try:
            yield
        finally:
            self._recording = previous

    def recording(self) -> bool:
        """Whether a read made now, on this thread, counts (recording on; the run's thread or one it started)."""
        ident = threading.get_ident()
        return self._recording and (ident == self._thread or ident in self._threads)

    def record(self, op: str, skip: int = 2) -> None:
        """Record ``op`` at the innermost library frame above the caller (``skip`` frames up)."""
        if not self.recording():
            return
        if threading.get_ident() != self._thread:
            op += " on a thread started in the step"
        site, stack = site_of(_library_frames(skip + 1))
        self.reads.append(HostRead(op, site, stack))

    def traced(self, thread: threading.Thread) -> None:
        """Make ``thread`` (not started yet) run under this recorder and count its reads."""
        run = thread.run

        def traced_run() -> None:
            ident = threading.get_ident()
            self._threads.add(ident)
            try:
                with self:
                    run()
            finally:
                self._threads.discard(ident)

        thread.run = traced_run  # type: ignore[method-assign]

    # ---- the mode ------------------------------------------------------------------------------------------
    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if getattr(func, "__module__", None) == "torch.distributed.distributed_c10d":
            self._check_collective(func, args, kwargs)
            return func(*args, **kwargs)
        if self.real_device is not None:
            return self._on_real_device(func, args, kwargs)
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
            target, call_args, call_kwargs = _to_target(args, kwargs)
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
            self._check_read(func, args, kwargs)
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

    def _on_real_device(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        """The real-device mode: nothing stood in for, every host read of a tensor on ``real_device`` recorded."""
        if func is _T.cpu and self.is_device(args[0]):
            self.record("device-to-host copy (.cpu())", skip=3)
        elif func is _T.to and self.is_device(args[0]) and _to_target(args, kwargs)[0] == "cpu":
            self.record("device-to-host copy (.to('cpu'))", skip=3)
        elif func is _T.copy_ and len(args) >= 2 and self.is_device(args[1]) and not self.is_device(args[0]):
            self.record("device-to-host copy (copy_ into a host tensor)", skip=3)
        elif func not in (_T.cpu, _T.to, _T.copy_) and self._any_device(args, kwargs):
            self._check_read(func, args, kwargs)  # (a frame deeper: only library frames name a site)
        return func(*args, **kwargs)

    def _check_collective(self, func: Callable, args: tuple, kwargs: dict) -> None:
        """A collective over a host tensor: NCCL, which the real run uses, takes device tensors only."""
        if func.__name__ not in _COLLECTIVES:
            return
        leaves, _ = tree_flatten((args, kwargs))
        if any(isinstance(leaf, torch.Tensor) and not self.is_device(leaf) for leaf in leaves):
            self.record(f"host collective ({func.__name__} on a host tensor)", skip=3)

    def _check_read(self, func: Callable, args: tuple, kwargs: dict) -> None:
        if func in _VALUE_READS:
            self.record(f"host read ({_VALUE_READS[func]})", skip=3)
            return
        name = _DATA_DEPENDENT.get(func)
        if name:
            self.record(f"value-dependent shape ({name})", skip=3)
            return
        if func in (torch.repeat_interleave, _T.repeat_interleave):
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            single = len(args) == 1 and "repeats" not in kwargs  # repeat_interleave(repeats): counts are self
            counts = args[0] if single else repeats
            if self.is_device(counts) and kwargs.get("output_size") is None:
                self.record("value-dependent shape (repeat_interleave without output_size)", skip=3)
            return
        if func in (torch.where, torch.split, torch.narrow, _T.split, _T.narrow, _T.__getitem__, _T.__setitem__):
            self._check_indexing(func, args, kwargs)
            return
        self._check_sizes(func, args, kwargs)

    def _device_in(self, values: Any) -> bool:
        leaves, _ = tree_flatten(values)
        return any(self.is_device(leaf) for leaf in leaves)

    def _check_sizes(self, func: Callable, args: tuple, kwargs: dict) -> None:
        """Sizes, fills and split points a device tensor gives: PyTorch reads each on the host (``__index__`` /
        ``item()`` from C++, where the mode sees no call of its own)."""
        import torch.nn.functional as F

        sized = {k: v for k, v in kwargs.items() if k not in ("out", "device", "dtype", "layout", "generator")}
        if func in _FACTORIES and self._device_in((args, sized)):
            self.record(f"host read (size from a tensor: {_FACTORIES[func]})", skip=4)
        elif func in _SIZED_METHODS and self._device_in((args[1:], sized)):
            fill = func is _T.new_full and not self._device_in((args[1:2], sized.get("size")))
            self.record(
                f"host read ({'fill value' if fill else 'size'} from a tensor: {_SIZED_METHODS[func]})", skip=4
            )
        elif func is torch.full and self._device_in((args[1:], sized.get("fill_value"))):
            self.record("host read (fill value from a tensor: torch.full)", skip=4)
        elif func is torch.full and self._device_in((args[:1], sized.get("size"))):
            self.record("host read (size from a tensor: torch.full)", skip=4)
        elif func is F.one_hot:
            classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
            if self.is_device(classes):
                self.record("host read (num_classes from a tensor: one_hot)", skip=4)
            elif classes == -1:
                self.record("value-dependent shape (one_hot without num_classes)", skip=4)
        elif func in _FROM_DATA:
            data = args[1] if func is _T.new_tensor and len(args) > 1 else (args[0] if args else kwargs.get("data"))
            if isinstance(data, (list, tuple)) and self._device_in(data):
                self.record(f"host read (device scalars in a list: {_FROM_DATA[func]})", skip=4)
        elif func in (torch.tensor_split, _T.tensor_split):
            points = args[1] if len(args) > 1 else kwargs.get("indices_or_sections", kwargs.get("sections"))
            if self._device_in(points):
                self.record("host read (tensor_split points from a tensor)", skip=4)

    def _check_indexing(self, func: Callable, args: tuple, kwargs: dict) -> None:
        if func is torch.where and len(args) == 1 and not kwargs:
            self.record("value-dependent shape (where(condition))", skip=4)
        elif func in (torch.split, _T.split):
            sizes = args[1] if len(args) > 1 else kwargs.get("split_size_or_sections", kwargs.get("split_size"))
            if self.is_device(sizes):
                self.record("host read (split sizes from a tensor)", skip=4)
        elif func in (torch.narrow, _T.narrow):
            if any(self.is_device(a) for a in args[2:]):
                self.record("host read (narrow bounds from a tensor)", skip=4)
        elif func in (_T.__getitem__, _T.__setitem__):
            index = args[1] if len(args) > 1 else None
            parts = index if isinstance(index, tuple) else (index,)
            if func is _T.__setitem__ and self._masked_fill(parts, args[2] if len(args) > 2 else None):
                return
            for part in parts:
                if isinstance(part, slice) and any(self.is_device(b) for b in (part.start, part.stop, part.step)):
                    self.record("host read (slice bounds from a tensor)", skip=4)
                    return
                if self.is_device(part) and part.dtype in (torch.bool, torch.uint8):
                    self.record("value-dependent shape (boolean mask index)", skip=4)
                    return
                if self.is_device(part) and part.dim() == 0 and not part.dtype.is_floating_point:
                    self.record("host read (index from a 0-d tensor)", skip=4)
                    return

    def _masked_fill(self, parts: tuple, value: Any) -> bool:
        """``t[mask] = v`` with one boolean mask and a single host value runs as ``masked_fill_`` (ATen's
        ``canDispatchToMaskedFill``: ``value.numel() == 1 and value.device().is_cpu()``), reading nothing."""
        masks = [p for p in parts if isinstance(p, torch.Tensor) and p.dtype in (torch.bool, torch.uint8)]
        others = [p for p in parts if isinstance(p, torch.Tensor) and p.dtype not in (torch.bool, torch.uint8)]
        host_value = isinstance(value, (bool, int, float)) or (
            isinstance(value, torch.Tensor) and value.numel() == 1 and not self.is_device(value)
        )
        return len(masks) == 1 and not others and host_value


# ---- torch.cuda stand-ins --------------------------------------------------------------------------------------


class _Event:
    def __init__(self, recorder: HostReadRecorder | None = None, **_: Any) -> None:
        self._recorder = recorder

    def record(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        if self._recorder is not None:
            self._recorder.record("synchronization (Event.synchronize)")

    def query(self) -> bool:
        if self._recorder is not None:
            self._recorder.record("synchronization (Event.query)")
        return True

    def wait(self, stream: Any = None) -> None:
        return None

    def elapsed_time(self, other: Any) -> float:
        if self._recorder is not None:
            self._recorder.record("synchronization (Event.elapsed_time)")
        return 0.0


class _Stream(torch.Stream):
    """A host stream object (``torch.Stream`` on the CPU, so ``Tensor.record_stream`` accepts it)."""

    def __new__(cls, recorder: HostReadRecorder | None = None, **_: Any) -> "_Stream":
        return super().__new__(cls, device="cpu")

    def __init__(self, recorder: HostReadRecorder | None = None, **_: Any) -> None:
        self._recorder = recorder

    def wait_stream(self, other: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> _Event:
        return event if event is not None else _Event(self._recorder)

    def synchronize(self) -> None:
        if self._recorder is not None:
            self._recorder.record("synchronization (Stream.synchronize)")

    def query(self) -> bool:
        return True

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _watches(recorder: HostReadRecorder, real: dict[tuple[Any, str], Any]) -> dict[tuple[Any, str], Any]:
    """What runs on the device and on the host alike: object collectives and threads started while recording.
    ``real`` holds the originals (each watch calls through)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    def object_collective(name: str) -> Callable[..., Any]:
        original = real[(c10d, name)]

        @functools.wraps(original)
        def watched(*args: Any, **kwargs: Any) -> Any:
            recorder.record(f"object collective (torch.distributed.{name})")
            with recorder.capturing(False):  # its own host copies are this one read
                return original(*args, **kwargs)

        return watched

    start = real[(threading.Thread, "start")]

    def thread_start(thread: threading.Thread) -> None:
        if recorder.recording():
            recorder.traced(thread)
        start(thread)

    patches: dict[tuple[Any, str], Any] = {(threading.Thread, "start"): thread_start}
    for name in OBJECT_COLLECTIVES:
        patches[(c10d, name)] = patches[(dist, name)] = object_collective(name)
    return patches


@contextlib.contextmanager
def cuda_stand_ins(recorder: HostReadRecorder) -> Iterator[None]:
    """Host stand-ins for the ``torch.cuda`` calls Megatron makes around the captured work (streams, events,
    the current device), recording ``torch.cuda.synchronize`` / ``torch.distributed.barrier``, object collectives
    and threads started while recording. With ``recorder.real_device`` nothing is stood in for: the synchronizing
    calls, object collectives and threads are recorded and then run."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    keys = [(torch.cuda, "synchronize"), (dist, "barrier"), (threading.Thread, "start")]
    keys += [(c10d, name) for name in OBJECT_COLLECTIVES]
    real = {key: getattr(*key) for key in keys}
    default = _Stream(recorder)

    def synchronize(device: Any = None) -> None:
        recorder.record("synchronization (torch.cuda.synchronize)")
        if recorder.real_device is not None:
            real[(torch.cuda, "synchronize")](device)

    def barrier(*args: Any, **kwargs: Any) -> None:
        recorder.record("synchronization (torch.distributed.barrier)")
        if recorder.real_device is not None:
            real[(dist, "barrier")](*args, **kwargs)

    def stream_factory(*args: Any, **kwargs: Any) -> _Stream:
        return _Stream(recorder)

    def event_factory(*args: Any, **kwargs: Any) -> _Event:
        return _Event(recorder)

    patches: dict[tuple[Any, str], Any] = {(torch.cuda, "synchronize"): synchronize, (dist, "barrier"): barrier}
    if recorder.real_device is None:
        patches.update({
            (torch.cuda, "Stream"): stream_factory,
            (torch.cuda, "Event"): event_factory,
            (torch.cuda, "current_stream"): lambda device=None: default,
            (torch.cuda, "default_stream"): lambda device=None: default,
            (torch.cuda, "stream"): lambda stream=None: contextlib.nullcontext(stream),
            (torch.cuda, "current_device"): lambda: 0,
        })  # fmt: skip
    patches.update(_watches(recorder, real))
    saved = {key: getattr(*key) for key in patches}
    try:
        for (owner, name), value in patches.items():
            setattr(owner, name, value)
        yield
    finally:
        for (owner, name), value in saved.items():
            setattr(owner, name, value)


def keeps_environment(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with ``os.environ`` put back as it was when it returns: building a Megatron-Core model sets
    ``NVTE_FLASH_ATTN`` / ``NVTE_FUSED_ATTN`` / ``NVTE_UNFUSED_ATTN`` in the process environment
    (``LanguageModule._set_attention_backend``), which the attention rules then read as the launch's own."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        saved = dict(os.environ)
        try:
            return fn(*args, **kwargs)
        finally:
            for key in set(os.environ) - set(saved):
                del os.environ[key]
            for key, value in saved.items():
                if os.environ.get(key) != value:
                    os.environ[key] = value

    return wrapper
