"""Transformer Engine's own attention-backend selection, asked on a CPU for a declared target GPU stack.

TE picks the backend of every ``DotProductAttention`` call in
``transformer_engine/pytorch/attention/dot_product_attention/utils.py get_attention_backend(AttentionParams)``:
Python filters over the params and the ``NVTE_*`` variables, then cuDNN's own support query, then a preference.
:func:`select` calls that function unchanged. A handful of its inputs describe the GPU stack, not the config; they
are supplied at the narrowest point, inside :func:`on_target` (TE's module state set for the one call and put back
after), and stated in every verdict (:meth:`Target.describe`):

- ``get_device_compute_capability()`` reads the current CUDA device: the **target architecture** instead
  (``MBRIDGE_SEQPACK_GPU_ARCH`` / ``check --gpu-arch``, else the GPU named in the recipe, else this machine's GPU
  as NVML reports it, else sm90 = H100);
- ``get_cudnn_version()``: the cuDNN installed here (it loads on a CPU), or ``MBRIDGE_SEQPACK_CUDNN_VERSION``;
- ``FlashAttentionUtils`` (what ``backends.py`` found installed): the installed flash-attn, or, where none is
  installed here, the flash-attn 2 and 3 NGC PyTorch ships (``MBRIDGE_SEQPACK_FLASH_ATTN`` declares others, or
  ``none``); the install hints TE prints then (they call ``torch.cuda.current_device()``) are muted;
- ``_get_fused_attn_backend`` wraps the C++ ``nvte_get_fused_attn_backend_v2``: its fixed rules (architecture,
  cuDNN version gates, layout, softmax type, FP8 recipe, determinism, with cudnn-frontend's) are applied as data
  (``te_fused_rules``, each with its reject text from the binary); only what follows them, cuDNN's own support
  query on the device, is **assumed** to accept (sub-backend F16_arbitrary_seqlen for F16/BF16 tensors, FP8 for
  FP8 ones).

In a process whose CUDA is already initialized (the hook inside training, after the device is set up) and with
nothing declared, nothing is assumed: the real functions run on the real device. The backend is what
``get_attention_backend`` returns; TE's own debug log, which names every backend it disables and why, is captured
for the reasons only (instead of printed, and also in a process that has called ``logging.disable``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import re
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Any, Iterator, Mapping

from mbridge_seqpack.errors import UsageError

__all__ = [
    "ARCH_ENV",
    "CUDNN_ENV",
    "FLASH_ENV",
    "ASSUMED_FLASH_ATTN",
    "Target",
    "Selection",
    "declared",
    "resolve_target",
    "parse_arch",
    "arch_from_name",
    "on_target",
    "alternatives",
    "GENERATIONS",
    "nvte_environ",
    "select",
]

ARCH_ENV = "MBRIDGE_SEQPACK_GPU_ARCH"
CUDNN_ENV = "MBRIDGE_SEQPACK_CUDNN_VERSION"
FLASH_ENV = "MBRIDGE_SEQPACK_FLASH_ATTN"
#: flash-attn assumed on a target when none is installed here: what NGC PyTorch 26.02 ships (flash-attn
#: 2.7.4.post1 and flash-attn-3 3.0.0, as TE's own debug log shows them in NVIDIA/TransformerEngine#3006), which
#: Megatron-Bridge's container builds on; TE 2.20.2 takes flash-attn 2 >= 2.1.1 (>= 2.7.3 on Blackwell), < 2.8.4,
#: and enables flash-attn 3 on sm90 only
ASSUMED_FLASH_ATTN = ("2.7.4.post1", "3.0.0")
DEFAULT_ARCH = (9, 0)

#: GPU names as Megatron-Bridge's recipe names spell them (``..._h100_bf16_config``, ``recipes/.../gb200/``)
GPU_NAMES: dict[str, tuple[int, int]] = {
    "a100": (8, 0),
    "a800": (8, 0),
    "h100": (9, 0),
    "h200": (9, 0),
    "h800": (9, 0),
    "h20": (9, 0),
    "gh200": (9, 0),
    "b100": (10, 0),
    "b200": (10, 0),
    "gb200": (10, 0),
    "b300": (10, 3),
    "gb300": (10, 3),
}

_declared: contextvars.ContextVar[dict[str, str | None]] = contextvars.ContextVar("mbridge_seqpack_target", default={})


@contextlib.contextmanager
def declared(*, gpu_arch: str | None = None, recipe: str | None = None) -> Iterator[None]:
    """Within the block, check for ``gpu_arch`` (``check --gpu-arch``), or for the GPU ``recipe``'s name says."""
    if gpu_arch is not None:
        parse_arch(gpu_arch)  # a bad value fails here, with the accepted spellings
    token = _declared.set({"gpu_arch": gpu_arch, "recipe": recipe})
    try:
        yield
    finally:
        _declared.reset(token)


