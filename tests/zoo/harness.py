"""Build Megatron-Bridge 0.6.2's shipped recipe functions offline and judge each with MB and the plugin.

A recipe is *accepted by Megatron-Bridge* when its own checks pass at the GPU count in the recipe's name:
``runtime_config_update()`` (what ``pretrain()``/``finetune()`` run first; the plugin's hook suspended),
Megatron-Core's ``ConstantNumMicroBatchesCalculator`` (run at ``setup()``), and the world-size divisibility
``initialize_model_parallel`` requires. The plugin must raise on none of those (zero false rejections);
every flag it does raise is recorded with its rule id, severity and evidence.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import inspect
import io
import math
import os
import pkgutil
import re
import socket
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

__all__ = [
    "restored_environ",
    "discover",
    "world_size_of",
    "offline",
    "judge",
    "RecipeVerdict",
    "cp2_variant",
    "packed_variant",
    "run_zoo",
]

_GPUS = re.compile(r"_(\d+)gpu")


def discover() -> list[Callable[..., Any]]:
    """Every public ``*_config`` function defined in ``megatron.bridge.recipes`` (each once, by owner module)."""
    package = importlib.import_module("megatron.bridge.recipes")
    found: dict[tuple[str, str], Callable[..., Any]] = {}
    for info in pkgutil.walk_packages(package.__path__, prefix="megatron.bridge.recipes."):
        if info.name.startswith("megatron.bridge.recipes.utils"):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(info.name)
        except Exception:  # noqa: BLE001  (a recipe module that cannot import here is simply not in the zoo)
            continue
        for name, value in vars(module).items():
            if name.startswith("_") or not name.endswith("_config") or not inspect.isfunction(value):
                continue
            if value.__module__ == module.__name__:
                found[(value.__module__, value.__qualname__)] = value
    return [found[k] for k in sorted(found)]


def recipe_id(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__.removeprefix('megatron.bridge.recipes.')}:{fn.__name__}"


def world_size_of(fn: Callable[..., Any], cfg: Any = None) -> int:
    """The GPU count in the recipe's name (``..._128gpu_...``); for a name without one, the smallest world the
    recipe's own layout fits (lcm of TP*PP*CP and expert-TP*EP*PP)."""
    match = _GPUS.search(fn.__name__)
    if match:
        return int(match.group(1))
    if cfg is None:
        return 1
    m = cfg.model
    tp, pp, cp = (
        getattr(m, k, 1) or 1
        for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")
    )
    ep = getattr(m, "expert_model_parallel_size", 1) or 1
    etp = getattr(m, "expert_tensor_parallel_size", None) or (1 if ep > 1 else tp)
    return math.lcm(tp * pp * cp, etp * ep * pp)


class OfflineError(RuntimeError):
    """A recipe asked for something from the Hugging Face hub that the zoo does not provide."""


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """Answer ``AutoBridge.from_hf_pretrained(hub id)`` with the real bridge over an in-code config."""
    from megatron.bridge import AutoBridge
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    from tests.zoo.hf_configs import HF_CONFIGS, config_for

    def from_hf_pretrained(cls: Any, path: Any, **kwargs: Any) -> Any:
        if str(path) not in HF_CONFIGS:
            raise OfflineError(f"no in-code config for {path}")
        return cls.from_hf_config(config_for(str(path)))

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OfflineError(f"hub access: {args[:1]}")

    saved = [(AutoBridge, "from_hf_pretrained", AutoBridge.__dict__["from_hf_pretrained"])]
    saved += [
        (c, "from_pretrained", c.__dict__["from_pretrained"]) for c in (AutoConfig, AutoTokenizer, AutoProcessor)
    ]
    saved += [
        (socket.socket, "connect", socket.socket.connect),
        (socket, "create_connection", socket.create_connection),
    ]

    def local_or_refuse(owner: Any) -> Any:
        original = owner.from_pretrained  # bound: a local directory is not the hub (the packer's tokenizer)

        def load(*args: Any, **kwargs: Any) -> Any:
            path = args[0] if args else kwargs.get("pretrained_model_name_or_path")
            if path is not None and os.path.isdir(str(path)):
                return original(*args, **kwargs)
            return refuse(*args, **kwargs)

        return staticmethod(load)

    AutoBridge.from_hf_pretrained = classmethod(from_hf_pretrained)
    for c in (AutoConfig, AutoTokenizer, AutoProcessor):
        c.from_pretrained = local_or_refuse(c)
    socket.socket.connect = refuse
    socket.create_connection = refuse
    old_env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class RecipeVerdict:
    """What Megatron-Bridge and the plugin say about one built config."""

    recipe: str
    world_size: int
    built: bool
    build_error: str = ""
    mb_accepts: bool = False
    mb_error: str = ""
    flags: list[dict[str, Any]] = field(default_factory=list)

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [f for f in self.flags if f["severity"] == "error"]


