"""The host-read recorder: what a CUDA-graph capture forbids, found by running the captured code on CPU tensors.

A CUDA graph records device work only. Inside ``torch.cuda.graph(...)`` every read of a device tensor's values on
the host (``.item()``, ``.tolist()``, ``if tensor:``, ``.cpu()``, ``.numpy()``, ``int(t)``, a slice bounded by a
tensor), every op whose output shape depends on device values (``nonzero``, ``masked_select``, ``unique``, boolean
indexing, ``repeat_interleave`` without ``output_size``) and every synchronization (``torch.cuda.synchronize``,
``Event.synchronize``, ``torch.distributed.barrier``) fails the capture or bakes one step's values into every
replay.

:class:`HostReadRecorder` is the package's :class:`~mbridge_seqpack.capture.stand_ins.DeviceTracker` (CPU tensors that
stand for device tensors) that records each host read of one, with the frames of Megatron / Transformer Engine code
that made it; reads of real host tensors (the collate's, a host ``max_seqlen``) are not. While
:meth:`HostReadRecorder.capturing` is off (the work ``FullCudaGraphWrapper`` does before the capture, ``data_read``)
tensors are still tracked but nothing is recorded. :func:`cuda_stand_ins` adds to the package's ``torch.cuda``
stand-ins the watches of object collectives and of threads started while recording. Only the regeneration of the
package's ``capture/verdicts.json`` (``devtools/capture/verdicts.py``) and ``scripts/gpu_check.py`` run it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_flatten

from mbridge_seqpack.capture.cpu_world import cpu_world
from mbridge_seqpack.capture.stand_ins import DeviceTracker, cuda_patches, patched, to_target
from mbridge_seqpack.capture.verdicts import HostRead
from mbridge_seqpack.frames import library_path, site_of

__all__ = ["HostReadRecorder", "cuda_stand_ins", "library_frames", "recording_world", "OBJECT_COLLECTIVES"]

_T = torch.Tensor
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


def library_frames(skip: int) -> list[tuple[str, int, str]]:
    """The installed-library frames of the stack ``skip`` frames up, outermost first, as (path, line, function)."""
    frames = []
    frame = sys._getframe(skip)
    while frame is not None:
        path = library_path(frame.f_code.co_filename)
        if path is not None:
            frames.append((path, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return frames[::-1]


class HostReadRecorder(DeviceTracker):
    """Tracks which CPU tensors stand for device tensors and records every host read of one (with ``real_device``,
    of each tensor really on that device: nothing stood in for)."""

    def __init__(self, real_device: str | None = None) -> None:
        super().__init__()
        self.reads: list[HostRead] = []
        self.real_device = real_device  # None: CPU tensors stand for device tensors; "cuda": the real ones
        self._recording = True
        self._thread = threading.get_ident()
        self._threads: set[int] = set()  # threads started while recording (they enter the mode themselves)

    def is_device(self, value: Any) -> bool:
        if self.real_device is not None:
            return isinstance(value, torch.Tensor) and value.device.type == self.real_device
        return DeviceTracker.is_device(self, value)  # (no super(): scripts/mutate_capture.py re-executes this)

    def stand_ins(self) -> contextlib.AbstractContextManager[None]:
        return cuda_stand_ins(self)

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
        site, stack = site_of(library_frames(skip + 1))
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
        return super().__torch_function__(func, types, args, kwargs)

    def _on_real_device(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        """The real-device mode: nothing stood in for, every host read of a tensor on ``real_device`` recorded."""
        if func is _T.cpu and self.is_device(args[0]):
            self.record("device-to-host copy (.cpu())", skip=3)
        elif func is _T.to and self.is_device(args[0]) and to_target(args, kwargs)[0] == "cpu":
            self.record("device-to-host copy (.to('cpu'))", skip=3)
        elif func is _T.copy_ and len(args) >= 2 and self.is_device(args[1]) and not self.is_device(args[0]):
            self.record("device-to-host copy (copy_ into a host tensor)", skip=3)
        elif func not in (_T.cpu, _T.to, _T.copy_) and self._any_device(args, kwargs):
            self.check_read(func, args, kwargs)  # (a frame deeper: only library frames name a site)
        return func(*args, **kwargs)

    def _check_collective(self, func: Callable, args: tuple, kwargs: dict) -> None:
        """A collective over a host tensor: NCCL, which the real run uses, takes device tensors only."""
        if func.__name__ not in _COLLECTIVES:
            return
        leaves, _ = tree_flatten((args, kwargs))
        if any(isinstance(leaf, torch.Tensor) and not self.is_device(leaf) for leaf in leaves):
            self.record(f"host collective ({func.__name__} on a host tensor)", skip=3)

    def check_read(self, func: Callable, args: tuple, kwargs: dict) -> None:
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


def cuda_stand_ins(recorder: HostReadRecorder) -> contextlib.AbstractContextManager[None]:
    """The package's host stand-ins for the ``torch.cuda`` calls Megatron makes around the captured work (streams,
    events, the current device), recording ``torch.cuda.synchronize`` / ``torch.distributed.barrier``, with the
    watches of object collectives and threads started while recording. With ``recorder.real_device`` nothing is
    stood in for: the synchronizing calls, object collectives and threads are recorded and then run."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    keys = [(torch.cuda, "synchronize"), (dist, "barrier"), (threading.Thread, "start")]
    keys += [(c10d, name) for name in OBJECT_COLLECTIVES]
    real = {key: getattr(*key) for key in keys}
    if recorder.real_device is None:
        patches = cuda_patches(recorder)
    else:

        def synchronize(device: Any = None) -> None:
            recorder.record("synchronization (torch.cuda.synchronize)")
            real[(torch.cuda, "synchronize")](device)

        def barrier(*args: Any, **kwargs: Any) -> None:
            recorder.record("synchronization (torch.distributed.barrier)")
            real[(dist, "barrier")](*args, **kwargs)

        patches = {(torch.cuda, "synchronize"): synchronize, (dist, "barrier"): barrier}
    return patched({**patches, **_watches(recorder, real)})


@contextlib.contextmanager
def recording_world() -> Iterator[HostReadRecorder]:
    """The package's one-rank CPU world with a recorder, active and not yet capturing (the caller opens the captured
    region: ``recorder.capturing(True)``)."""
    recorder = HostReadRecorder()
    with recorder.capturing(False), cpu_world(recorder):
        yield recorder
