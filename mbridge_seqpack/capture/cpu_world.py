"""A one-rank CPU world for running the captured code: the process group and Megatron-Core's model-parallel state
it expects, compiled fusions run eagerly, CPU tensors standing for device tensors with the ``torch.cuda`` stand-ins
active (``stand_ins``), and every piece of process state the run touches put back afterwards (so a check or a test
process is left as it was; :func:`keeps_environment` for the environment a model build sets).

``ranks`` runs a function on each rank of a real multi-process gloo world (forked from this process, so Megatron,
already imported here, is not imported again): for code that needs a process group of more than one rank (the
context-parallel split and the loss reductions over it)."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import tempfile
import traceback
import warnings
from typing import Any, Callable, Iterator

import torch

from mbridge_seqpack.capture.stand_ins import DeviceTracker

__all__ = ["RanksUnavailable", "cpu_world", "keeps_environment", "ranks"]


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


@contextlib.contextmanager
def _released_wrappers() -> Iterator[None]:
    """The data-parallel wrappers whose forward ran in the world are emptied when it ends, and what the run made is
    collected. A step's autograd graph outlives it where Megatron keeps a tensor of the step (the MoE token
    dispatchers keep their routing state); that graph's gradient-accumulator nodes hold DDP's backward hooks, whose
    closures hold the wrapper, its model and so the world's process groups: a cycle through C++ that no collection
    frees. Left alone, each such run kept ~60 gloo threads alive for the rest of the process. Megatron-Core's RoPE
    modules cache ``forward`` on the class (``functools.lru_cache``, 32 calls): the cache keeps each module and the
    CP group it holds, so it is emptied too. Everything older than the world is frozen meanwhile (``gc.freeze``):
    the collection costs what the run made, not the ~1 s of a full one in a process that imported Megatron-Bridge."""
    from megatron.core.distributed.data_parallel_base import _BaseDataParallel
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding

    ran: dict[int, Any] = {}

    def note(module: Any, args: Any) -> None:
        if isinstance(module, _BaseDataParallel):
            ran[id(module)] = module

    handle = torch.nn.modules.module.register_module_forward_pre_hook(note)
    gc.freeze()
    try:
        yield
    finally:
        handle.remove()
        for wrapper in ran.values():
            vars(wrapper).clear()
        ran.clear()  # the wrappers' shells go with the collection too
        for cached in (RotaryEmbedding.forward, YarnRotaryEmbedding.forward):
            cached.cache_clear()
        gc.collect()
        gc.unfreeze()


@contextlib.contextmanager
def _process_group() -> Iterator[None]:
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if created:
            dist.destroy_process_group()


@contextlib.contextmanager
def _model_parallel() -> Iterator[None]:
    """Megatron-Core's model-parallel state for the world; afterwards every module global of ``parallel_state`` is
    put back: ``destroy_model_parallel`` leaves some groups set (``_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP``, a
    gloo group whose threads would outlive the world)."""
    from megatron.core import parallel_state

    created = not parallel_state.model_parallel_is_initialized()
    state = {k: v for k, v in vars(parallel_state).items() if not callable(v) and not k.startswith("__")}
    if created:
        parallel_state.initialize_model_parallel()
    try:
        yield
    finally:
        if created:
            parallel_state.destroy_model_parallel()
            for name, value in state.items():
                setattr(parallel_state, name, value)


@contextlib.contextmanager
def _restored_megatron_state() -> Iterator[None]:
    """Megatron-Core's process-wide state a step touches, fresh for the run and put back after: the rerun state
    machine (created on first use), the full-iteration wrapper's static buffers, the loss scale the MoE
    auxiliary-loss autoscaler keeps as a class attribute and ``copy_``s into (a run must create its own, on the
    device), and the MoE metrics tracker (a run records its router losses into a tracker of its own, not into the
    process's)."""
    from megatron.core import rerun_state_machine
    from megatron.core.full_cuda_graph import StaticBufferLoader
    from megatron.core.transformer.moe import moe_logging
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    scalers = [MoEAuxLossAutoScaler]  # MTPLossAutoScaler assigns its scale (no copy_ into an old tensor)
    machine = rerun_state_machine._GLOBAL_RERUN_STATE_MACHINE
    buffers = {stage: list(items) for stage, items in StaticBufferLoader.static_buffers.items()}
    scales = [scaler.main_loss_backward_scale for scaler in scalers]
    tracker = moe_logging._MOE_METRICS_TRACKER
    rerun_state_machine._GLOBAL_RERUN_STATE_MACHINE = None
    moe_logging._MOE_METRICS_TRACKER = None
    for stage in StaticBufferLoader.static_buffers:
        StaticBufferLoader.static_buffers[stage] = []
    for scaler in scalers:
        scaler.main_loss_backward_scale = None
    try:
        yield
    finally:
        rerun_state_machine._GLOBAL_RERUN_STATE_MACHINE = machine
        moe_logging._MOE_METRICS_TRACKER = tracker
        StaticBufferLoader.static_buffers.clear()
        StaticBufferLoader.static_buffers.update(buffers)
        for scaler, scale in zip(scalers, scales):
            scaler.main_loss_backward_scale = scale


@contextlib.contextmanager
def _eager_fusions() -> Iterator[None]:
    """Megatron's ``jit_fuser`` (``torch.compile``) functions run eagerly: the tracker sees every op in them."""
    import torch._dynamo

    previous = torch._dynamo.config.disable
    torch._dynamo.config.disable = True
    try:
        yield
    finally:
        torch._dynamo.config.disable = previous


@contextlib.contextmanager
def cpu_world(tracker: DeviceTracker | None = None) -> Iterator[DeviceTracker]:
    """``tracker`` (a fresh :class:`DeviceTracker` by default), active with its ``torch.cuda`` stand-ins, in a
    one-rank world."""
    tracker = tracker if tracker is not None else DeviceTracker()
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        stack.enter_context(_process_group())
        stack.enter_context(_released_wrappers())
        stack.enter_context(_eager_fusions())
        stack.enter_context(_restored_megatron_state())
        stack.enter_context(tracker.stand_ins())
        stack.enter_context(tracker)
        stack.enter_context(_model_parallel())
        stack.enter_context(torch.random.fork_rng(devices=[]))
        torch.manual_seed(1234)
        yield tracker


#: the most ranks ``ranks`` forks. Each rank is a copy-on-write fork of this process (one that imported Megatron-Bridge
#: holds ~1.5 GB), made inside ``validate()``: a context-parallel size read from a config is not a process count to
#: trust (a stray ``context_parallel_size=600`` forked 600 ranks and took the machine's memory)
MAX_RANKS = 16


class RanksUnavailable(RuntimeError):
    """No multi-rank world could be made here (the message says why): the caller reports that part as not run."""


def _rank_main(fn: Callable[[int, Any], Any], rank: int, world_size: int, path: str, conn: Any) -> None:
    """One forked rank: a gloo world of ``world_size`` over a file store, ``fn(rank, group)``, the result sent back
    (or the traceback)."""
    import torch.distributed as dist

    # what the parent holds is frozen out of this rank's collections: a collection writes the header of every object
    # it visits, so each rank would copy the parent's heap page by page (122 MB a rank for 2M lists, measured)
    gc.freeze()
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # this child's own setting: the world is loopback whatever the host's
    torch.set_num_threads(1)
    try:
        store = dist.FileStore(path, world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                conn.send(("ok", fn(rank, dist.group.WORLD)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent reports it; a child never raises into the fork's caller
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def ranks(fn: Callable[[int, Any], Any], world_size: int = 2, timeout: float = 120.0) -> list[Any]:
    """``fn(rank, group)`` on each rank of a ``world_size``-rank gloo world of forked processes; the results by
    rank. ``fn`` and its result must be picklable-free of process state (the result is pickled back). Raises
    RanksUnavailable where no such world can be made here, RuntimeError with the rank's traceback where ``fn``
    fails."""
    import multiprocessing

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise RanksUnavailable(
            "torch.distributed is already initialized in this process (forked ranks would share it)"
        )
    if "fork" not in multiprocessing.get_all_start_methods():
        raise RanksUnavailable("this platform cannot fork the ranks")
    if not 1 <= world_size <= MAX_RANKS:
        raise RanksUnavailable(f"a {world_size}-rank world: a CPU world here has 1 to {MAX_RANKS} ranks")
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="mbridge-seqpack-ranks-") as folder:
        pipes = [context.Pipe(duplex=False) for _ in range(world_size)]
        procs = [
            context.Process(target=_rank_main, args=(fn, r, world_size, os.path.join(folder, "store"), pipes[r][1]))
            for r in range(world_size)
        ]
        with warnings.catch_warnings():  # fork() of a threaded process: the ranks run no thread pool of ours
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                for proc in procs:
                    proc.start()
            except (AssertionError, OSError) as exc:  # a daemonic process may not fork children; no memory to fork
                for proc in procs:
                    if proc.pid is not None:
                        proc.kill()
                        proc.join()
                raise RanksUnavailable(f"the ranks could not be forked here ({exc})") from exc
        for _, send in pipes:
            send.close()
        results: list[Any] = []
        try:
            for rank, (recv, _) in enumerate(pipes):
                if not recv.poll(timeout):
                    raise RanksUnavailable(
                        f"rank {rank} of the {world_size}-rank CPU world sent nothing in {timeout:g} s"
                    )
                status, value = recv.recv()
                if status != "ok":
                    raise RuntimeError(f"rank {rank} of the {world_size}-rank CPU world failed:\n{value}")
                results.append(value)
        finally:
            for proc in procs:
                proc.join(5)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
    return results
