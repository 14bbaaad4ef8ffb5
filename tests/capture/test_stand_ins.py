"""CPU tensors that stand for device tensors (``capture/stand_ins.py``), as the minimal launch and the equivalence
checks run them: Megatron's device code takes its GPU branches, the data stays on the host, host reads just read."""

from __future__ import annotations

import torch

from mbridge_seqpack.capture.stand_ins import DeviceTracker, cuda_stand_ins


def test_moved_and_created_tensors_answer_as_the_device() -> None:
    tracker = DeviceTracker()
    with cuda_stand_ins(tracker), tracker:
        x = torch.tensor([0, 3, 7, 16]).cuda()
        made = torch.zeros(2, device=torch.cuda.current_device())
        moved = torch.ones(2).to("cuda")
        derived = (x * 2)[1:]
        host = torch.arange(3)
        answers = (x.device, x.is_cuda, x.get_device(), derived.device, host.device, host.is_cuda)
        back = x.cpu()
        values = x.tolist()
        torch.cuda.synchronize()
        event = torch.cuda.Event()
        event.record()
        event.synchronize()
    assert answers == (torch.device("cuda", 0), True, 0, torch.device("cuda", 0), torch.device("cpu"), False)
    assert all(tracker.is_device(t) for t in (x, made, moved, derived))
    assert not tracker.is_device(host) and not tracker.is_device(back) and not tracker.is_device(3)
    assert x.device.type == made.device.type == "cpu"  # outside the mode: the data is on the host
    assert values == [0, 3, 7, 16] and back.tolist() == values


def test_the_torch_cuda_stand_ins_are_put_back() -> None:
    before = (torch.cuda.synchronize, torch.cuda.Stream, torch.cuda.Event, torch.cuda.current_device)
    with cuda_stand_ins(DeviceTracker()):
        assert torch.cuda.current_device() == 0
        assert torch.cuda.current_stream() is torch.cuda.default_stream()
    assert (torch.cuda.synchronize, torch.cuda.Stream, torch.cuda.Event, torch.cuda.current_device) == before


class _Recording(DeviceTracker):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def record(self, op: str, skip: int = 2) -> None:
        self.ops.append(op)


def test_a_stream_megatron_keeps_for_the_process_is_made_again_in_each_block(megatron_bridge: object) -> None:
    """Megatron-Core's alltoall dispatcher keeps its device-to-host stream on the class, made on first use: inside a
    block it is made by that block's stand-ins (its events' waits reach that block's tracker, not the first
    block's), and the process's own value is put back after. Without it, which capture run first made the stream
    decided whether a later run saw the dispatcher's Event.synchronize (the cached verdicts depended on the order)."""
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as Dispatcher

    kept = Dispatcher.cuda_dtoh_stream
    trackers = [_Recording(), _Recording()]
    for tracker in trackers:
        with cuda_stand_ins(tracker):
            assert Dispatcher.cuda_dtoh_stream is None
            Dispatcher.cuda_dtoh_stream = torch.cuda.Stream()  # as the dispatcher's __init__ does on first use
            Dispatcher.cuda_dtoh_stream.record_event().synchronize()
    assert [t.ops for t in trackers] == [["synchronization (Event.synchronize)"]] * 2
    assert Dispatcher.cuda_dtoh_stream is kept
