"""The attention backend Transformer Engine will pick for each kind of layer of a config, computed by TE's own
``get_attention_backend`` (``analysis/te_attention.py``) on the ``AttentionParams`` its ``DotProductAttention.forward``
would build at the first training step.

What the params are made of, and from where:

- the layer: heads and head dims per TP rank (``TEDotProductAttention.__init__``; MLA's q/v head dims), the window
  Megatron-Core passes to the layers ``is_layer_window_attention`` selects, each layer's ``cp_comm_type``
  (``TransformerLayer.__init__``), softmax type, dropout, ``return_max_logit`` for qk-clip;
- the batch: THD for offline and in-batch packing (``TEDotProductAttention.forward`` turns causal into
  ``padding_causal``), and ``pad_between_seqs`` as TE infers it from the batch: any ``cu_seqlens_q_padded``, which
  Megatron-Bridge's collate adds when ``offline_packing_specs.pad_seq_to_mult > 1``
  (``GPTSFTPackedDataset.collate_fn``) or when the in-batch pad multiple ``lcm(2*CP, CP*TP if SP)`` is > 1
  (``data/packing/in_batch.py``); q/k/v as separate tensors, their layout named by TE's ``get_qkv_layout``; a row
  holding one sequence as long as the row (the largest ``max_seqlen`` a batch can carry);
- the run: CP size and comm type (a2a+p2p's a2a level from ``hierarchical_context_parallel_sizes``), determinism
  (``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` or ``deterministic_mode``, which turns torch's deterministic algorithms
  on), FP8 attention with the recipe Megatron-Core's ``get_fp8_recipe`` builds, and the ``NVTE_*`` variables of the
  training process: the launch environment, ``env_vars`` where it leaves them unset (``runtime_config_update``
  uses ``os.environ.setdefault``), then what Megatron-Core's ``LanguageModule._set_attention_backend`` sets for
  ``model.attention_backend`` (run here on a copy of the variables: a string value sets nothing).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from mbridge_seqpack.analysis.precision import precision_source
from mbridge_seqpack.analysis.te_attention import nvte_environ

if TYPE_CHECKING:
    from mbridge_seqpack.artifact.pack_entry import PackEntry

__all__ = [
    "SWA_REFUSING_COMM_TYPES",
    "LOCAL_SUFFIX",
    "claims",
    "decisive_reasons",
    "no_backend_violation",
    "undetermined_violation",
    "verdict_notes",
    "verdict_summary",
    "NONDETERMINISTIC_ENV",
    "LayerKind",
    "Inputs",
    "KindSelection",
    "AttentionVerdict",
    "verdict_of",
    "layer_comm_types",
    "window_layers",
    "softmax_type",
    "num_layers",
    "env_value",
    "training_env",
    "local_attention_swap",
    "pin_text",
    "fix_for",
]

#: TE context_parallel.py attn_forward_func_with_cp: 'Context parallelism does not support sliding window
#: attention with cp_comm_type=...' for these
SWA_REFUSING_COMM_TYPES = ("p2p", "a2a+p2p")
NONDETERMINISTIC_ENV = "NVTE_ALLOW_NONDETERMINISTIC_ALGO"
#: TE's switch of the attention's FP8 recipe (read at import by dot_product_attention.py; init_fp8_metadata uses it)
DPA_FP8_RECIPE_ENV = "NVTE_DPA_FP8_RECIPE"
ARCH_ENV_NAME = "MBRIDGE_SEQPACK_GPU_ARCH"  # te_attention.ARCH_ENV / CUDNN_ENV, named here without importing TE
CUDNN_ENV_NAME = "MBRIDGE_SEQPACK_CUDNN_VERSION"
#: how non_te_core_attention names the attention provide() swaps in for attention_backend=local
LOCAL_SUFFIX = "(attention_backend=local)"
#: the variables Megatron-Core's _set_attention_backend sets and TE's get_attention_backend reads to opt out
BACKEND_ENV = (
    "NVTE_FLASH_ATTN",
    "NVTE_FUSED_ATTN",
    "NVTE_UNFUSED_ATTN",
    "NVTE_FLASH_ATTN_V2",
    "NVTE_FLASH_ATTN_V3",
    "NVTE_FLASH_ATTN_V4",
)


# ---- the config, read as Megatron reads it ---------------------------------------------------------------------
def num_layers(model: Any) -> int:
    return max(1, int(getattr(model, "num_layers", 1) or 1))


def softmax_type(model: Any) -> str:
    """Megatron-Core's TransformerConfig.softmax_type ('vanilla', 'off-by-one' or 'learnable')."""
    return getattr(model, "softmax_type", None) or "vanilla"


def layer_comm_types(model: Any, layers: int) -> list[str]:
    """Each layer's CP communication type (Megatron-Core takes a string, or one entry per layer; TE's default p2p)."""
    value = getattr(model, "cp_comm_type", None)
    if isinstance(value, (list, tuple)):
        return [v or "p2p" for v in value][:layers]
    return [value or "p2p"] * layers


def window_layers(model: Any, layers: int) -> list[int]:
    """1-based numbers of the layers that use sliding-window attention, as
    megatron/core/transformer/utils.py is_layer_window_attention decides."""
    from megatron.core.transformer.utils import is_layer_window_attention

    window = getattr(model, "window_size", None)
    if not isinstance(window, (list, tuple)) or len(window) != 2 or tuple(window) in ((-1, 0), (-1, -1)):
        return []  # an int window is a provider's own attention's business (Gemma-4), not TE's
    skip = getattr(model, "window_attn_skip_freq", None)
    return [n for n in range(1, layers + 1) if is_layer_window_attention(window, skip, n)]


def env_value(cfg: Any, name: str) -> str | None:
    """The value the training process will see: the launch environment's, else the config's ``env_vars``
    (``runtime_config_update`` exports them with ``os.environ.setdefault`` before the model is built)."""
    if name in os.environ:
        return os.environ[name]
    env_vars = getattr(cfg, "env_vars", None) or {}
    return str(env_vars[name]) if name in env_vars else None


def training_env(cfg: Any) -> dict[str, str]:
    """The ``NVTE_*`` variables of the training process before the model is built."""
    env = {k: str(v) for k, v in (getattr(cfg, "env_vars", None) or {}).items() if str(k).startswith("NVTE_")}
    env.update({k: v for k, v in os.environ.items() if k.startswith("NVTE_")})
    return env


