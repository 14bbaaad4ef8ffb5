"""What the launch constructs, constructed: the config's model through its own provider and wrapped in Megatron-Core's
DDP, on CPU, before any GPU is allocated.

Megatron-Bridge's ``setup()`` builds the model with ``cfg.model.provide_distributed_model(ddp_config=cfg.ddp, ...)``
(``training/setup.py _build_distributed_model``): ``get_model`` calls the provider's ``provide()`` (the provider's
own asserts: the TE RNG tracker for CUDA graphs, a VLM's refusal of CP, ...; then every module's constructor),
the mixed-precision wrapper, and ``DistributedDataParallel`` with the config's ``ddp`` (its asserts: per-token loss
with ``average_in_collective``, ...). Here the same call runs with the same arguments on the shrunk copy
(``shrink.py``) in the project's one-rank CPU world (``capture/cpu_world.py``: device allocations land on the host).

A raise inside Megatron-Bridge / Megatron-Core is the launch's failure only when it is the config's, not the
shrink's: the copy is built again at other widths, and the raise counts only where it recurs there at the same site.
Anything needing what this machine lacks (a GPU, a package) is "not run", with what was not run.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import re
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Iterator, Literal

from mbridge_seqpack.capture.cpu_world import keeps_environment
from mbridge_seqpack.frames import traceback_site

__all__ = ["Construction", "Raised", "construct", "forget_constructions", "classify"]

State = Literal["built", "refused", "not_run", "invalid"]
_CACHE_SIZE = 256
_cache: OrderedDict[str, Construction] = OrderedDict()
#: what a raise says when the machine lacks a GPU or a GPU-only library (the launch has them); Megatron's own
#: messages name CUDA graphs and GPUs too, so only these phrases count
_NO_GPU = re.compile(
    r"NVIDIA driver|not compiled with CUDA|CUDA driver|CUDA error|CUDAGuardImpl|no CUDA GPUs|"
    r"CUDA extension|needs CUDA|cuDNN|NVML|nvrtc|no kernel image|device-side|moved to device cuda"
)


@dataclass(frozen=True)
class Construction:
    """One construction's outcome: ``built``; ``refused`` (a raise of Megatron's, at the same site at two sizes:
    ``error``, ``site``); ``not_run`` (``why``: what could not be run here); or ``invalid`` (Megatron-Core's
    ``finalize()`` refuses the config itself, so ``validate()`` stops the launch before any model is built: ``why``).
    ``followed``: switches the one-rank world changed; ``stood_in``: launch steps not taken here."""

    state: State
    error: str = ""
    site: str = ""
    why: str = ""
    followed: tuple[str, ...] = ()
    stood_in: tuple[str, ...] = ()


def forget_constructions() -> None:
    """Empty the cache (tests that change Megatron's functions between checks)."""
    _cache.clear()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().split("\n")[0] or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


@dataclass(frozen=True)
class Raised:
    """A raise during construction, classified: Megatron's own refusal (``refused``) or something this machine cannot
    run (``not_run``: a missing package, a GPU-only path, a raise outside Megatron)."""

    state: State
    text: str
    site: str
    kind: str


def classify(exc: BaseException) -> Raised:
    """The raise, classified (see :class:`Raised`)."""
    site = traceback_site(exc) or ""
    text = first_line(exc)
    kind = type(exc).__name__
    if isinstance(exc, ImportError):
        name = getattr(exc, "name", None) or text
        return Raised("not_run", f"a package the model needs is not installed here ({name}: {text})", site, kind)
    if _NO_GPU.search(str(exc)) or site.startswith("transformer_engine/"):
        return Raised("not_run", f"construction needs a GPU at {site or 'an unknown site'} ({text})", site, kind)
    if not site.startswith("megatron/"):
        return Raised("not_run", f"construction stopped outside Megatron ({text})", site, kind)
    return Raised("refused", text, site, kind)


def launch_arguments(cfg: Any) -> dict[str, Any]:
    """What ``_build_distributed_model`` passes ``provide_distributed_model`` besides the process groups."""
    optimizer, rng, dist = getattr(cfg, "optimizer", None), getattr(cfg, "rng", None), getattr(cfg, "dist", None)
    return {
        "use_cpu_initialization": True,  # the launch initializes on the device; here the host stands in (no CUDA RNG)
        "ddp_config": copy.deepcopy(cfg.ddp),
        "use_megatron_fsdp": bool(getattr(dist, "use_megatron_fsdp", False)),
        "use_torch_fsdp2": bool(getattr(dist, "use_torch_fsdp2", False)),
        "overlap_param_gather_with_optimizer_step": bool(
            getattr(optimizer, "overlap_param_gather_with_optimizer_step", False)
        ),
        "data_parallel_random_init": bool(getattr(rng, "data_parallel_random_init", False)),
    }


def _key(provider: Any, arguments: dict[str, Any], peft: bool, env_vars: dict[str, str]) -> str:
    text = repr((type(provider).__qualname__, provider, sorted(arguments.items()), peft, sorted(env_vars.items())))
    return hashlib.sha256(text.encode()).hexdigest()


#: what the build's copy changes because this machine lacks it (NGC containers have it), said in the verdict
ENVIRONMENT_STAND_INS: dict[str, Any] = {"gradient_accumulation_fusion": False}  # APEX's CUDA extension
STOOD_IN_WORDS = (
    "device allocations on the host (use_cpu_initialization), CUDA reported available to Transformer Engine's module "
    "constructors, the CUDA RNG tracker on the host generator, gradient_accumulation_fusion off (APEX's CUDA "
    "extension)"
)


def built_with(found: Construction) -> str:
    """How the construction was made, in words: the stand-ins, and what the one-rank world changed or left out."""
    return "; ".join((f"built on CPU at shrunk widths with {STOOD_IN_WORDS}", *found.followed, *found.stood_in))


def _host_rng_tracker() -> Any:
    """Megatron's CUDA RNG tracker with the host generator standing in: modules fork it to draw their initial weights
    (Gated DeltaNet, TE's layers), and which values they draw decides nothing about whether the model builds."""
    import torch
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    class HostRNGTracker(CudaRNGStatesTracker):
        def add(self, name: str, seed: int) -> None:
            self.seeds_.add(seed)
            self.states_[name] = None

        @contextlib.contextmanager
        def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
            with torch.random.fork_rng(devices=[]):
                yield

    return HostRNGTracker()


@contextlib.contextmanager
def device_stand_ins() -> Iterator[None]:
    """``torch.cuda.is_available()`` true and one device for the build: Transformer Engine's modules refuse to be
    constructed otherwise (``TransformerEngineBaseModule.__init__``), and allocate on the host under
    ``use_cpu_initialization``; Megatron's CUDA RNG tracker on the host generator (``setup()`` seeds the CUDA one);
    Megatron's own messages stay quiet (a verdict never rests on them)."""
    import logging

    import torch
    from megatron.core.tensor_parallel import random

    saved = torch.cuda.is_available, torch.cuda.device_count
    tracker = random._CUDA_RNG_STATE_TRACKER, random._CUDA_RNG_STATE_TRACKER_INITIALIZED
    quiet = logging.root.manager.disable
    torch.cuda.is_available, torch.cuda.device_count = (lambda: True), (lambda: 1)
    random._CUDA_RNG_STATE_TRACKER, random._CUDA_RNG_STATE_TRACKER_INITIALIZED = _host_rng_tracker(), True
    logging.disable(max(quiet, logging.WARNING))
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(quiet)
        random._CUDA_RNG_STATE_TRACKER, random._CUDA_RNG_STATE_TRACKER_INITIALIZED = tracker
        torch.cuda.is_available, torch.cuda.device_count = saved


#: the variables Megatron-Core and Transformer Engine read while building a model (the rest cannot change it)
BUILD_ENV_PREFIXES = ("NVTE_", "MEGATRON_", "NCCL_", "CUDA_")


def launch_env_vars(cfg: Any) -> dict[str, str]:
    """The environment the launch builds its model in, as far as construction reads it: this process's variables of
    ``BUILD_ENV_PREFIXES``, and the config's ``env_vars`` where the process has none (``runtime_config_update``
    exports them with ``os.environ.setdefault``)."""
    import os

    from mbridge_seqpack.analysis.attention_backend import env_value

    names = {k for k in os.environ if k.startswith(BUILD_ENV_PREFIXES)}
    names |= {str(k) for k in (getattr(cfg, "env_vars", None) or {}) if str(k).startswith(BUILD_ENV_PREFIXES)}
    found = {name: env_value(cfg, name) for name in sorted(names)}
    return {name: value for name, value in found.items() if value is not None}


@contextlib.contextmanager
def launch_environment(env_vars: dict[str, str]) -> Iterator[None]:
    """``os.environ``'s construction variables exactly ``env_vars`` for the block, put back after."""
    import os

    saved = {k: v for k, v in os.environ.items() if k.startswith(BUILD_ENV_PREFIXES)}
    for name in saved:
        del os.environ[name]
    os.environ.update(env_vars)
    try:
        yield
    finally:
        for name in [k for k in os.environ if k.startswith(BUILD_ENV_PREFIXES)]:
            del os.environ[name]
        os.environ.update(saved)


def stand_in_environment(provider: Any) -> None:
    """The build's environment stand-ins set on ``provider`` (a copy)."""
    for name, value in ENVIRONMENT_STAND_INS.items():
        if hasattr(provider, name):
            setattr(provider, name, value)


@keeps_environment
def _build_once(provider: Any, arguments: dict[str, Any], env_vars: dict[str, str]) -> Raised | None:
    """``provide_distributed_model`` on ``provider`` in the one-rank CPU world (its prints kept off stdout); the
    raise, classified, or None. The model and the raise's frames are let go inside the world, which collects them
    (and so its process groups) as it ends."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    from mbridge_seqpack.capture.cpu_world import cpu_world

    failure: Raised | None = None
    with cpu_world(), device_stand_ins(), launch_environment(env_vars):
        try:
            model = provider.provide_distributed_model(
                pg_collection=ProcessGroupCollection.use_mpu_process_groups(), **copy.copy(arguments)
            )
            del model
        except Exception as exc:  # noqa: BLE001 - every raise is classified; nothing escapes as a plugin bug
            failure = classify(exc)
            exc.__traceback__ = None
            del exc
    return failure


def construct(cfg: Any) -> Construction:
    """The construction of ``cfg``'s model as the launch builds it (cached per distinct provider and arguments)."""
    import torch.distributed as dist

    from mbridge_seqpack.minilaunch.shrink import shrunk_provider

    provider = cfg.model
    if not hasattr(provider, "provide_distributed_model"):
        return Construction("not_run", why=f"{type(provider).__name__} is not a model provider this check builds")
    if dist.is_available() and dist.is_initialized():
        return Construction(
            "not_run",
            why="torch.distributed is already initialized in this process (the build needs a world of its own)",
        )
    stood_in = (
        ("PEFT adapters (cfg.peft): the base model is built, its pre-wrap hook is not run",)
        if getattr(cfg, "peft", None) is not None
        else ()
    )
    arguments = launch_arguments(cfg)
    shrunk = shrunk_provider(provider)
    stand_in_environment(shrunk.provider)
    if getattr(getattr(cfg, "rng", None), "te_rng_tracker", False):  # validate() syncs it (training/config.py)
        shrunk.provider.use_te_rng_tracker = True
    env_vars = launch_env_vars(cfg)
    key = _key(shrunk.provider, arguments, bool(stood_in), env_vars)
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    found = replace(_construct(shrunk, provider, arguments, env_vars), stood_in=stood_in)
    _cache[key] = found
    while len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return found


def _construct(shrunk: Any, provider: Any, arguments: dict[str, Any], env_vars: dict[str, str]) -> Construction:
    from mbridge_seqpack.minilaunch.shrink import shrunk_provider

    followed = tuple(shrunk.followed)
    if arguments["use_megatron_fsdp"] and arguments["use_torch_fsdp2"]:  # training/config.py validate() raises first
        return Construction("invalid", why="use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive")
    try:
        shrunk.provider.finalize()
    except Exception as exc:  # noqa: BLE001
        try:
            copy.deepcopy(provider).finalize()
        except Exception as own:  # noqa: BLE001 - validate() refuses the config first (Megatron's own message)
            return Construction("invalid", why=first_line(own), followed=followed)
        return Construction(
            "not_run",
            why=f"the copy at CPU sizes is refused by finalize() ({first_line(exc)}), so nothing was built",
            followed=followed,
        )
    failure = _build_once(shrunk.provider, arguments, env_vars)
    if failure is None:
        return Construction("built", followed=followed)
    if failure.state != "refused":
        return Construction("not_run", why=failure.text, site=failure.site, followed=followed)
    wider = shrunk_provider(provider, scale=2)
    stand_in_environment(wider.provider)
    wider.provider.use_te_rng_tracker = shrunk.provider.use_te_rng_tracker
    try:
        wider.provider.finalize()
        again = _build_once(wider.provider, arguments, env_vars)
    except Exception as exc:  # noqa: BLE001 - finalize() refusing the wider copy: not the same raise
        again = classify(exc)
    if again is None or (again.site, again.kind) != (failure.site, failure.kind):
        return Construction(
            "not_run",
            why=f"the copy at CPU sizes raised {failure.text} at {failure.site}, and not so at twice those sizes: a "
            "raise of the shrink, not known for the config's own sizes",
            site=failure.site,
            followed=followed,
        )
    return Construction("refused", error=failure.text, site=failure.site, followed=followed)