def parse_arch(text: str) -> tuple[int, int]:
    """``sm90``, ``sm_100``, ``9.0``, ``90`` or a GPU name (``h100``, ``b200``, ``gb200``) as (major, minor)."""
    value = str(text).strip().lower()
    if value in GPU_NAMES:
        return GPU_NAMES[value]
    found = re.fullmatch(r"(?:sm_?)?(\d+)(?:\.(\d))?", value)
    if found and found.group(2) is not None:
        return int(found.group(1)), int(found.group(2))
    if found and len(found.group(1)) >= 2:
        digits = found.group(1)
        return int(digits[:-1]), int(digits[-1])
    raise UsageError(
        f"{ARCH_ENV} / --gpu-arch must name a GPU architecture (sm80, sm90, sm100, sm103, sm120, 9.0) or a GPU "
        f"({', '.join(sorted(GPU_NAMES))}); got {text!r}. Fix: {ARCH_ENV}=sm90"
    )


def arch_from_name(name: str | None) -> tuple[str, tuple[int, int]] | None:
    """The GPU a recipe's name or module path says it runs on (``llama3_8b_sft_2gpu_h100_bf16_config``)."""
    for token in re.split(r"[^a-z0-9]+", str(name or "").lower()):
        if token in GPU_NAMES:
            return token, GPU_NAMES[token]
    return None


def _parse_cudnn(text: str) -> tuple[int, int, int]:
    parts = str(text).strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise UsageError(f"{CUDNN_ENV} must be a cuDNN version such as 9.10.2; got {text!r}")
    major, minor, patch = (int(p) for p in [*parts, "0", "0"][:3])
    return major, minor, patch


def _parse_flash(text: str) -> tuple[str | None, str | None]:
    """``none``, ``2.8.3``, ``3.0.0b1`` or both comma-separated: (flash-attn 2 version, flash-attn 3 version)."""
    v2 = v3 = None
    for item in (t.strip() for t in str(text).split(",")):
        if item.lower() in ("", "none"):
            continue
        if item.startswith("2."):
            v2 = item
        elif item.startswith("3."):
            v3 = item
        else:
            raise UsageError(f"{FLASH_ENV} takes none or flash-attn versions (2.x, 3.x), comma-separated: {text!r}")
    return v2, v3


