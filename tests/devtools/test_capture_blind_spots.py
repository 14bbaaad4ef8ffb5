"""The host reads issue #42 found the recorder blind to, each run through the real recorder on a small function
that does exactly that (the sizes, fills and split points of tests/devtools/test_capture_recorder.py's table are its
first part): sizes and fills in other spellings, lists of device scalars, object collectives, collectives over host
tensors (NCCL takes device tensors), reads on a thread started inside the step, and the recorder on a real device."""

from __future__ import annotations

import threading
from typing import Any, Iterator

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from devtools.capture.recorder import OBJECT_COLLECTIVES, HostReadRecorder, cuda_stand_ins


@pytest.fixture(scope="module")
def one_rank() -> Iterator[None]:
    """A one-rank gloo world, as the capture runs have (capture/cpu_world.py)."""
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


def _ops(fn: Any, real_device: str | None = None) -> list[str]:
    """What ``fn(x)`` records, ``x`` standing for the device tensor ``[0, 3, 7, 16]``."""
    recorder = HostReadRecorder(real_device)
    with cuda_stand_ins(recorder), recorder:
        with recorder.capturing(False):
            x = torch.tensor([0, 3, 7, 16]).cuda() if real_device is None else torch.tensor([0, 3, 7, 16])
        fn(x)
    return [r.op for r in recorder.reads]


@pytest.mark.parametrize(
    ("read", "op"),
    [
        (lambda x: torch.arange(0, x[1]), "host read (size from a tensor: torch.arange)"),
        (lambda x: torch.zeros((x[1], 2)), "host read (size from a tensor: torch.zeros)"),
        (lambda x: torch.empty(x[1], device="cuda"), "host read (size from a tensor: torch.empty)"),
        (lambda x: x.float().view(x[1] - 2, -1), "host read (size from a tensor: view)"),
        (lambda x: torch.full((x[1],), 0.0), "host read (size from a tensor: torch.full)"),
        (lambda x: torch.full((2,), x[1], device="cuda"), "host read (fill value from a tensor: torch.full)"),
        (lambda x: F.one_hot(torch.arange(3).cuda()), "value-dependent shape (one_hot without num_classes)"),
        (lambda x: F.one_hot(torch.arange(3), x[-1]), "host read (num_classes from a tensor: one_hot)"),
        (lambda x: x.tensor_split(x[1:3]), "host read (tensor_split points from a tensor)"),
        (lambda x: torch.tensor([x[0], x[1]]), "host read (device scalars in a list: torch.tensor)"),
        (lambda x: x.new_tensor([x[1]]), "host read (device scalars in a list: new_tensor)"),
    ],
)
def test_sizes_fills_and_points_from_a_device_tensor_are_recorded(read: Any, op: str) -> None:
    assert _ops(read) == [op]


def test_the_same_calls_with_host_values_read_nothing() -> None:
    def run(x: torch.Tensor) -> None:
        n = x.shape[0]
        torch.arange(0, n), torch.zeros((n, 2)), x.float().view(n // 2, -1), torch.full((n,), 0.0)
        F.one_hot(torch.arange(3).cuda(), 3), x.tensor_split([1, 3]), torch.tensor([1, 2]), torch.as_tensor(x)

    assert _ops(run) == []


@pytest.mark.parametrize("name", OBJECT_COLLECTIVES[:3])
def test_object_collectives_are_recorded_once(one_rank: None, name: str) -> None:
    calls = {
        "all_gather_object": lambda: dist.all_gather_object([None], {"n": 1}),
        "gather_object": lambda: dist.gather_object({"n": 1}, [None], dst=0),
        "broadcast_object_list": lambda: dist.broadcast_object_list([{"n": 1}], src=0),
    }
    assert _ops(lambda x: calls[name]()) == [f"object collective (torch.distributed.{name})"]


def test_a_collective_over_a_host_tensor_is_recorded(one_rank: None) -> None:
    """The stand-in world runs every collective on gloo; the real run's NCCL takes device tensors only, so a host
    tensor there is a host-side exchange (or an error), never a captured kernel."""

    def run(x: torch.Tensor) -> None:
        dist.all_reduce(x.float())  # a device tensor: NCCL, capturable
        dist.all_reduce(torch.ones(2))  # a host tensor
        out = torch.empty(2)
        dist.all_gather_into_tensor(out, torch.ones(2))

    with pytest.warns(FutureWarning):  # all_gather_into_tensor: deprecated for all_gather_single
        ops = _ops(run)
    assert ops == [
        "host collective (all_reduce on a host tensor)",
        "host collective (all_gather_single on a host tensor)",
    ]


def test_a_read_on_a_thread_started_in_the_step_is_recorded() -> None:
    def run(x: torch.Tensor) -> None:
        worker = threading.Thread(target=lambda: (x[1] * 2).item())
        worker.start()
        worker.join()

    assert _ops(run) == ["host read (item()) on a thread started in the step"]


def test_a_thread_started_outside_the_captured_region_counts_nothing() -> None:
    recorder = HostReadRecorder()
    with cuda_stand_ins(recorder), recorder:
        with recorder.capturing(False):
            x = torch.arange(4).cuda()
            worker = threading.Thread(target=lambda: x.tolist())
            worker.start()
            worker.join()
    assert recorder.reads == [] and threading.Thread.start is not None
    assert threading.Thread.start.__name__ == "start"  # put back


def test_the_recorder_on_a_real_device_records_what_is_there() -> None:
    """``real_device``: a tensor on that device is a device tensor as it is (here the CPU plays the device, so the
    mode's own path runs without a GPU); nothing is moved or stood in for."""

    def run(x: torch.Tensor) -> None:
        assert x.device.type == "cpu" and not x.is_cuda  # nothing stood in for
        x[1].item(), torch.nonzero(x), torch.zeros(x[1]), x.float().view(x[1] - 2, -1)
        worker = threading.Thread(target=lambda: x.tolist())
        worker.start()
        worker.join()

    assert _ops(run, real_device="cpu") == [
        "host read (item())",
        "value-dependent shape (nonzero)",
        "host read (size from a tensor: torch.zeros)",
        "host read (size from a tensor: view)",
        "host read (tolist()) on a thread started in the step",
    ]
    assert _ops(lambda x: x[1].item(), real_device="cuda") == []  # a host tensor's read is no device read