def mcore_backend_env(model: Any, env: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """What Megatron-Core's ``LanguageModule._set_attention_backend`` (run when the model is built) leaves in the
    ``NVTE_*`` variables for ``model.attention_backend`` and ``flash_attention_version``, run on a copy of ``env``;
    and its assertion message where a variable already set contradicts the pin (then the variables it would set)."""
    from types import SimpleNamespace

    from megatron.core.models.common.language_module.language_module import LanguageModule

    view = SimpleNamespace(config=model)
    with nvte_environ(env):
        try:
            LanguageModule._set_attention_backend(view)  # type: ignore[arg-type]
            return {k: v for k, v in os.environ.items() if k.startswith("NVTE_")}, None
        except AssertionError as exc:
            conflict = str(exc)
    unpinned = {k: v for k, v in env.items() if k not in BACKEND_ENV}
    with nvte_environ(unpinned):
        LanguageModule._set_attention_backend(view)  # type: ignore[arg-type]
        return {k: v for k, v in os.environ.items() if k.startswith("NVTE_")}, conflict


def pin_text(model: Any) -> tuple[str, str]:
    """(``'enum'``/``'string'``/``'other'``, the value as written) for ``model.attention_backend``."""
    from megatron.core.transformer.enums import AttnBackend

    value = getattr(model, "attention_backend", None)
    if isinstance(value, AttnBackend):
        return "enum", value.name
    if isinstance(value, str):
        return "string", value
    return "other", repr(value)


def _resolved_spec(model: Any) -> Any:
    from megatron.core.transformer.spec_utils import ModuleSpec

    spec = getattr(model, "transformer_layer_spec", None)
    if callable(spec) and not isinstance(spec, ModuleSpec):
        import inspect
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if "vp_stage" in inspect.signature(spec).parameters:
                return spec(model, vp_stage=None)
            return spec(model)
    return spec


def local_attention_swap(model: Any) -> list[str]:
    """``['DotProductAttention (attention_backend=local)']`` where ``provide()`` swaps Megatron-Core's own core
    attention in for ``attention_backend=local``: the GPT provider for the enum when its layer spec is one
    ModuleSpec (models/gpt_provider.py), the hybrid and Qwen3-Omni providers for the enum or the string."""
    from megatron.core.transformer.enums import AttnBackend

    value = getattr(model, "attention_backend", None)
    if value is not AttnBackend.local and value != "local":
        return []
    name = [f"DotProductAttention {LOCAL_SUFFIX}"]
    try:
        from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider
        from megatron.bridge.models.qwen_omni.qwen3_omni_provider import Qwen3OmniModelProvider

        if isinstance(model, (HybridModelProvider, Qwen3OmniModelProvider)):
            return name
    except ImportError:
        pass
    if value is not AttnBackend.local:
        return []  # the GPT provider compares with the enum: a string 'local' swaps nothing
    try:
        spec = _resolved_spec(model)
    except Exception:  # noqa: BLE001 - a spec that needs the finalized model or a GPU says nothing here
        return []
    return name if hasattr(spec, "submodules") else []


class _Precision:
    """The model's precision fields as ``runtime_config_update`` leaves them: a ``mixed_precision`` config
    overwrites each field the model has (mixed_precision.py update_config_with_precision_overrides)."""

    def __init__(self, model: Any, mixed: Any, cpu: bool = False):
        self._model, self._mixed, self._cpu = model, mixed, cpu

    def __getattr__(self, name: str) -> Any:
        if name == "use_cpu_initialization" and self._cpu:
            return True  # TEDelayedScaling's extra kwargs ask for the current CUDA device otherwise
        mixed = self.__dict__["_mixed"]
        if mixed is not None and name in getattr(mixed.__class__, "__dataclass_fields__", {}):
            if hasattr(self._model, name):
                return getattr(mixed, name)
        return getattr(self._model, name)


def _precision(cfg: Any) -> _Precision:
    """The model's precision fields under ``precision_source`` (analysis/precision.py, as the rules read it); for a
    recipe name Megatron-Bridge does not know (it reports the name itself) the model's own fields stand."""
    found = precision_source(cfg)
    return _Precision(cfg.model, found[1] if found is not None and found[0] == "mixed_precision" else None)


def _fp8_recipe(precision: _Precision) -> Any:
    """Megatron-Core's own ``get_fp8_recipe`` (fp8_utils.py), with the CPU asked for where it wants a device;
    ``fp8_mha`` implies ``fp8_dpa`` (TE's DotProductAttention.forward forces it)."""
    from megatron.core.fp8_utils import get_fp8_recipe

    recipe = get_fp8_recipe(_Precision(precision._model, precision._mixed, cpu=True))
    if getattr(recipe, "fp8_mha", False) and not getattr(recipe, "fp8_dpa", False):
        recipe.fp8_dpa = True
    return recipe


# ---- the inputs of one config ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerKind:
    """Layers that build the same AttentionParams: window, CP comm type, FP8 or not."""

    window: tuple[int, int] | None
    cp_comm_type: str
    fp8: bool
    layers: tuple[int, ...]

    def layers_text(self, total: int) -> str:
        if len(self.layers) == total:
            return f"all {total} layers"
        runs: list[str] = []
        start = prev = self.layers[0]
        for n in (*self.layers[1:], None):
            if n is not None and n == prev + 1:
                prev = n
                continue
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            if n is not None:
                start = prev = n
        shown = ", ".join(runs) if len(runs) <= 6 else ", ".join(runs[:6]) + ", ..."
        return f"{len(self.layers)} of {total} layers ({shown})"


@dataclass(frozen=True)
class BatchShape:
    """The THD batch TE sees in one micro-batch: ``batch_size`` (cu_seqlens entries minus one) and max_seqlen."""

    sequences: int
    max_seqlen: int
    source: str


@dataclass(frozen=True)
class Inputs:
    """Everything the AttentionParams take from the config (per config; a LayerKind adds the rest)."""

    thd: bool
    pad_between_seqs: bool
    pad_fields: tuple[tuple[str, Any], ...]  # the fields that make the batches carry cu_seqlens_q_padded
    max_seqlen: int
    micro_batch: int
    cp: int
    cp_size_a2a: int
    heads: int
    groups: int
    head_dim_qk: int
    head_dim_v: int
    dtype: Any
    dropout: float
    softmax: str
    deterministic: bool
    return_max_logit: bool
    fp8_recipe: Any
    fp8_mha: bool
    softmax_scale: float
    checkpoint_core_attention: bool
    env: tuple[tuple[str, str], ...]  # NVTE_* after Megatron-Core's pin
    conflict: str | None  # Megatron-Core's assertion on a contradicting NVTE_* variable
    batch: BatchShape | None = None  # THD: the batch TE sees (None: one sequence filling the row)
    batch_bound: BatchShape | None = None  # pad_cu_seqlens without readable pack metadata: the largest batch

    @property
    def fp8_attention(self) -> bool:
        return self.fp8_recipe is not None and bool(getattr(self.fp8_recipe, "fp8_dpa", False))


def _dtype(precision: _Precision) -> Any:
    import torch

    if getattr(precision, "bf16", False):
        return torch.bfloat16
    if getattr(precision, "fp16", False):
        return torch.float16
    return torch.float32


def _pad_between_seqs(cfg: Any) -> tuple[bool, bool, tuple[tuple[str, Any], ...], int]:
    """(THD, pad_between_seqs, the fields deciding it, the row width) for the batches Megatron-Bridge builds."""
    from mbridge_seqpack.analysis.topology import alignment_multiple

    dataset, model = cfg.dataset, cfg.model
    seq_length = int(getattr(dataset, "seq_length", None) or getattr(model, "seq_length", 0) or 0)
    if getattr(dataset, "enable_offline_packing", False):
        specs = getattr(dataset, "offline_packing_specs", None)
        size = getattr(specs, "packed_sequence_size", None)
        if size is not None and size <= 0:
            return False, False, (), seq_length  # gpt_step: no packed metadata, plain rows
        mult = int(getattr(specs, "pad_seq_to_mult", 1) or 1)
        row = int(size) if size else seq_length
        return True, mult > 1, (("dataset.offline_packing_specs.pad_seq_to_mult", mult),), row
    if getattr(dataset, "enable_in_batch_packing", False):
        tp = int(getattr(model, "tensor_model_parallel_size", 1) or 1)
        cp = int(getattr(model, "context_parallel_size", 1) or 1)
        eval_cp = getattr(getattr(cfg, "dist", None), "eval_context_parallel_size", None)
        sizes = (cp,) if eval_cp is None else (cp, int(eval_cp))
        mult = alignment_multiple(tp, sizes, bool(getattr(model, "sequence_parallel", False)))
        return True, mult > 1, (("in-batch pad multiple lcm(2*CP, CP*TP if SP)", mult),), seq_length
    return False, False, (), seq_length


def _pack_metadata(specs: Any) -> list[PackEntry] | None:
    """The pack metadata Megatron-Bridge's packed dataset reads for ``pad_cu_seqlens`` (a JSON list with one dict
    per packed split: max_samples_per_bin, dataset_max_seqlen, min_packed_seqlen), None when not readable here."""
    import json

    from mbridge_seqpack.artifact.pack_entry import PackEntry

    path = getattr(specs, "packed_metadata_path", None)
    try:
        with open(str(path)) as handle:
            found = json.load(handle)
        entries = [PackEntry.from_json(d) for d in found if isinstance(d, dict)]
        return [e for e in entries if e.max_samples_per_bin is not None] or None
    except (OSError, TypeError, ValueError):
        return None


def batch_shapes(cfg: Any, row: int) -> tuple[BatchShape | None, BatchShape | None]:
    """(the THD batch TE sees, the largest one where it cannot be read here) with ``pad_cu_seqlens``: the
    collate (data/packing/gpt_sft.py GPTSFTPackedDataset.collate_fn) pads cu_seqlens to max_samples_per_bin + 2
    entries, so TE sees max_samples_per_bin + 1 sequences, and sets max_seqlen to max(dataset_max_seqlen,
    row - min_packed_seqlen) from the pack metadata. Without the flag: (None, None), one sequence filling the row."""
    dataset = cfg.dataset
    specs = getattr(dataset, "offline_packing_specs", None)
    if not (getattr(dataset, "enable_offline_packing", False) and getattr(specs, "pad_cu_seqlens", False)):
        return None, None
    metadata = _pack_metadata(specs)
    if metadata is not None:
        bins = max(int(d.max_samples_per_bin) for d in metadata)  # type: ignore[arg-type]
        longest = max(int(d.dataset_max_seqlen if d.dataset_max_seqlen is not None else 0) for d in metadata)
        gap = row - min(int(d.min_packed_seqlen if d.min_packed_seqlen is not None else row) for d in metadata)
        source = f"pad_cu_seqlens: max_samples_per_bin + 1 and max_seqlen from {specs.packed_metadata_path}"
        return BatchShape(bins + 1, max(longest, gap), source), None
    source = "pad_cu_seqlens, pack metadata not readable here"
    return BatchShape(2, row, f"{source}: 1 sample per row"), BatchShape(row + 1, row, f"{source}: {row} samples")


def inputs_of(cfg: Any) -> Inputs:
    """The config's attention inputs (``cfg`` may be a view with fixes applied)."""
    model = cfg.model
    precision = _precision(cfg)
    thd, pad, pad_fields, row = _pad_between_seqs(cfg)
    batch, bound = batch_shapes(cfg, row) if thd else (None, None)
    tp = int(getattr(model, "tensor_model_parallel_size", 1) or 1)
    cp = int(getattr(model, "context_parallel_size", 1) or 1)
    heads = int(getattr(model, "num_attention_heads", 1) or 1)
    groups = int(getattr(model, "num_query_groups", None) or heads)
    if getattr(model, "multi_latent_attention", False):  # MLA: TEDotProductAttention(k_channels=q_head_dim, ...)
        head_dim_qk = int(model.qk_head_dim) + int(getattr(model, "qk_pos_emb_head_dim", 0) or 0)
        head_dim_v = int(model.v_head_dim)
        groups = heads
    else:
        kv = getattr(model, "kv_channels", None) or int(getattr(model, "hidden_size", 0) or 0) // heads
        head_dim_qk = head_dim_v = int(kv)
    a2a = 1
    comm_types = set(layer_comm_types(model, num_layers(model)))
    sizes = getattr(model, "hierarchical_context_parallel_sizes", None)
    if "a2a+p2p" in comm_types and sizes:
        a2a = int(sizes[0])
    env, conflict = mcore_backend_env(model, training_env(cfg))
    nondeterministic = env.get(NONDETERMINISTIC_ENV, "1")  # TE's DotProductAttention.__init__ reads it
    deterministic = bool(getattr(model, "deterministic_mode", False))
    with contextlib.suppress(ValueError):
        deterministic = deterministic or int(nondeterministic) == 0
    fp8 = getattr(precision, "fp8", None)
    recipe = _fp8_recipe(precision) if fp8 else None
    granularity = getattr(model, "recompute_granularity", None)
    modules = getattr(model, "recompute_modules", None) or ["core_attn"]
    scale = getattr(model, "softmax_scale", None)
    return Inputs(
        thd=thd,
        pad_between_seqs=pad,
        pad_fields=pad_fields,
        max_seqlen=row,
        micro_batch=int(getattr(getattr(cfg, "train", None), "micro_batch_size", 1) or 1),
        cp=cp,
        cp_size_a2a=a2a,
        heads=max(1, heads // tp),
        groups=max(1, groups // tp),
        head_dim_qk=head_dim_qk,
        head_dim_v=head_dim_v,
        dtype=_dtype(precision),
        dropout=float(getattr(model, "attention_dropout", 0.0) or 0.0),
        softmax=softmax_type(model),
        deterministic=deterministic,
        return_max_logit=bool(getattr(model, "qk_clip", False) or getattr(model, "log_max_attention_logit", False)),
        fp8_recipe=recipe,
        fp8_mha=bool(getattr(recipe, "fp8_mha", False)),
        softmax_scale=float(scale) if scale else 1.0 / math.sqrt(head_dim_qk),
        checkpoint_core_attention=granularity == "selective" and "core_attn" in modules,
        env=tuple(sorted(env.items())),
        conflict=conflict,
        batch=batch,
        batch_bound=bound,
    )


def layer_kinds(cfg: Any) -> list[LayerKind]:
    """The model's layers grouped by what their attention params differ in."""
    model = cfg.model
    layers = num_layers(model)
    windowed = set(window_layers(model, layers))
    comm = layer_comm_types(model, layers)
    precision = _precision(cfg)
    fp8_layers = set(range(1, layers + 1)) if getattr(precision, "fp8", None) else set()
    recipe = getattr(precision, "fp8_recipe", "delayed")
    if fp8_layers and getattr(recipe, "value", recipe) != "delayed":  # delayed: one context around every layer
        from megatron.core.fp8_utils import is_first_last_bf16_layer

        fp8_layers = {n for n in fp8_layers if not is_first_last_bf16_layer(precision, n - 1)}
    window = tuple(model.window_size) if windowed else None
    groups: dict[tuple[Any, ...], list[int]] = {}
    for n in range(1, layers + 1):
        key = (window if n in windowed else None, comm[n - 1] if n <= len(comm) else "p2p", n in fp8_layers)
        groups.setdefault(key, []).append(n)
    return [LayerKind(k[0], k[1], k[2], tuple(v)) for k, v in groups.items()]


def _qkv_layout(inputs: Inputs) -> str:
    return _layout(inputs.thd, inputs.heads, inputs.groups, inputs.head_dim_qk, inputs.head_dim_v)


@functools.lru_cache(maxsize=64)
def _layout(thd: bool, heads: int, groups: int, head_dim_qk: int, head_dim_v: int) -> str:
    """TE's own ``get_qkv_layout`` on q, k, v shaped as Megatron-Core hands them over (separate tensors)."""
    import torch
    from transformer_engine.pytorch.attention.dot_product_attention import utils as dpa

    lead = (2,) if thd else (2, 1)
    shapes = [(*lead, heads, head_dim_qk), (*lead, groups, head_dim_qk), (*lead, groups, head_dim_v)]
    q, k, v = (torch.zeros(s, dtype=torch.bfloat16) for s in shapes)
    return str(dpa.get_qkv_layout(q, k, v, qkv_format="thd" if thd else "sbhd")[0])


def attention_params(inputs: Inputs, kind: LayerKind) -> Any:
    """The AttentionParams ``DotProductAttention.forward`` builds for one layer of ``kind`` at a training step."""
    import torch
    from transformer_engine.pytorch.attention.dot_product_attention import utils as dpa
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor

    mask = "padding_causal" if inputs.thd else "causal"  # TEDotProductAttention.forward: causal -> padding_causal
    fp8 = kind.fp8 and inputs.fp8_recipe is not None
    tokens = inputs.max_seqlen // inputs.cp if inputs.thd else 0
    seqlen = inputs.batch.max_seqlen if inputs.thd and inputs.batch else inputs.max_seqlen
    return dpa.AttentionParams(
        qkv_type=Float8Tensor if fp8 and inputs.fp8_mha else torch.Tensor,
        qkv_dtype=inputs.dtype,
        qkv_layout=_qkv_layout(inputs),
        batch_size=(inputs.batch.sequences if inputs.batch else 1) if inputs.thd else inputs.micro_batch,
        num_heads=inputs.heads,
        num_gqa_groups=inputs.groups,
        max_seqlen_q=seqlen,
        max_seqlen_kv=seqlen,
        num_tokens_q=tokens,
        num_tokens_kv=tokens,
        head_dim_qk=inputs.head_dim_qk,
        head_dim_v=inputs.head_dim_v,
        attn_mask_type=mask,
        window_size=dpa.check_set_window_size(mask, kind.window),
        bottom_right_diagonal=False,  # forward: False for causal / padding_causal
        softcap=0.0,
        alibi_slopes_shape=None,
        core_attention_bias_type="no_bias",
        core_attention_bias_shape=None,
        core_attention_bias_requires_grad=False,
        pad_between_seqs=inputs.thd and inputs.pad_between_seqs,
        attention_dropout=inputs.dropout,
        context_parallel=inputs.cp > 1,
        cp_comm_type=kind.cp_comm_type,
        cp_size=inputs.cp,
        cp_size_a2a=inputs.cp_size_a2a if kind.cp_comm_type == "a2a+p2p" else 1,
        deterministic=inputs.deterministic,
        is_training=True,
        fp8=fp8,
        fp8_meta={"recipe": inputs.fp8_recipe} if fp8 else None,
        inference_params=None,
        softmax_type=inputs.softmax,
        return_max_logit=inputs.return_max_logit,
        cuda_graph=False,
        num_splits=1,
        softmax_scale=inputs.softmax_scale,
        fp8_output=False,
        checkpoint_core_attention=inputs.checkpoint_core_attention,
    )


# ---- the verdict -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KindSelection:
    kind: LayerKind
    params: Any  # the AttentionParams TE was asked about
    selection: Any  # te_attention.Selection


@dataclass(frozen=True)
class AttentionVerdict:
    """TE's selection for every layer kind of one config, or why it was not asked (``skipped``)."""

    target: Any  # te_attention.Target
    inputs: Inputs | None
    kinds: tuple[KindSelection, ...]
    layers: int
    skipped: str | None = None
    #: the stacks also asked (each GPU generation when none is declared, each cuDNN interval TE gates on when the
    #: target's is not declared), with TE's picks there
    others: tuple[tuple[str, tuple[KindSelection, ...]], ...] = ()
    #: not asked because NVTE_DPA_FP8_RECIPE swaps FP8 attention's recipe on the GPU (``skipped`` says so): the
    #: selection still decides the config, so the rule's verdict is "not determined", never silence
    recipe_switched: bool = False
    #: whether TE's selection is this verdict's to judge: False where no TE core attention runs (a core attention
    #: that is not TE's, a hybrid stack without attention layers) and for Energon's online packing, whose batches
    #: the model's own task encoder makes (not modelled here). A skipped verdict that
    #: applies was not computed here (TE not importable, the model not readable as Megatron-Core reads it): "not
    #: determined", never n/a
    applies: bool = True

    @property
    def computed(self) -> bool:
        return self.skipped is None

    @property
    def assumptions(self) -> tuple[str, ...]:
        """What the verdict takes on trust (``Target.assumptions``); none when TE's selection was not run."""
        return self.target.assumptions() if self.computed and self.target is not None else ()

    def _differs(self, index: int) -> bool:
        return len({self.kinds[index].selection.ok, *(kinds[index].selection.ok for _, kinds in self.others)}) > 1

    @property
    def failing(self) -> list[KindSelection]:
        """The layer kinds TE leaves no backend for, on the target and on every other stack asked."""
        return [k for i, k in enumerate(self.kinds) if not k.selection.ok and not self._differs(i)]

    @property
    def undetermined(self) -> str | None:
        """Why no verdict holds for some layers: TE's selection keeps a backend for them on some of the stacks
        asked and none on others (what differs is what is not declared), with each stack's picks; None when every
        stack asked agrees."""
        return self.undetermined_for(self.kinds)

    def undetermined_for(self, kinds: list[KindSelection] | tuple[KindSelection, ...]) -> str | None:
        """:attr:`undetermined` for some of the layer kinds only (those no other rule reports)."""
        split = [i for i in range(len(self.kinds)) if self._differs(i) and self.kinds[i] in kinds]
        if not split:
            return None
        base = self.target.sm
        if any("cuDNN" in label for label, _ in self.others):
            base += f" with cuDNN {'.'.join(map(str, self.target.cudnn))}"
        grouped: dict[str, list[str]] = {}
        for label, kinds in [(base, self.kinds), *self.others]:
            picks = ", ".join(
                (kinds[i].selection.backend or f"NO BACKEND ({_fused_reason(kinds[i].selection, self.target)})")
                + ("" if len(self.kinds) == 1 else f" for {kinds[i].kind.layers_text(self.layers)}")
                for i in split
            )
            grouped.setdefault(picks, []).append(label)
        parts = [f"{picks} on {stacks_text(labels)}" for picks, labels in grouped.items()]
        return "; ".join(parts)


def _select_all(inputs: Inputs, kinds: list[LayerKind], target: Any) -> tuple[KindSelection, ...]:
    from mbridge_seqpack.analysis.te_attention import select

    env = dict(inputs.env)
    found = []
    for kind in kinds:
        params = attention_params(inputs, kind)
        found.append(KindSelection(kind, params, select(params, env, target)))
    return tuple(found)


def verdict_of(cfg: Any, target: Any = None, *, non_te: list[str] | None = None) -> AttentionVerdict:
    """TE's selection for ``cfg`` on ``target`` (default: :func:`te_attention.resolve_target`)."""
    layers = num_layers(cfg.model)
    if non_te:
        why = f"core attention is not TE's: {', '.join(non_te)}"
        return AttentionVerdict(target, None, (), layers, why, applies=False)
    if getattr(cfg.dataset, "packing_buffer_size", None) and not (
        getattr(cfg.dataset, "enable_offline_packing", False) or getattr(cfg.dataset, "enable_in_batch_packing", False)
    ):
        why = "Energon online packing: the model's own task encoder and step pad the batches"
        return AttentionVerdict(target, None, (), layers, why, applies=False)
    no_attention = _no_attention_layer(cfg.model)
    if no_attention:
        return AttentionVerdict(target, None, (), layers, no_attention, applies=False)
    unreadable = _not_a_te_attention_model(cfg.model)
    if unreadable:
        return AttentionVerdict(target, None, (), layers, unreadable)
    try:
        from mbridge_seqpack.analysis.te_attention import resolve_target

        target = target if target is not None else resolve_target()
        inputs = inputs_of(cfg)
        kinds = layer_kinds(cfg)
    except (ImportError, OSError) as exc:  # Transformer Engine (or its torch extension) cannot load here
        return AttentionVerdict(target, None, (), layers, f"Transformer Engine cannot be imported here ({exc})")
    except (ValueError, TypeError, AttributeError, AssertionError) as exc:  # e.g. get_fp8_recipe's own refusal
        reason = f"the attention config cannot be read as Megatron-Core reads it: {type(exc).__name__}: {exc}"
        return AttentionVerdict(target, None, (), layers, reason)
    switched = _fp8_recipe_switch(inputs)
    if switched is not None:
        return AttentionVerdict(target, inputs, (), layers, switched, recipe_switched=True)
    from mbridge_seqpack.analysis.te_attention import alternatives

    others = tuple((label, _select_all(inputs, kinds, other)) for label, other in alternatives(target))
    if inputs.batch_bound is not None:
        bound = inputs.batch_bound
        others += ((bound.source, _select_all(replace(inputs, batch=bound), kinds, target)),)
    return AttentionVerdict(target, inputs, _select_all(inputs, kinds, target), layers, others=others)


def _fp8_recipe_switch(inputs: Inputs) -> str | None:
    """Why TE's selection is not asked under ``NVTE_DPA_FP8_RECIPE``: for FP8 attention, TE's
    ``DotProductAttention.init_fp8_metadata`` swaps the config's recipe for another (``F16``: none; a recipe name:
    that recipe, or a mix of two) at the first forward, building its quantizers on the GPU; the selection TE makes
    under the swapped recipe is not computed here, and judging the config's own recipe would judge what TE does not
    run. None when the switch is unset or the attention is not FP8."""
    value = dict(inputs.env).get(DPA_FP8_RECIPE_ENV, "")
    if not value or not inputs.fp8_attention:
        return None
    return (
        f"{DPA_FP8_RECIPE_ENV}={value} is set for the launch: Transformer Engine's DotProductAttention."
        f"init_fp8_metadata replaces the config's {type(inputs.fp8_recipe).__name__} recipe for attention at the "
        "first forward, so the backend it selects for FP8 attention is not the config's recipe's, and the swap "
        "(its quantizers are built on a CUDA device) is not run here"
    )


def _no_attention_layer(model: Any) -> str | None:
    """Why no layer of ``model`` runs TE's core attention: a hybrid stack whose pattern (read by Megatron-Core's own
    parser, ``model_family.hybrid_layer_counts``: main decoder and MTP depths) has no attention symbol; else None
    (a model whose pattern cannot be read keeps the attention verdict)."""
    from mbridge_seqpack.analysis.model_family import ATTENTION_SYMBOLS, hybrid_layer_counts
    from mbridge_seqpack.moe_layers import hybrid_pattern

    counts = hybrid_layer_counts(model)
    if not counts or any(counts.get(symbol, 0) for symbol in ATTENTION_SYMBOLS):
        return None
    return (
        f"no attention layer: the hybrid pattern {hybrid_pattern(model)!r} has none of {', '.join(ATTENTION_SYMBOLS)}"
    )


def _not_a_te_attention_model(model: Any) -> str | None:
    """Why the params cannot be built from ``model`` (not a Megatron-Core TransformerConfig with attention heads
    and a head dim), else None."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not isinstance(model, TransformerConfig):
        return f"{type(model).__name__} is not a Megatron-Core TransformerConfig"
    heads = getattr(model, "num_attention_heads", None)
    if not isinstance(heads, int) or heads <= 0:
        return f"{type(model).__name__} has no attention heads ({heads!r})"
    if getattr(model, "multi_latent_attention", False):
        dims = (getattr(model, "qk_head_dim", None), getattr(model, "v_head_dim", None))
    else:
        dims = (getattr(model, "kv_channels", None) or int(getattr(model, "hidden_size", 0) or 0) // heads,)
    if not all(isinstance(d, int) and d > 0 for d in dims):
        return f"{type(model).__name__} has no attention head dim ({dims!r})"
    return None


# ---- fixes -----------------------------------------------------------------------------------------------------
class _View:
    """``obj`` with some dotted fields replaced: a fix tried without copying the config."""

    def __init__(self, obj: Any, overrides: Mapping[str, Any], prefix: str = ""):
        self.__dict__.update(_obj=obj, _overrides=overrides, _prefix=prefix)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance() sees the wrapped object's class
        return type(self.__dict__["_obj"])

    def __getattr__(self, name: str) -> Any:
        path = f"{self._prefix}{name}"
        if path in self._overrides:
            return self._overrides[path]
        value = getattr(self._obj, name)
        nested = {k[len(path) + 1 :]: v for k, v in self._overrides.items() if k.startswith(path + ".")}
        if not nested:
            return value
        if value is None or isinstance(value, Mapping):
            return {**(value or {}), **nested}
        return _View(value, self._overrides, path + ".")


def _candidates(cfg: Any, verdict: AttentionVerdict, failing: KindSelection) -> list[dict[str, Any]]:
    """Assignments that could let TE keep a backend for ``failing``, least invasive first."""
    from megatron.core.transformer.enums import AttnBackend

    inputs, kind, model = verdict.inputs, failing.kind, cfg.model
    assert inputs is not None
    found: list[dict[str, Any]] = []
    if inputs.cp > 1:
        order = ["a2a"] if inputs.softmax != "vanilla" else ["all_gather", "a2a", "p2p"]
        found += [{"model.cp_comm_type": c} for c in order if c != kind.cp_comm_type]
    value = getattr(model, "attention_backend", None)
    if isinstance(value, AttnBackend) and value is not AttnBackend.auto:
        found.append({"model.attention_backend": "auto"})  # a string: Megatron-Core then sets no variable
    env_vars = getattr(cfg, "env_vars", None) or {}
    for name in BACKEND_ENV:
        if dict(inputs.env).get(name) == "0" and name not in os.environ and name in env_vars:
            found.append({f"env_vars.{name}": "1"})
    if inputs.fp8_attention:
        mixed = getattr(cfg, "mixed_precision", None)
        prefix = "model" if mixed is None or isinstance(mixed, str) else "mixed_precision"
        fix = {f"{prefix}.fp8_dot_product_attention": False}
        if inputs.fp8_mha:
            fix[f"{prefix}.fp8_multi_head_attention"] = False
        found.append(fix)
    if inputs.dropout:
        found.append({"model.attention_dropout": 0.0})  # FusedAttention takes windows, FlashAttention 3 any, only so
    if inputs.pad_between_seqs and inputs.pad_fields[0][0].startswith("dataset.offline_packing_specs"):
        tp = int(getattr(model, "tensor_model_parallel_size", 1) or 1)
        if inputs.cp == 1 and not (tp > 1 and getattr(model, "sequence_parallel", False)):
            found.append({"dataset.offline_packing_specs.pad_seq_to_mult": 1})  # no CP/SP split needs the padding
    if inputs.deterministic and getattr(model, "deterministic_mode", False) and NONDETERMINISTIC_ENV not in os.environ:
        found.append({"model.deterministic_mode": False, f"env_vars.{NONDETERMINISTIC_ENV}": "1"})
    return found


def _kind_ok(cfg: Any, fix: Mapping[str, Any], kind: LayerKind, target: Any) -> bool:
    view = _View(cfg, fix)
    try:
        inputs = inputs_of(view)
        kinds = [k for k in layer_kinds(view) if set(k.layers) & set(kind.layers)]
    except Exception:  # noqa: BLE001 - a candidate the builders cannot read is no fix
        return False
    return all(v.selection.ok for v in _select_all(inputs, kinds, target))


def fix_for(cfg: Any, verdict: AttentionVerdict, failing: KindSelection) -> dict[str, Any]:
    """The first candidate (or, failing each alone, the candidates together) under which TE's selection keeps a
    backend for the failing layers; empty when none does."""
    candidates = _candidates(cfg, verdict, failing)
    for fix in candidates:
        if _kind_ok(cfg, fix, failing.kind, verdict.target):
            return dict(fix)
    together: dict[str, Any] = {}
    for fix in candidates:
        if "model.cp_comm_type" in fix and "model.cp_comm_type" in together:
            continue
        together.update(fix)
        if _kind_ok(cfg, together, failing.kind, verdict.target):
            return together
    return {}


# ---- what the rules and the report say -------------------------------------------------------------------------
def claims(ctx: Any, kind: LayerKind) -> set[str]:
    """The hand-written rules that report a failing layer kind themselves (their failure is TE's assert after
    the selection, or the selection's own verdict read back): ``attention.backend_available`` leaves these."""
    found: set[str] = set()
    cp = ctx.topology.cp
    if cp > 1 and kind.window is not None and kind.cp_comm_type in SWA_REFUSING_COMM_TYPES:
        found.add("cp.sliding_window_comm_type")
    if cp > 1 and softmax_type(ctx.model) != "vanilla" and kind.cp_comm_type != "a2a":
        found.add("cp.softmax_type_comm_type")
    return found


def _family(body: str) -> str | None:
    """Which backend a "Disabling ..." message is about: FlashAttention 2/3/4, FlashAttention as a whole,
    FusedAttention, UnfusedDotProductAttention."""
    for generation in ("FlashAttention 2", "FlashAttention 3", "FlashAttention 4"):
        if body.startswith(generation):
            return generation
    return next(
        (f for f in ("FlashAttention", "FusedAttention", "UnfusedDotProductAttention") if body.startswith(f)), None
    )


def _fused_reason(selection: Any, target: Any) -> str:
    """The reason a stack differs by: TE's message for FusedAttention (the backend whose rules depend on the GPU
    and cuDNN), else all decisive reasons."""
    fused = [m for m in selection.disabled if m.startswith("Disabling FusedAttention")]
    return fused[0].rstrip(". ") if fused else decisive_reasons(selection, target)


def decisive_reasons(selection: Any, target: Any = None) -> str:
    """TE's own words for why each backend dropped out: the first "Disabling ..." message per backend (each
    FlashAttention generation apart), and any that disables all of them."""
    if selection.error:
        return f"the selection itself raises {selection.error}"
    first: dict[str, str] = {}
    every: list[str] = []
    for message in selection.disabled:
        body = message.removeprefix("Disabling ")
        if body.startswith("all backends"):
            every.append(message)
        family = _family(body)
        if family is not None and family not in first:
            first[family] = message
    parts = every + list(first.values())
    if not any(f.startswith("FlashAttention") for f in first) and target is not None:
        if not (target.flash_attn or target.flash_attn_3):
            parts.append("FlashAttention: no flash-attn on the target")
    return "; ".join(p.rstrip(". ") for p in parts)


def _fields(cfg: Any, verdict: AttentionVerdict, failing: KindSelection) -> dict[str, Any]:
    inputs, kind = verdict.inputs, failing.kind
    assert inputs is not None
    fields: dict[str, Any] = {"layers": kind.layers_text(verdict.layers)}
    mode, value = pin_text(cfg.model)
    if mode == "string" or (mode == "enum" and value != "auto"):
        fields["model.attention_backend"] = value if mode == "string" else f"AttnBackend.{value}"
    if inputs.cp > 1:
        fields["model.context_parallel_size"] = inputs.cp
        fields["model.cp_comm_type"] = kind.cp_comm_type
    if kind.window is not None:
        fields["model.window_size"] = list(kind.window)
    if inputs.softmax != "vanilla":
        fields["model.softmax_type"] = inputs.softmax
    if inputs.thd:
        fields.update(inputs.pad_fields)
        fields["pad_between_seqs"] = inputs.pad_between_seqs
    if inputs.deterministic:
        fields["deterministic"] = True
    if kind.fp8 and inputs.fp8_attention:
        fields["fp8 attention"] = type(inputs.fp8_recipe).__name__
    if str(inputs.dtype) not in ("torch.bfloat16", "torch.float16"):
        fields["attention dtype"] = str(inputs.dtype).removeprefix("torch.")
    fields.update({f"env {k}": v for k, v in inputs.env if k in BACKEND_ENV and v != "1"})
    fields["target"] = verdict.target.sm
    return fields


def no_backend_violation(cfg: Any, verdict: AttentionVerdict, failing: KindSelection) -> Any:
    """The ``attention.backend_available`` finding for one failing layer kind, with a fix TE's selection takes."""
    from mbridge_seqpack.errors import Violation

    fix = fix_for(cfg, verdict, failing)
    why = (
        f"Transformer Engine's get_attention_backend leaves no backend for "
        f"{failing.kind.layers_text(verdict.layers)} on {verdict.target.describe()}: "
        f"{decisive_reasons(failing.selection, verdict.target)}. DotProductAttention.forward then raises 'No dot "
        "product attention backend is available for the provided inputs' at the first forward"
    )
    text = (
        ""
        if fix
        else "no single config change found that TE's selection accepts; change what TE's reasons name, or "
        "declare the target's GPU / flash-attn (MBRIDGE_SEQPACK_GPU_ARCH, MBRIDGE_SEQPACK_FLASH_ATTN) if it differs"
    )
    return Violation(_fields(cfg, verdict, failing), why, fix=text, assignments=fix)


def undetermined_violation(cfg: Any, verdict: AttentionVerdict, kinds: list[KindSelection] | None = None) -> Any:
    """The ``attention.backend_available`` finding where TE's selection differs between the stacks asked: not
    determined here (never a failure computed for a default stack), naming each stack's picks."""
    from mbridge_seqpack.errors import UNDETERMINED, Violation

    target = verdict.target
    text = verdict.undetermined_for(kinds if kinds is not None else verdict.kinds)
    undeclared = [
        *([] if target.arch_declared else ["the GPU"]),
        *([] if target.cudnn_declared else ["the target's cuDNN"]),
        *(["the pack metadata (max_samples_per_bin)"] if verdict.inputs and verdict.inputs.batch_bound else []),
    ]
    why = (
        "Transformer Engine's get_attention_backend keeps a backend on some of the stacks asked and none on others "
        f"({text})"
    )
    not_run = (
        f"the selection on the one target: {' and '.join(undeclared) or 'the stack'} not declared here, so each "
        "possibility was asked and they differ"
    )
    fix = f"declare the target: {ARCH_ENV_NAME} (or check --gpu-arch, or a recipe name that says the GPU)" + (
        "" if target.cudnn_declared else f" and {CUDNN_ENV_NAME}"
    )
    fields = {"target": target.describe()}
    return Violation(fields, why, fix=fix, severity=UNDETERMINED, not_run=not_run)


def not_computed_violation(cfg: Any, verdict: AttentionVerdict) -> Any:
    """The ``attention.backend_available`` finding where TE's selection decides the config but could not be asked
    here (``verdict.skipped`` says why: TE not importable, the model not readable as Megatron-Core reads it): not
    determined, never n/a."""
    from mbridge_seqpack.errors import UNDETERMINED, Violation

    return Violation(
        {"model": type(cfg.model).__name__},
        "Transformer Engine's backend selection for this model's attention is not computed here",
        fix="run the attention once on the target GPU (scripts/gpu_check.py) before the full launch",
        severity=UNDETERMINED,
        not_run=str(verdict.skipped),
    )


def recipe_switch_violation(verdict: AttentionVerdict) -> Any:
    """The ``attention.backend_available`` finding where NVTE_DPA_FP8_RECIPE kept the selection from being asked
    (:attr:`AttentionVerdict.recipe_switched`): not determined here, with what was not run."""
    from mbridge_seqpack.errors import UNDETERMINED, Violation

    env = dict(verdict.inputs.env) if verdict.inputs is not None else {}
    fields: dict[str, Any] = {f"env {DPA_FP8_RECIPE_ENV}": env.get(DPA_FP8_RECIPE_ENV)}
    if verdict.inputs is not None and verdict.inputs.fp8_recipe is not None:
        fields["fp8 attention"] = type(verdict.inputs.fp8_recipe).__name__
    return Violation(
        fields,
        f"Transformer Engine's backend selection for FP8 attention under {DPA_FP8_RECIPE_ENV} is not computed here",
        fix=(
            f"unset {DPA_FP8_RECIPE_ENV} to have the selection computed for the config's own recipe, or check the "
            "attention on the target GPU"
        ),
        severity=UNDETERMINED,
        not_run=str(verdict.skipped),
    )


def verdict_summary(verdict: AttentionVerdict) -> dict[str, Any]:
    """The verdict as data (``check --json``)."""
    if not verdict.computed:
        return {"computed": False, "skipped": verdict.skipped}
    return {
        "computed": True,
        "target": verdict.target.describe(),
        "also_asked": [label for label, _ in verdict.others],
        "undetermined": verdict.undetermined,
        "kinds": [
            {
                "layers": list(k.kind.layers),
                "window_size": list(k.kind.window) if k.kind.window else None,
                "cp_comm_type": k.kind.cp_comm_type,
                "fp8": k.kind.fp8,
                "backend": k.selection.backend,
                "disabled": list(k.selection.disabled),
            }
            for k in verdict.kinds
        ],
    }


def stacks_text(labels: list[str]) -> str:
    """The stacks asked, architectures that were asked on the same cuDNN versions named together: ``sm100, sm103
    with cuDNN 9.12.0, 9.13.0`` instead of one "smX with cuDNN V" per pair (twelve versions on three GPUs)."""
    versions: dict[str, list[str]] = {}
    for label in labels:
        arch, _, cudnn = label.partition(" with cuDNN ")
        versions.setdefault(arch, []).append(cudnn)
    groups: dict[tuple[str, ...], list[str]] = {}
    for arch, found in versions.items():
        groups.setdefault(tuple(v for v in found if v), []).append(arch)
    return "; ".join(
        ", ".join(archs) + (f" with cuDNN {', '.join(found)}" if found else "") for found, archs in groups.items()
    )


def verdict_notes(verdict: AttentionVerdict, model: Any) -> list[str]:
    """What ``check`` prints about attention: the backend TE will pick per layer kind, on which stack, and where a
    string ``attention_backend`` sets nothing."""
    notes: list[str] = []
    mode, value = pin_text(model)
    if mode == "string" and not local_attention_swap(model):
        notes.append(
            f"model.attention_backend={value!r} is a string (as an override or YAML gives it): Megatron-Core's "
            "_set_attention_backend compares it with the AttnBackend members and sets no NVTE_* variable, and "
            "provide() swaps nothing for it, so Transformer Engine chooses as with auto (from the NVTE_* variables "
            "of the launch). To pin a backend, set the enum in Python (AttnBackend."
            f"{value if value in ('flash', 'fused', 'unfused') else 'fused'}) or export NVTE_*_ATTN=0 for the "
            "others."
        )
    if not verdict.computed:
        notes.append(f"attention: Transformer Engine's backend selection not run: {verdict.skipped}")
        return notes
    picks = [
        f"{k.selection.backend or 'NO BACKEND'} for {k.kind.layers_text(verdict.layers)}"
        + (f" (window {list(k.kind.window)})" if k.kind.window else "")
        for k in verdict.kinds
    ]
    notes.append(f"attention: Transformer Engine picks {'; '.join(picks)}, on {verdict.target.describe()}")
    if verdict.others:
        asked = stacks_text([label for label, _ in verdict.others])
        notes.append(
            f"attention: also asked on {asked} (not declared here); "
            + (f"they differ: {verdict.undetermined}" if verdict.undetermined else "the same outcome on each")
        )
    return notes