@dataclass(frozen=True)
class Target:
    """The GPU stack the selection is asked for, with where each part came from."""

    arch: tuple[int, int]
    cudnn: tuple[int, int, int]
    flash_attn: str | None  # flash-attn 2 version, None when not installed on the target
    flash_attn_3: str | None
    arch_source: str = "default"
    cudnn_source: str = "installed"
    flash_source: str = "installed"
    on_device: bool = False  # everything real: CUDA is initialized here and nothing is declared
    arch_declared: bool = True  # False: no setting, recipe name or GPU here says which GPU (sm90 stands in)
    cudnn_declared: bool = True  # False: the cuDNN is this machine's, not known to be the target's

    @property
    def sm(self) -> str:
        return f"sm{10 * self.arch[0] + self.arch[1]}"

    @property
    def key(self) -> tuple[Any, ...]:
        return self.arch, self.cudnn, self.flash_attn, self.flash_attn_3, self.on_device

    def flash_text(self) -> str:
        names = [f"flash-attn {v}" for v in (self.flash_attn, self.flash_attn_3) if v]
        return " + ".join(names) if names else "no flash-attn"

    def assumptions(self) -> tuple[str, ...]:
        """What a verdict on this stack takes on trust rather than computes: cuDNN's own support query off a GPU,
        flash-attn when none is installed or declared (an undeclared cuDNN is not assumed: every version TE gates
        on is asked, :func:`alternatives`)."""
        if self.on_device:
            return ()
        found = ["cuDNN's own support query (needs a GPU) accepts what TE's fixed FusedAttention rules pass"]
        if self.flash_source.startswith("assumed"):
            found.append(f"the target has {self.flash_text()}, as NGC PyTorch ships it ({FLASH_ENV} declares it)")
        return tuple(found)

    def describe(self) -> str:
        """``sm90 (default: H100), cuDNN 9.20.0 (installed), flash-attn 2.8.3 (assumed: ...)``."""
        if self.on_device:
            return f"{self.sm}, cuDNN {'.'.join(map(str, self.cudnn))}, {self.flash_text()} (this process's GPU)"
        return (
            f"{self.sm} ({self.arch_source}), cuDNN {'.'.join(map(str, self.cudnn))} ({self.cudnn_source}), "
            f"{self.flash_text()} ({self.flash_source}); TE's fixed FusedAttention rules applied "
            "(nvte_get_fused_attn_backend_v2, cudnn-frontend), cuDNN's own support query (needs a GPU) assumed to "
            "accept"
        )


def _installed_cudnn() -> tuple[int, int, int]:
    from transformer_engine.pytorch.utils import get_cudnn_version

    return tuple(get_cudnn_version())  # type: ignore[return-value]


def _installed_flash() -> tuple[str | None, str | None]:
    from transformer_engine.pytorch.attention.dot_product_attention.utils import FlashAttentionUtils as fa

    return (str(fa.version) if fa.is_installed else None, str(fa.fa3_version) if fa.v3_is_installed else None)


def _cuda_ready() -> bool:
    """CUDA already initialized in this process (never initialized here: inside validate() that would open a
    context on device 0 for every rank before Megatron sets the device)."""
    import torch

    return bool(torch.cuda.is_initialized())


