"""The attention agreement cases: configs whose Transformer Engine backend the analysis must name as TE's own
selection does, TE called directly as the reference, and every case's verdict as data (read by
tests/analysis/test_attention_backend.py, also in a process of its own)."""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest
import torch

from mbridge_seqpack import check
from mbridge_seqpack.analysis import attention_backend as ab
from mbridge_seqpack.analysis import te_attention as te
from mbridge_seqpack.rules import RuleContext

AUTO_ENV = {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "1"}  # what MCore sets for auto
FLASH_ENV = {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"}
FUSED_ENV = {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"}
UNFUSED_ENV = {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"}
NGC_FLASH = ("2.7.4.post1", "3.0.0")
FUSED_F16 = "FusedAttention (sub-backend 1)"
FUSED_FP8 = "FusedAttention (sub-backend 2)"
FA2 = "FlashAttention (2.7.4.post1)"
FA3 = "FlashAttention (3.0.0)"
UNFUSED = "UnfusedDotProductAttention"


# ---- the reference: TE's selection called directly -------------------------------------------------------------
#: TE's own reject texts, as nvte_get_fused_attn_backend_v2 / cudnn-frontend in libtransformer_engine.so build them
#: (read from the binary: tests/analysis/test_attention_backend.py test_cited_texts_are_the_binary_s checks each)
SM90_THD = "F16/BF16 fused attention with THD format requires sm90 or later."
LEARNABLE_THD = "Known cuDNN < 9.26.0 issue with THD learnable softmax backward. Please upgrade cuDNN."
FP8_THD = "FP8 fused attention with THD format requires cuDNN 9.23.0 or later!"
MXFP8_CUDNN = "MXFP8 fused attention requires cuDNN 9.21.0 or later!"
DET_BLACKWELL = (
    "Deterministic algorithm is not supported on blackwell architecture when dbias, rng/dropout, alibi is enabled"
)
FP8_DET_BLACKWELL = (
    "FP8 deterministic algorithm (required for MXFP8 and d_qk=192/d_v=128) is not supported on Blackwell when "
    "dropout is enabled"
)
RAGGED_SINK = (
    "SDPA backward with ragged offsets and a sink token requires cuDNN 9.26.0 or newer (older versions hit an "
    "out-of-bounds read in the compute_dot_do_o pre-pass)."
)
D192 = "Num hidden_dim d_v should be equal to 128 if d_qk is 192"
HOPPER_HEAD_DIM = "Num hidden_dim should be less than or equal to 256 and hidden_dim should be multiple of 8"
TE_TEXTS = (
    SM90_THD,
    LEARNABLE_THD,
    FP8_THD,
    MXFP8_CUDNN,
    DET_BLACKWELL,
    FP8_DET_BLACKWELL,
    RAGGED_SINK,
    D192,
    HOPPER_HEAD_DIM,
)


@contextlib.contextmanager
def _te_stack(
    arch: tuple[int, int],
    flash: tuple[str | None, str | None],
    cudnn: tuple[int, int, int],
    rejected_by: str | None = None,
) -> Iterator:
    """TE's module state for a GPU stack, set with monkeypatch and TE's own FlashAttentionUtils setters. The C++
    query (it opens a cuDNN handle on the device) answers as the case says TE's fixed rules do: ``rejected_by``,
    TE's own reject text, or accepted."""
    from packaging.version import Version
    from transformer_engine.pytorch.attention.dot_product_attention import utils as dpa
    from transformer_engine.pytorch.constants import DType
    from transformer_engine.pytorch.cpp_extensions.fused_attn import FusedAttnBackend

    def cudnn_accepts(**kwargs: Any) -> tuple[int, str]:
        if rejected_by:
            return int(FusedAttnBackend.No_Backend), rejected_by
        fp8 = kwargs["qkv_dtype"] in (DType.kFloat8E4M3, DType.kFloat8E5M2)
        return int(FusedAttnBackend.FP8 if fp8 else FusedAttnBackend.F16_arbitrary_seqlen), ""

    fa = dpa.FlashAttentionUtils
    saved = {k: v for k, v in vars(fa).items() if not k.startswith("__") and not isinstance(v, staticmethod)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dpa, "get_device_compute_capability", lambda: arch)
        mp.setattr(dpa, "get_cudnn_version", lambda: cudnn)
        mp.setattr(dpa, "_get_fused_attn_backend", cudnn_accepts)
        try:
            fa.warning_printed = fa.v3_warning_printed = fa.v4_warning_printed = True
            if flash[0]:
                fa.version = Version(flash[0])
                fa.set_flash_attention_version()
            if flash[1]:
                fa.fa3_version = Version(flash[1])
                fa.set_flash_attention_3_params()
            yield dpa
        finally:
            for name, value in saved.items():
                setattr(fa, name, value)


def te_direct(
    params: Any,
    arch: tuple[int, int],
    env: dict[str, str],
    flash: tuple[str | None, str | None] = NGC_FLASH,
    cudnn: tuple[int, int, int] = (9, 20, 0),
    rejected_by: str | None = None,
) -> tuple[bool, bool, bool]:
    """(flash, fused, unfused) as ``get_attention_backend`` selects them for ``params`` with ``env``."""
    with _te_stack(arch, flash, cudnn, rejected_by) as dpa, pytest.MonkeyPatch.context() as mp:
        for name in [k for k in os.environ if k.startswith("NVTE_")]:
            mp.delenv(name)
        for name, value in env.items():
            mp.setenv(name, value)
        flash_on, _, fused_on, _, unfused_on, _ = dpa.get_attention_backend(params)
    return bool(flash_on), bool(fused_on), bool(unfused_on)


def expected_params(**changes: Any) -> Any:
    """The AttentionParams forward builds for the small GPT (12 layers, 12 heads of 64, dropout 0.1) in a 4096-token
    packed row: THD, padding_causal, q/k/v as separate tensors, one sequence filling the row."""
    from transformer_engine.pytorch.attention.dot_product_attention.utils import AttentionParams

    base: dict[str, Any] = dict(
        qkv_type=torch.Tensor,
        qkv_dtype=torch.bfloat16,
        qkv_layout="thd_thd_thd",
        batch_size=1,
        num_heads=12,
        num_gqa_groups=12,
        max_seqlen_q=4096,
        max_seqlen_kv=4096,
        num_tokens_q=4096,
        num_tokens_kv=4096,
        head_dim_qk=64,
        head_dim_v=64,
        attn_mask_type="padding_causal",
        window_size=(-1, 0),
        bottom_right_diagonal=False,
        core_attention_bias_requires_grad=False,
        pad_between_seqs=False,
        attention_dropout=0.1,
        softmax_scale=0.125,
        is_training=True,
    )
    base.update(changes)
    return AttentionParams(**base)


SBHD = dict(qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="causal", num_tokens_q=0, num_tokens_kv=0)


def _cp2(cfg: Any) -> None:
    cfg.model.context_parallel_size = 2
    cfg.model.calculate_per_token_loss = True
    cfg.ddp.average_in_collective = False
    if cfg.dataset.offline_packing_specs is not None:
        cfg.dataset.offline_packing_specs.pad_seq_to_mult = 4


def _set(**fields: Any) -> Callable[[Any], None]:
    def go(cfg: Any) -> None:
        for path, value in fields.items():
            obj = cfg
            *parents, leaf = path.split("__")
            for name in parents:
                obj = getattr(obj, name)
            setattr(obj, leaf, value)

    return go


def _all(*steps: Callable[[Any], None]) -> Callable[[Any], None]:
    def go(cfg: Any) -> None:
        for step in steps:
            step(cfg)

    return go


def _fp8(recipe: str) -> Callable[[Any], None]:
    return _set(
        mixed_precision=None, model__fp8="hybrid", model__fp8_recipe=recipe, model__fp8_dot_product_attention=True
    )


def _backend(name: str) -> Callable[[Any], None]:
    def go(cfg: Any) -> None:
        from megatron.core.transformer.enums import AttnBackend

        cfg.model.attention_backend = AttnBackend[name]

    return go


PAD4 = _set(dataset__offline_packing_specs__pad_seq_to_mult=4)
CP2_PAD = dict(pad_between_seqs=True, context_parallel=True, cp_size=2, num_tokens_q=2048, num_tokens_kv=2048)


@dataclass
class Agreement:
    name: str
    change: Callable[[Any], None]
    arch: str
    params: dict[str, Any]
    env: dict[str, str]
    backend: str | None
    base: str = "packed_cfg"
    flash: tuple[str | None, str | None] = NGC_FLASH
    cudnn: tuple[int, int, int] = (9, 20, 0)
    stack_env: dict[str, str] = field(default_factory=dict)
    rejected_by: str | None = None  # TE's reject text for the fixed FusedAttention rules, where they refuse


OFF_BY_ONE_THD = (
    _all(PAD4, _set(model__softmax_type="off-by-one")),
    "sm90",
    {"pad_between_seqs": True, "softmax_type": "off-by-one"},
    AUTO_ENV,
)
CUDNN_9_26 = {te.CUDNN_ENV: "9.26.0"}


def _head_dims(d: int, arch: str, backend: str, refused: str) -> Agreement:
    """The unpacked config with head dims ``d`` (kv_channels), whose backward cudnn-frontend refuses on ``arch``."""
    params = {**SBHD, "head_dim_qk": d, "head_dim_v": d, "softmax_scale": 1 / math.sqrt(d)}
    change = _set(model__kv_channels=d)
    name = f"head_dim_{d}_{arch}"
    return Agreement(name, change, arch, params, AUTO_ENV, backend, "unpacked_cfg", rejected_by=refused)


AGREEMENTS = [
    Agreement("thd_sm90", _set(), "sm90", {}, AUTO_ENV, FUSED_F16),
    Agreement("thd_sm80_prefers_flash", _set(), "sm80", {}, AUTO_ENV, FA2, rejected_by=SM90_THD),
    Agreement("thd_padded_sm90", PAD4, "sm90", {"pad_between_seqs": True}, AUTO_ENV, FUSED_F16),
    Agreement("thd_padded_sm80", PAD4, "sm80", {"pad_between_seqs": True}, AUTO_ENV, None, rejected_by=SM90_THD),
    Agreement(
        "enum_flash_thd_padded", _all(_backend("flash"), PAD4), "sm90", {"pad_between_seqs": True}, FLASH_ENV, None
    ),
    Agreement(
        "enum_flash_thd_padded_no_dropout_fa3",
        _all(_backend("flash"), PAD4, _set(model__attention_dropout=0.0)),
        "sm90",
        {"pad_between_seqs": True, "attention_dropout": 0.0},
        FLASH_ENV,
        FA3,
    ),
    Agreement(
        "enum_flash_thd_padded_no_dropout_sm100",
        _all(_backend("flash"), PAD4, _set(model__attention_dropout=0.0)),
        "sm100",
        {"pad_between_seqs": True, "attention_dropout": 0.0},
        FLASH_ENV,
        None,
    ),
    Agreement(
        "string_flash_sets_nothing",
        _all(_set(model__attention_backend="flash"), PAD4),
        "sm90",
        {"pad_between_seqs": True},
        {},
        FUSED_F16,
    ),
    Agreement(
        "enum_fused_thd_padded_sm80",
        _all(_backend("fused"), PAD4),
        "sm80",
        {"pad_between_seqs": True},
        FUSED_ENV,
        None,
        rejected_by=SM90_THD,
    ),
    Agreement("enum_unfused_thd", _backend("unfused"), "sm90", {}, UNFUSED_ENV, UNFUSED),
    Agreement(
        "enum_unfused_thd_padded",
        _all(_backend("unfused"), PAD4),
        "sm90",
        {"pad_between_seqs": True},
        UNFUSED_ENV,
        None,
    ),
    Agreement(
        "env_vars_fused_off_with_string_auto",
        _all(_set(model__attention_backend="auto", env_vars={"NVTE_FUSED_ATTN": "0"}), PAD4),
        "sm90",
        {"pad_between_seqs": True},
        {"NVTE_FUSED_ATTN": "0"},
        None,
    ),
    Agreement("cp2_p2p", _cp2, "sm90", CP2_PAD, AUTO_ENV, FUSED_F16),
    Agreement(
        "cp2_all_gather",
        _all(_cp2, _set(model__cp_comm_type="all_gather")),
        "sm90",
        {**CP2_PAD, "cp_comm_type": "all_gather"},
        AUTO_ENV,
        FUSED_F16,
    ),
    Agreement(
        "cp2_a2a",
        _all(_cp2, _set(model__cp_comm_type="a2a")),
        "sm90",
        {**CP2_PAD, "cp_comm_type": "a2a"},
        AUTO_ENV,
        FUSED_F16,
    ),
    Agreement(  # selected, then context_parallel.py asserts: cp.sliding_window_comm_type
        "cp2_window_p2p",
        _all(_cp2, _set(model__window_size=(512, 0), model__attention_dropout=0.0)),
        "sm90",
        {**CP2_PAD, "window_size": (512, 0), "attention_dropout": 0.0},
        AUTO_ENV,
        FA3,
    ),
    Agreement(
        "cp2_window_p2p_sm100",
        _all(_cp2, _set(model__window_size=(512, 0), model__attention_dropout=0.0)),
        "sm100",
        {**CP2_PAD, "window_size": (512, 0), "attention_dropout": 0.0},
        AUTO_ENV,
        None,
    ),
    Agreement(
        "cp2_window_all_gather",
        _all(_cp2, _set(model__window_size=(512, 0), model__cp_comm_type="all_gather", model__attention_dropout=0.0)),
        "sm90",
        {**CP2_PAD, "window_size": (512, 0), "cp_comm_type": "all_gather", "attention_dropout": 0.0},
        AUTO_ENV,
        FUSED_F16,
    ),
    Agreement(  # FusedAttention takes windows only without dropout
        "cp2_window_all_gather_dropout",
        _all(_cp2, _set(model__window_size=(512, 0), model__cp_comm_type="all_gather")),
        "sm90",
        {**CP2_PAD, "window_size": (512, 0), "cp_comm_type": "all_gather"},
        AUTO_ENV,
        None,
    ),
    Agreement(
        "cp2_sink_p2p",
        _all(_cp2, _set(model__softmax_type="learnable")),
        "sm90",
        {**CP2_PAD, "softmax_type": "learnable"},
        AUTO_ENV,
        None,
    ),
    Agreement(
        "cp2_sink_a2a",
        _all(_cp2, _set(model__softmax_type="learnable", model__cp_comm_type="a2a")),
        "sm90",
        {**CP2_PAD, "softmax_type": "learnable", "cp_comm_type": "a2a"},
        AUTO_ENV,
        None,
        rejected_by=LEARNABLE_THD,
    ),
    Agreement(
        "cp2_sink_a2a_cudnn_9_26",
        _all(_cp2, _set(model__softmax_type="learnable", model__cp_comm_type="a2a")),
        "sm90",
        {**CP2_PAD, "softmax_type": "learnable", "cp_comm_type": "a2a"},
        AUTO_ENV,
        FUSED_F16,
        cudnn=(9, 26, 0),
        stack_env={te.CUDNN_ENV: "9.26.0"},
    ),
    Agreement(
        "learnable_sink_thd_padded_cudnn_9_20",
        _all(PAD4, _set(model__softmax_type="learnable")),
        "sm90",
        {"pad_between_seqs": True, "softmax_type": "learnable"},
        AUTO_ENV,
        None,
        rejected_by=LEARNABLE_THD,
    ),
    # cudnn-frontend: a ragged backward with a sink token needs cuDNN 9.26; nothing else takes padded THD
    Agreement("sink_thd_padded", *OFF_BY_ONE_THD, None, rejected_by=RAGGED_SINK),
    Agreement("sink_thd_padded_cudnn_9_26", *OFF_BY_ONE_THD, FUSED_F16, cudnn=(9, 26, 0), stack_env=CUDNN_9_26),
    Agreement(
        "sink_thd_padded_cudnn_9_17", *OFF_BY_ONE_THD, None, cudnn=(9, 17, 0), stack_env={te.CUDNN_ENV: "9.17.0"}
    ),
    Agreement(
        "deterministic_sink_thd_padded",
        _all(
            PAD4,
            _set(model__softmax_type="learnable"),
            _set(
                model__deterministic_mode=True,
                model__cross_entropy_loss_fusion=False,
                env_vars={ab.NONDETERMINISTIC_ENV: "0"},
            ),
        ),
        "sm90",
        {"pad_between_seqs": True, "softmax_type": "learnable", "deterministic": True},
        {**AUTO_ENV, ab.NONDETERMINISTIC_ENV: "0"},
        None,
    ),
    Agreement(
        "deterministic_thd_padded",
        _all(
            PAD4,
            _set(
                model__deterministic_mode=True,
                model__cross_entropy_loss_fusion=False,
                env_vars={ab.NONDETERMINISTIC_ENV: "0"},
            ),
        ),
        "sm90",
        {"pad_between_seqs": True, "deterministic": True},
        {**AUTO_ENV, ab.NONDETERMINISTIC_ENV: "0"},
        FUSED_F16,
    ),
    Agreement(
        "deterministic_dropout_thd_padded_sm100",
        _all(
            PAD4,
            _set(
                model__deterministic_mode=True,
                model__cross_entropy_loss_fusion=False,
                env_vars={ab.NONDETERMINISTIC_ENV: "0"},
            ),
        ),
        "sm100",
        {"pad_between_seqs": True, "deterministic": True},
        {**AUTO_ENV, ab.NONDETERMINISTIC_ENV: "0"},
        None,
        rejected_by=DET_BLACKWELL,
    ),
    Agreement(
        "fp8_delayed_attention_thd_sm90_cudnn_9_20",
        _fp8("delayed"),
        "sm90",
        {"fp8": True},
        AUTO_ENV,
        None,
        rejected_by=FP8_THD,
    ),
    Agreement("fp8_current_scaling_attention_sm90", _fp8("tensorwise"), "sm90", {"fp8": True}, AUTO_ENV, None),
    Agreement(
        "fp8_current_scaling_attention_thd_sm100_cudnn_9_20",
        _fp8("tensorwise"),
        "sm100",
        {"fp8": True},
        AUTO_ENV,
        None,
        rejected_by=FP8_THD,
    ),
    Agreement(  # sdpa_fp8_bwd.h: Blackwell's FP8 backward for d_qk <= 192, d_v <= 128 is the deterministic one
        "fp8_current_scaling_attention_thd_sm100_cudnn_9_23",
        _fp8("tensorwise"),
        "sm100",
        {"fp8": True},
        AUTO_ENV,
        None,
        cudnn=(9, 23, 0),
        stack_env={te.CUDNN_ENV: "9.23.0"},
        rejected_by=FP8_DET_BLACKWELL,
    ),
    Agreement(
        "fp8_current_scaling_attention_thd_sm100_cudnn_9_23_no_dropout",
        _all(_fp8("tensorwise"), _set(model__attention_dropout=0.0)),
        "sm100",
        {"fp8": True, "attention_dropout": 0.0},
        AUTO_ENV,
        FUSED_FP8,
        cudnn=(9, 23, 0),
        stack_env={te.CUDNN_ENV: "9.23.0"},
    ),
    Agreement(  # Megatron-Bridge's GB200 MXFP8 recipes: cuDNN >= 9.21 needed, torch 2.13.0 pins 9.20.0
        "mxfp8_attention_sm100_cudnn_9_20",
        _fp8("mxfp8"),
        "sm100",
        {**SBHD, "fp8": True},
        AUTO_ENV,
        None,
        base="unpacked_cfg",  # TE's Python selection refuses MXFP8 below cuDNN 9.21 itself, before the C++ rule
    ),
    Agreement(
        "mxfp8_attention_sm100_cudnn_9_21",
        _fp8("mxfp8"),
        "sm100",
        {**SBHD, "fp8": True},
        AUTO_ENV,
        None,
        base="unpacked_cfg",
        cudnn=(9, 21, 0),
        stack_env={te.CUDNN_ENV: "9.21.0"},
        rejected_by=FP8_DET_BLACKWELL,  # MXFP8's backward takes the deterministic algorithm: no dropout
    ),
    Agreement(
        "mxfp8_attention_sm100_cudnn_9_21_no_dropout",
        _all(_fp8("mxfp8"), _set(model__attention_dropout=0.0)),
        "sm100",
        {**SBHD, "fp8": True, "attention_dropout": 0.0},
        AUTO_ENV,
        FUSED_FP8,
        base="unpacked_cfg",
        cudnn=(9, 21, 0),
        stack_env={te.CUDNN_ENV: "9.21.0"},
    ),
    # cudnn-frontend: Blackwell's backward takes d_qk = 192 only with d_v = 128, FlashAttention 2 serves; Hopper's
    # takes head dims up to 256, as flash-attn 2 and 3 do: unfused
    _head_dims(192, "sm100", FA2, D192),
    _head_dims(288, "sm90", UNFUSED, HOPPER_HEAD_DIM),
    Agreement(
        "unpacked_cp2_window_p2p",
        _all(_cp2, _set(model__window_size=(512, 0))),
        "sm90",
        {**SBHD, "context_parallel": True, "cp_size": 2, "window_size": (512, 0)},
        AUTO_ENV,
        FA2,
        base="unpacked_cfg",
    ),
    Agreement(
        "no_flash_attn_enum_flash_unpacked",
        _backend("flash"),
        "sm90",
        SBHD,
        FLASH_ENV,
        None,
        base="unpacked_cfg",
        flash=(None, None),
        stack_env={te.FLASH_ENV: "none"},
    ),
]


def _verdict(cfg: Any, arch: str, world: int = 8) -> Any:
    with te.declared(gpu_arch=arch):
        return RuleContext.build(cfg, world).attention_verdict


# ---- TE's own answer, in every process ------------------------------------------------------------------------
def agreement_records() -> list[list[Any]]:
    """Every agreement case's attention verdict, as data: each layer kind's backend and TE's reasons, and the
    attention rules' findings (``check``), on the case's declared stack."""
    import warnings

    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from mbridge_seqpack import apply
        from mbridge_seqpack.compose.mixins import OfflinePacking

    found = []
    for case in AGREEMENTS:
        cfg = sft_base(small_gpt_provider(4096), seq_length=4096, global_batch_size=16)
        if case.base == "packed_cfg":
            cfg = apply(cfg, OfflinePacking(pack_size=4096))
        case.change(cfg)
        with pytest.MonkeyPatch.context() as mp:
            for name in (te.ARCH_ENV, te.CUDNN_ENV, te.FLASH_ENV, ab.NONDETERMINISTIC_ENV):
                mp.delenv(name, raising=False)
            for name, value in case.stack_env.items():
                mp.setenv(name, value)
            verdict = _verdict(cfg, case.arch)
            with te.declared(gpu_arch=case.arch):
                rules = [v.to_dict() for v in check(cfg, world_size=8) if v.rule_id.startswith("attention.")]
        kinds = [[k.selection.backend, list(k.selection.disabled)] for k in verdict.kinds]
        found.append([case.name, kinds, verdict.undetermined, rules])
    return found