def _gpu_properties(recipe: str) -> Any:
    """The GPU the recipe is named for, as ``torch.cuda.get_device_properties`` would describe it: Megatron-Bridge
    checks flex-dispatcher backends (DeepEP, HybridEP) against the device's architecture."""
    from types import SimpleNamespace

    if any(tag in recipe for tag in ("gb200", "gb300", "b200", "b300")):
        return SimpleNamespace(major=10, minor=0, name="NVIDIA GB200")
    return SimpleNamespace(major=9, minor=0, name="NVIDIA H100 80GB HBM3")


@contextlib.contextmanager
def restored_environ() -> Iterator[None]:
    """``runtime_config_update`` exports each recipe's ``env_vars`` (NCCL, NVTE, PYTORCH_CUDA_ALLOC_CONF ...) into
    ``os.environ``; put the environment back so one recipe's settings never leak into the next or a subprocess."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _on_gpu(recipe: str) -> Iterator[None]:
    import torch

    saved = torch.cuda.get_device_properties
    torch.cuda.get_device_properties = lambda *a, **k: _gpu_properties(recipe)
    try:
        yield
    finally:
        torch.cuda.get_device_properties = saved


def _mb_verdict(recipe: str, cfg: Any, world_size: int) -> str:
    """'' when Megatron-Bridge/Core accept ``cfg`` at ``world_size``, else the first failure."""
    from megatron.bridge.training.config import runtime_config_update
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    from mbridge_seqpack.hook import suspended

    work = copy.deepcopy(cfg)
    try:
        os.environ["WORLD_SIZE"] = str(world_size)  # restored_environ() (in judge) puts it back
        with suspended(), _on_gpu(recipe), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            runtime_config_update(work)
        m = work.model
        tp, pp, cp = m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size
        ep = getattr(m, "expert_model_parallel_size", 1) or 1
        etp = getattr(m, "expert_tensor_parallel_size", None) or tp  # MB has finalized it by now
        if world_size % (tp * pp * cp):
            return f"RuntimeError: world_size ({world_size}) is not divisible by {tp * pp * cp}"
        if world_size % (etp * ep * pp):
            return f"RuntimeError: world_size ({world_size}) is not divisible by {etp * ep * pp}"
        train = work.train
        if getattr(train, "rampup_batch_size", None) is None:
            ConstantNumMicroBatchesCalculator(
                train.global_batch_size,
                train.micro_batch_size,
                world_size // (tp * pp * cp),
                getattr(train, "decrease_batch_size_if_needed", False),
                0,
            )
    except Exception as exc:  # noqa: BLE001  (Megatron's own verdict, whatever it raises)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    return ""


@functools.lru_cache(maxsize=1)
def _base_checkpoint() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="zoo_base_ckpt_")


def judge(name: str, build: Callable[[], Any], world_size: int | Callable[[Any], int]) -> RecipeVerdict:
    """Build one config and record both verdicts (the plugin's via ``check``, every rule); ``world_size`` may be
    a function of the built config."""
    from mbridge_seqpack.rules import RuleContext, evaluate

    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            cfg = build()
    except Exception as exc:  # noqa: BLE001
        return RecipeVerdict(name, 0, built=False, build_error=f"{type(exc).__name__}: {exc}"[:300])
    if callable(world_size):
        world_size = world_size(cfg)
    if getattr(cfg, "peft", None) is not None and cfg.checkpoint.pretrained_checkpoint is None:
        cfg.checkpoint.pretrained_checkpoint = _base_checkpoint()  # every PEFT user points at a base model
    verdict = RecipeVerdict(name, world_size, built=True)
    with restored_environ():
        verdict.mb_error = _mb_verdict(name, cfg, world_size)
    verdict.mb_accepts = not verdict.mb_error
    from mbridge_seqpack.analysis.te_attention import declared

    with _on_gpu(name), declared(recipe=name):  # attention backends judged on the GPU the recipe names
        results = evaluate(RuleContext.build(copy.deepcopy(cfg), world_size))
    verdict.flags = [{"rule_id": v.rule_id, "severity": v.severity} for r in results for v in r.violations]
    return verdict


def cp2_variant(build: Callable[[], Any]) -> Callable[[], Any]:
    """The recipe with CP doubled, fixed the way Megatron-Bridge's messages ask: per-token loss on,
    ``average_in_collective`` off, sequence lengths rounded up to a multiple of 2*CP. Nothing else."""

    def go() -> Any:
        cfg = build()
        cp = 2 * (cfg.model.context_parallel_size or 1)
        cfg.model.context_parallel_size = cp
        cfg.model.calculate_per_token_loss = True
        if hasattr(cfg.ddp, "average_in_collective"):
            cfg.ddp.average_in_collective = False
        seq = -(-cfg.model.seq_length // (2 * cp)) * (2 * cp)
        cfg.model.seq_length = seq
        if hasattr(cfg.dataset, "seq_length"):
            cfg.dataset.seq_length = seq
        specs = getattr(cfg.dataset, "offline_packing_specs", None)
        if specs is not None and specs.packed_sequence_size > 0:
            specs.packed_sequence_size = math.lcm(1, -(-specs.packed_sequence_size // (2 * cp)) * (2 * cp))
        return cfg

    return go


def packed_variant(build: Callable[[], Any]) -> Callable[[], Any] | None:
    """An unpacked GPT SFT recipe with offline packing switched on the way ``default_squad_config`` does it
    (fixed width, ``PackedSequenceSpecs(seq_length)``) and micro batch 1 as Megatron-Bridge's message asks."""

    def go() -> Any:
        from megatron.bridge.data.packing.config import PackedSequenceSpecs

        cfg = build()
        mbs = cfg.train.micro_batch_size or 1
        cfg.dataset.enable_offline_packing = True
        cfg.dataset.offline_packing_specs = PackedSequenceSpecs(
            packed_sequence_size=cfg.dataset.seq_length, pad_seq_to_mult=1
        )
        cfg.dataset.dataset_kwargs = {**(cfg.dataset.dataset_kwargs or {}), "pad_to_max_length": True}
        cfg.train.global_batch_size = max(1, cfg.train.global_batch_size // mbs)
        cfg.train.micro_batch_size = 1
        return cfg

    return go


def _is_unpacked_gpt_sft(cfg: Any) -> bool:
    from megatron.bridge.data.builders import GPTSFTDatasetConfig

    return isinstance(cfg.dataset, GPTSFTDatasetConfig) and not cfg.dataset.enable_offline_packing


def run_zoo() -> dict[str, list[RecipeVerdict]]:
    """Every recipe as shipped; every accepted fine-tuning recipe at doubled CP; unpacked GPT SFT recipes
    with packing switched on."""
    shipped: list[RecipeVerdict] = []
    cp2: list[RecipeVerdict] = []
    packed: list[RecipeVerdict] = []
    with offline():
        for fn in discover():
            name = recipe_id(fn)
            verdict = judge(name, fn, functools.partial(world_size_of, fn))
            shipped.append(verdict)
            if not (verdict.built and verdict.mb_accepts and ("sft" in fn.__name__ or "peft" in fn.__name__)):
                continue
            cp2.append(judge(f"{name}+cp2", cp2_variant(fn), 2 * verdict.world_size))
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                unpacked = _is_unpacked_gpt_sft(fn())
            if unpacked:
                packed.append(judge(f"{name}+packed", packed_variant(fn), verdict.world_size))
    return {"shipped": shipped, "cp2": cp2, "packed": packed}