@functools.lru_cache(maxsize=1)
def visible_gpu_arch() -> tuple[int, int] | None:
    """The compute capability of this machine's first visible GPU, read through NVML (no CUDA context is opened:
    the hook runs inside validate(), before Megatron sets each rank's device); None without a GPU or NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML library or no driver: a CPU machine
        return None
    try:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        index = int(visible) if visible.isdigit() else 0
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(index))
        return int(major), int(minor)
    except Exception:  # noqa: BLE001 - a UUID in CUDA_VISIBLE_DEVICES, an unreadable device
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def resolve_target() -> Target:
    """The target stack: ``--gpu-arch`` / ``MBRIDGE_SEQPACK_GPU_ARCH``, else this process's GPU when CUDA is up,
    else the GPU the recipe's name says, else this machine's GPU (NVML: the hook inside training), else sm90
    (H100); cuDNN and flash-attn as above."""
    settings = _declared.get()
    arch_text = settings.get("gpu_arch") or os.environ.get(ARCH_ENV) or None
    cudnn_text = os.environ.get(CUDNN_ENV) or None
    flash_text = os.environ.get(FLASH_ENV) or None
    if arch_text is None and cudnn_text is None and flash_text is None and _cuda_ready():
        import torch

        arch = tuple(torch.cuda.get_device_capability())
        return Target(arch, _installed_cudnn(), *_installed_flash(), on_device=True)  # type: ignore[arg-type]
    if settings.get("gpu_arch"):
        arch, arch_source = parse_arch(arch_text), f"--gpu-arch {arch_text}"  # type: ignore[arg-type]
    elif arch_text:
        arch, arch_source = parse_arch(arch_text), f"{ARCH_ENV}={arch_text}"
    elif (named := arch_from_name(settings.get("recipe"))) is not None:
        arch, arch_source = named[1], f"the recipe name says {named[0]}"
    elif (visible := visible_gpu_arch()) is not None:
        arch, arch_source = visible, "this machine's GPU"
    else:
        arch, arch_source = DEFAULT_ARCH, f"no GPU declared; set {ARCH_ENV}"
    on_target_machine = arch_source == "this machine's GPU"  # the hook in training: this stack is the target's
    if cudnn_text:
        cudnn, cudnn_source = _parse_cudnn(cudnn_text), f"{CUDNN_ENV}"
    else:
        cudnn, cudnn_source = _installed_cudnn(), "installed here"
    if flash_text:
        (fa2, fa3), flash_source = _parse_flash(flash_text), f"{FLASH_ENV}={flash_text}"
    else:
        fa2, fa3 = _installed_flash()
        flash_source = "installed here"
        if fa2 is None and fa3 is None:
            (fa2, fa3), flash_source = ASSUMED_FLASH_ATTN, f"assumed as NGC PyTorch ships them; {FLASH_ENV} declares"
    return Target(
        arch,  # type: ignore[arg-type]
        cudnn,
        fa2,
        fa3,
        arch_source,
        cudnn_source,
        flash_source,
        arch_declared=arch_source != f"no GPU declared; set {ARCH_ENV}",
        cudnn_declared=bool(cudnn_text) or on_target_machine,
    )


#: the GPU generations Megatron-Bridge 0.6.2's own recipes are written for (perf_recipes/<model>/h100, b200, gb200,
#: b300, gb300), asked when no GPU is declared
GENERATIONS: tuple[tuple[int, int], ...] = ((9, 0), (10, 0), (10, 3))


def _undeclared_cudnns(installed: tuple[int, int, int]) -> tuple[tuple[int, int, int], ...]:
    """The cuDNN versions asked when the target's is not declared: one per interval of TE's gates
    (``cudnn_gates``), this machine's standing for its own interval."""
    from mbridge_seqpack.analysis.cudnn_gates import cudnn_versions_to_ask, interval_of

    asked = cudnn_versions_to_ask()
    own = interval_of(installed, asked)
    return tuple(installed if v == own else v for v in asked)


def alternatives(target: Target) -> list[tuple[str, Target]]:
    """The stacks the verdict must also hold on, as (label, target): each GPU generation when no GPU is declared,
    and each cuDNN interval TE gates on when the target's cuDNN is not declared; empty when everything is declared."""
    from dataclasses import replace

    if target.on_device:
        return []
    archs = [target.arch] if target.arch_declared else list(GENERATIONS)
    cudnns = [target.cudnn] if target.cudnn_declared else list(_undeclared_cudnns(target.cudnn))
    found = []
    for arch in archs:
        for cudnn in cudnns:
            if (arch, cudnn) == (target.arch, target.cudnn):
                continue
            other = replace(target, arch=arch, cudnn=cudnn)
            label = f"{other.sm} with cuDNN {'.'.join(map(str, cudnn))}" if len(cudnns) > 1 else other.sm
            found.append((label, other))
    return found


@dataclass(frozen=True)
class Selection:
    """What ``get_attention_backend`` returned for one AttentionParams, with TE's own log of why."""

    backend: str | None  # TE's name of the selected backend ("FusedAttention (sub-backend 1)"), None when none
    available: tuple[bool, bool, bool]  # FlashAttention, FusedAttention, UnfusedDotProductAttention
    log: tuple[str, ...]  # TE's debug/warning messages, in order (its "Running with config" dump left out)
    error: str | None = None  # the selection itself raised (e.g. an NVTE_* value int() cannot read)

    @property
    def ok(self) -> bool:
        return self.backend is not None

    @property
    def disabled(self) -> tuple[str, ...]:
        """TE's "Disabling ..." messages: the reasons each backend dropped out."""
        return tuple(m for m in self.log if m.startswith("Disabling"))


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if not message.startswith("Running with config"):
            self.messages.append(message)


