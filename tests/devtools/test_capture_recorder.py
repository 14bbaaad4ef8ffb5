"""The host-read recorder (``devtools/capture/recorder.py``) on its own: each kind of host read of a tensor that
stands for a device tensor is recorded, host data and shape-only work are not, nothing before the captured region."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from devtools.capture.recorder import HostReadRecorder, cuda_stand_ins


def _record(fn: Any) -> tuple[HostReadRecorder, Any]:
    """Run ``fn(recorder, x)`` where ``x`` stands for a device tensor ``[0, 3, 7, 16]``; return what it recorded."""
    recorder = HostReadRecorder()
    with cuda_stand_ins(recorder), recorder:
        with recorder.capturing(False):
            x = torch.tensor([0, 3, 7, 16], dtype=torch.int32).cuda()
        out = fn(recorder, x)
    return recorder, out


def _ops(recorder: HostReadRecorder) -> list[str]:
    return [r.op for r in recorder.reads]


@pytest.mark.parametrize(
    ("read", "op"),
    [
        (lambda r, x: x[1].item(), "host read (item())"),
        (lambda r, x: x.tolist(), "host read (tolist())"),
        (lambda r, x: bool(x[1] > 2), "host read (bool(tensor))"),
        (lambda r, x: int(x[-1]), "host read (int(tensor))"),
        (lambda r, x: x.cpu(), "device-to-host copy (.cpu())"),
        (lambda r, x: x.to("cpu"), "device-to-host copy (.to('cpu'))"),
        (lambda r, x: x.numpy(), "host read (numpy())"),
        (lambda r, x: torch.zeros(4, dtype=torch.int32).copy_(x), "device-to-host copy (copy_ into a host tensor)"),
        (lambda r, x: torch.nonzero(x), "value-dependent shape (nonzero)"),
        (lambda r, x: x[x > 2], "value-dependent shape (boolean mask index)"),
        (lambda r, x: x.masked_select(x > 2), "value-dependent shape (masked_select)"),
        (lambda r, x: torch.unique(x), "value-dependent shape (unique)"),
        (
            lambda r, x: torch.repeat_interleave(torch.arange(3), x[1:] - x[:-1]),
            "value-dependent shape (repeat_interleave without output_size)",
        ),  # fmt: skip
        (lambda r, x: x[x[0] : x[1]], "host read (slice bounds from a tensor)"),
        (lambda r, x: torch.split(torch.zeros(16), (x[1:] - x[:-1]).tolist()), "host read (tolist())"),
        (lambda r, x: torch.cuda.synchronize(), "synchronization (torch.cuda.synchronize)"),
        (lambda r, x: torch.cuda.Event().synchronize(), "synchronization (Event.synchronize)"),
        (lambda r, x: f"{x[0]}", "host read (format(tensor))"),
        # sizes, fills and split points a device tensor gives (PyTorch reads each from C++: no call of their own)
        (lambda r, x: torch.arange(x[1]), "host read (size from a tensor: torch.arange)"),
        (lambda r, x: torch.empty(x[1]), "host read (size from a tensor: torch.empty)"),
        (lambda r, x: torch.zeros(x[1], 2), "host read (size from a tensor: torch.zeros)"),
        (lambda r, x: torch.zeros(16).cuda().view(x[1] - 1, -1), "host read (size from a tensor: view)"),
        (lambda r, x: torch.full((2,), x[1]), "host read (fill value from a tensor: torch.full)"),
        (
            lambda r, x: torch.nn.functional.one_hot(x.long()),
            "value-dependent shape (one_hot without num_classes)",
        ),  # fmt: skip
        (
            lambda r, x: torch.tensor_split(torch.zeros(16), x[1:3].long()),
            "host read (tensor_split points from a tensor)",
        ),  # fmt: skip
    ],
)
def test_each_kind_of_host_read_of_a_device_tensor_is_recorded(read: Any, op: str) -> None:
    recorder, _ = _record(read)
    assert _ops(recorder) == [op]
    assert recorder.reads[0].site == "<outside Megatron>"  # the test's own frame is no library code


def test_device_tensors_say_so_and_what_they_make_is_on_the_device() -> None:
    def run(recorder: HostReadRecorder, x: torch.Tensor) -> Any:
        made = torch.empty(2, device=torch.cuda.current_device())
        like = torch.tensor([5], device=x.device)
        derived = (x * 2)[1:]
        return made, like, derived, x.device, x.is_cuda, x.get_device()

    recorder, (made, like, derived, device, is_cuda, index) = _record(run)
    assert (device, is_cuda, index) == (torch.device("cuda", 0), True, 0)
    assert all(recorder.is_device(t) for t in (made, like, derived))
    assert made.device.type == like.device.type == "cpu"  # outside the recorder: the data is on the host
    assert recorder.reads == []


def test_host_tensors_and_shape_only_work_read_nothing() -> None:
    def run(recorder: HostReadRecorder, x: torch.Tensor) -> Any:
        host = torch.tensor([0, 3, 7, 16])
        host.tolist(), host.item() if host.numel() == 1 else int(host[0]), host.cpu()  # host reads of host data
        torch.repeat_interleave(torch.arange(3), x[1:] - x[:-1], output_size=16)  # static size
        torch.nn.functional.one_hot(x.long(), num_classes=17), torch.full((2,), 3), torch.arange(x.shape[0])
        torch.zeros(4).cuda().view(2, -1), torch.tensor_split(torch.zeros(16), [3, 7])
        y = x.clone()
        y[y > 5] = 0  # one boolean mask, a host scalar: ATen's masked_fill_ fast path
        return x.shape[0], x.size(0), x.numel(), x.reshape(2, 2), x.index_select(0, torch.tensor([0, 2]))

    recorder, _ = _record(run)
    assert recorder.reads == []


def test_nothing_is_recorded_outside_the_captured_region() -> None:
    recorder = HostReadRecorder()
    with cuda_stand_ins(recorder), recorder:
        with recorder.capturing(False):
            x = torch.arange(4).cuda()
            x.tolist()
            torch.cuda.synchronize()
        assert recorder.is_device(x) and recorder.reads == []
        x.tolist()
    assert _ops(recorder) == ["host read (tolist())"]


def test_the_stand_ins_are_put_back() -> None:
    before = (torch.cuda.synchronize, torch.cuda.Stream, torch.cuda.current_device)
    recorder = HostReadRecorder()
    with cuda_stand_ins(recorder):
        assert torch.cuda.current_device() == 0
    assert (torch.cuda.synchronize, torch.cuda.Stream, torch.cuda.current_device) == before