def _cudnn_assumed(target: Target, **fused_attn_kwargs: Any) -> tuple[int, str]:
    """Stand-in for ``utils._get_fused_attn_backend`` on ``target`` (the C++ query needs a device): TE's fixed
    FusedAttention rules (``te_fused_rules``: ``nvte_get_fused_attn_backend_v2``'s and cudnn-frontend's, with their
    reject texts) are applied; a config they pass is assumed accepted by cuDNN's own support query, with the
    sub-backend TE's C++ returns for the tensors' data type."""
    from transformer_engine.pytorch.constants import DType
    from transformer_engine.pytorch.cpp_extensions.fused_attn import FusedAttnBackend

    from mbridge_seqpack.analysis.te_fused_rules import first_reject, query_of

    dtype = fused_attn_kwargs["qkv_dtype"]
    if dtype not in (DType.kFloat8E4M3, DType.kFloat8E5M2, DType.kBFloat16, DType.kFloat16):
        return int(FusedAttnBackend.No_Backend), f"cuDNN fused attention takes FP16/BF16/FP8 tensors, not {dtype}"
    refused = first_reject(query_of(fused_attn_kwargs, target.arch, target.cudnn))
    if refused is not None:
        return int(FusedAttnBackend.No_Backend), refused.text
    if dtype in (DType.kFloat8E4M3, DType.kFloat8E5M2):
        return int(FusedAttnBackend.FP8), ""
    return int(FusedAttnBackend.F16_arbitrary_seqlen), ""


_FA_MUTED = ("warning_printed", "v3_warning_printed", "v4_warning_printed")


def _flash_state(fa: type) -> dict[str, Any]:
    return {k: v for k, v in vars(fa).items() if not k.startswith("__") and not isinstance(v, staticmethod)}


def _set_flash(fa: Any, target: Target) -> None:
    """FlashAttentionUtils as ``backends.py`` would have set it on the target (its own setters)."""
    from packaging.version import Version

    fa.is_installed = fa.v3_is_installed = fa.v4_is_installed = False
    fa.version, fa.fa3_version, fa.fa4_version = Version("0"), Version("0"), Version("0")
    for name in ("v2_plus", "v2_1_plus", "v2_3_plus", "v2_4_plus", "v2_4_1_plus", "v2_5_plus", "v2_5_7_plus"):
        setattr(fa, name, False)
    fa.v2_6_0_plus = fa.v2_7_0_plus = False
    if target.flash_attn:
        fa.version = Version(target.flash_attn)
        needed = fa.version_required_blackwell if target.arch >= (10, 0) else fa.version_required
        if fa.is_version_supported(fa.version, needed):
            fa.set_flash_attention_version()
    if target.flash_attn_3:
        fa.fa3_version = Version(Version(target.flash_attn_3).public)
        fa.set_flash_attention_3_params()


@contextlib.contextmanager
def nvte_environ(env: Mapping[str, str]) -> Iterator[None]:
    """This process's ``NVTE_*`` variables replaced by ``env`` within the block, put back after."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("NVTE_")}
    try:
        for name in saved:
            del os.environ[name]
        os.environ.update(env)
        yield
    finally:
        for name in [k for k in os.environ if k.startswith("NVTE_")]:
            del os.environ[name]
        os.environ.update(saved)


@contextlib.contextmanager
def on_target(target: Target, env: Mapping[str, str]) -> Iterator[_Capture]:
    """TE's selection inputs that are not the AttentionParams, for one call: the target stack (unless it is this
    process's device), the ``NVTE_*`` variables of the training process, and its logger captured. Everything is
    put back on exit."""
    from transformer_engine.pytorch.attention.dot_product_attention import utils as dpa

    fa = dpa.FlashAttentionUtils
    patched = ("get_device_compute_capability", "get_cudnn_version", "_get_fused_attn_backend")
    saved_functions = {name: getattr(dpa, name) for name in patched}
    saved_flash = _flash_state(fa)
    logger = logging.getLogger("DotProductAttention")
    saved_logger = (list(logger.handlers), logger.propagate, logger.level, dpa.AttentionLogging._log_level)
    capture = _Capture()
    with contextlib.ExitStack() as stack:
        stack.enter_context(nvte_environ(env))
        stack.callback(_restore, dpa, saved_functions, saved_flash, logger, saved_logger)
        if not target.on_device:
            dpa.get_device_compute_capability = lambda: target.arch
            dpa.get_cudnn_version = lambda: target.cudnn
            dpa._get_fused_attn_backend = functools.partial(_cudnn_assumed, target)
            _set_flash(fa, target)
            for name in _FA_MUTED:
                setattr(fa, name, True)
        logger.handlers = [capture]
        logger.propagate = False
        dpa.AttentionLogging._log_level = logging.DEBUG  # get_attention_backend sets the logger's level from it
        stack.enter_context(_logging_enabled())
        yield capture


@contextlib.contextmanager
def _logging_enabled() -> Iterator[None]:
    """``logging.disable`` lifted for the one call, so that TE's reasons reach the capture in a process that has
    silenced logging (the capture handler is the logger's only one and does not propagate, so nothing is printed);
    the process's level is put back after."""
    level = logging.root.manager.disable
    logging.disable(logging.NOTSET)
    try:
        yield
    finally:
        logging.disable(level)


def _restore(dpa: Any, functions: dict[str, Any], flash: dict[str, Any], logger: Any, saved: tuple[Any, ...]) -> None:
    for name, function in functions.items():
        setattr(dpa, name, function)
    for name, value in flash.items():
        setattr(dpa.FlashAttentionUtils, name, value)
    logger.handlers, logger.propagate = saved[0], saved[1]
    logger.setLevel(saved[2])
    dpa.AttentionLogging._log_level = saved[3]


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((str(k), repr(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def params_key(params: Any) -> tuple[Any, ...]:
    """A hashable image of an AttentionParams (its ``fp8_meta`` by the recipe's repr, as TE's __eq__ compares
    only the recipe)."""
    return tuple((f.name, _frozen(getattr(params, f.name))) for f in fields(params))


_CACHE: OrderedDict[tuple[Any, ...], Selection] = OrderedDict()
_CACHE_SIZE = 512


def select(params: Any, env: Mapping[str, str], target: Target) -> Selection:
    """``get_attention_backend(params)`` with the training process's ``NVTE_*`` variables ``env`` on ``target``;
    one call per distinct (params, env, target)."""
    key = (params_key(params), tuple(sorted(env.items())), target.key)
    found = _CACHE.get(key)
    if found is not None:
        _CACHE.move_to_end(key)
        return found
    selection = _run(params, env, target)
    _CACHE[key] = selection
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return selection


def _run(params: Any, env: Mapping[str, str], target: Target) -> Selection:
    from transformer_engine.pytorch.attention.dot_product_attention import utils as dpa

    with on_target(target, env) as capture:
        try:
            use_flash, flash_version, use_fused, fused_backend, use_unfused, available = dpa.get_attention_backend(
                params
            )
        except (ValueError, TypeError, KeyError, AssertionError) as exc:
            return Selection(None, (False, False, False), tuple(capture.messages), f"{type(exc).__name__}: {exc}")
    name = backend_name(use_flash, flash_version, use_fused, fused_backend, use_unfused)
    return Selection(name, tuple(bool(a) for a in available), tuple(capture.messages))  # type: ignore[arg-type]


def backend_name(
    use_flash: Any, flash_version: Any, use_fused: Any, fused_backend: Any, use_unfused: Any
) -> str | None:
    """The backend ``get_attention_backend`` returned, named as its own "Selected backend = ..." line names it
    (utils.py, just before its return), built from the returned values: the log line is not written in a process
    that has called ``logging.disable``."""
    if use_flash:
        return f"FlashAttention ({flash_version})"
    if use_fused:
        return f"FusedAttention (sub-backend {int(fused_backend)})"
    if use_unfused:
        return "UnfusedDotProductAttention"
    return None
