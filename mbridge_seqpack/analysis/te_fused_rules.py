"""Transformer Engine's fixed FusedAttention support rules, as data: what ``nvte_get_fused_attn_backend_v2``
(libtransformer_engine.so, TE 2.20.2) and the cudnn-frontend validation compiled into it refuse before cuDNN's own
support query runs on the device.

TE's Python selection hands each config to ``tex.get_fused_attn_backend``, which calls
``nvte_get_fused_attn_backend_v2``: it first applies fixed rules over the config, the architecture and the cuDNN
version, each with a reject message, and only then asks cuDNN (``support_verdict_f16`` / ``support_verdict_fp8``),
which needs a GPU. The fixed rules are read from the installed binary: each :class:`FixedRule` carries the reject
text exactly as the binary builds it, and its condition with the thresholds the compiled code compares (disassembly
of ``nvte_get_fused_attn_backend_v2`` at the cited addresses: ``cmp $0x59`` sm <= 89, ``cmp $0x1688b`` cuDNN <=
92299, ...). The cudnn-frontend rules are the SDPA validation the support query runs on the graphs TE builds
(forward, then backward when training): ``sdpa_support_surface.h``, ``scaled_dot_product_flash_attention.h`` and
``sdpa_fp8_bwd.h`` of nvidia-cudnn-frontend 1.30.0, the release whose every condition text the binary holds. Their
messages are plain strings in the binary, and each condition is there too, stringified by the frontend's error
macro (``#cond ") at "``).

The binary keeps the v2 function's messages the way its compiler emitted them: 16-byte pieces in a constant pool
(shared between messages), the last few bytes as an immediate in the code. :func:`drift` checks the cited texts
against the bytes of the installed .so on those terms, reports any v2 message the data does not cite, and reads
every cudnn-frontend reject condition in the binary: each must be cited by a rule or classified, with the reason
it is not one, in ``te_frontend_texts``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["Query", "FixedRule", "V2_RULES", "FRONTEND_RULES", "RULES", "query_of", "first_reject", "drift", "so_path"]


@dataclass(frozen=True)
class Query:
    """The inputs the fixed rules read: the FusedAttentionParams TE passes, on a target architecture and cuDNN."""

    arch: tuple[int, int]
    cudnn: tuple[int, int, int]
    dtype: str  # "f16" (FP16/BF16), "fp8" or "other"
    q_thd: bool
    kv_thd: bool
    paged: bool
    qkv_format: str  # "sbhd", "bshd", "thd", "bhsd" or a mixed one ("thd_2bshd")
    padding_mask: bool
    bias: str  # "no_bias", "pre_scale_bias", "post_scale_bias", "alibi"
    softmax: str  # "vanilla", "off_by_one", "learnable"
    scaling: str  # NVTE scaling mode name, lower case ("delayed_tensor_scaling", "mxfp8_1d_scaling")
    is_training: bool
    deterministic: bool
    cuda_graph: bool
    return_max_logit: bool
    dropout: float
    head_dim_qk: int
    head_dim_v: int
    max_seqlen_kv: int
    max_seqlen_q: int
    num_heads: int
    num_gqa_groups: int
    num_tokens_q: int
    num_tokens_kv: int
    pages: tuple[int, ...]  # num_pages_k/v, page_size_k/v, max_pages_per_seq_k/v

    @property
    def sm(self) -> int:
        return 10 * self.arch[0] + self.arch[1]

    @property
    def cudnn_int(self) -> int:
        """As ``cudnnGetVersion()`` returns it (9.23.0 -> 92300), the value the binary compares."""
        return 10000 * self.cudnn[0] + 100 * self.cudnn[1] + self.cudnn[2]

    @property
    def ragged(self) -> bool:
        return self.q_thd or self.kv_thd

    @property
    def mxfp8(self) -> bool:
        return "mxfp8" in self.scaling


@dataclass(frozen=True)
class FixedRule:
    """One reject of TE's fixed FusedAttention rules: its message as the binary builds it, where it is, and when."""

    name: str
    text: str
    family: str  # "nvte_get_fused_attn_backend_v2" or "cudnn-frontend"
    where: str  # the compiled code that decides it
    applies: Callable[[Query], bool]
    condition: str = ""  # cudnn-frontend: the condition as its error macro stringifies it into the binary


def _name(value: Any) -> str:
    return str(getattr(value, "name", value)).lower().removeprefix("nvte_")


def _formats(layout: str) -> tuple[str, str, str, bool]:
    """(q format, kv format, qkv format, paged) of an NVTE_QKV_Layout name (``thd_thd_thd``, ``paged_kv_bshd...``,
    ``sbh3d``), as nvte_get_q_format / nvte_get_kv_format / nvte_get_qkv_format map them."""
    paged = layout.startswith("paged_kv_")
    parts = layout.removeprefix("paged_kv_").split("_")

    def fmt(part: str) -> str:
        return re.sub(r"\d", "", part).replace("hhd", "hd")

    q, kv = fmt(parts[0]), fmt(parts[-1])
    return q, kv, (q if q == kv else f"{q}_2{kv}"), paged


def query_of(kwargs: Mapping[str, Any], arch: tuple[int, int], cudnn: tuple[int, int, int]) -> Query:
    """The rules' inputs from the keyword arguments ``get_attention_backend`` passes to ``_get_fused_attn_backend``
    (its ``fused_attn_kwargs``), TE's own enums read by name."""
    dtype = _name(kwargs["qkv_dtype"])
    kind = "fp8" if "float8" in dtype else "f16" if dtype in ("kfloat16", "kbfloat16") else "other"
    q, kv, qkv, paged = _formats(_name(kwargs["qkv_layout"]))
    mask = _name(kwargs["attn_mask_type"])
    pages = tuple(
        int(kwargs.get(k, 0) or 0)
        for k in (
            "num_pages_k",
            "num_pages_v",
            "page_size_k",
            "page_size_v",
            "max_pages_per_seq_k",
            "max_pages_per_seq_v",
        )
    )
    return Query(
        arch=tuple(arch),  # type: ignore[arg-type]
        cudnn=tuple(cudnn),  # type: ignore[arg-type]
        dtype=kind,
        q_thd=q == "thd",
        kv_thd=kv == "thd",
        paged=paged,
        qkv_format=qkv,
        padding_mask=mask.startswith("padding"),
        bias=_name(kwargs["bias_type"]),
        softmax=_name(kwargs["softmax_type"]).removesuffix("_softmax"),
        scaling=_name(kwargs.get("scaling_mode", "")),
        is_training=bool(kwargs["is_training"]),
        deterministic=bool(kwargs["deterministic"]),
        cuda_graph=bool(kwargs.get("cuda_graph", False)),
        return_max_logit=bool(kwargs.get("return_max_logit", False)),
        dropout=float(kwargs["dropout"]),
        head_dim_qk=int(kwargs["head_dim_qk"]),
        head_dim_v=int(kwargs["head_dim_v"]),
        max_seqlen_kv=int(kwargs["max_seqlen_kv"]),
        max_seqlen_q=int(kwargs["max_seqlen_q"]),
        num_heads=int(kwargs["num_attn_heads"]),
        num_gqa_groups=int(kwargs["num_gqa_groups"]),
        num_tokens_q=int(kwargs.get("num_tokens_q", 0) or 0),
        num_tokens_kv=int(kwargs.get("num_tokens_kv", 0) or 0),
        pages=pages,
    )


V2 = "nvte_get_fused_attn_backend_v2"
FE = "cudnn-frontend"

#: in the order nvte_get_fused_attn_backend_v2 tests them: layout and bias first, then by data type
V2_RULES: tuple[FixedRule, ...] = (
    FixedRule(
        "thd_mask",
        "THD format requires PADDING / PADDING_CAUSAL / PADDING_CAUSAL_BOTTOM_RIGHT mask.",
        V2,
        "0x22907a0: q or kv THD without a padding mask",
        lambda q: q.ragged and not q.padding_mask,
    ),
    FixedRule(
        "thd_num_tokens",
        "THD format requires num_tokens_q / num_tokens_kv to be set for the ragged inputs.",
        V2,
        "0x22907ae / 0x22905b0: num_tokens_q (q THD) or num_tokens_kv (kv THD) is 0",
        lambda q: (q.q_thd and q.num_tokens_q == 0) or (q.kv_thd and q.num_tokens_kv == 0),
    ),
    FixedRule(
        "paged_mask",
        "Paged KV requires PADDING / PADDING_CAUSAL / PADDING_CAUSAL_BOTTOM_RIGHT mask.",
        V2,
        "0x22905ce: paged KV layout without a padding mask",
        lambda q: q.paged and not q.padding_mask,
    ),
    FixedRule(
        "paged_sizes",
        "Paged KV requires num_pages, page_size and max_pages_per_seq to be set for both K and V.",
        V2,
        "0x22905dc-0x2290630: any of the six page counts is 0",
        lambda q: q.paged and 0 in q.pages,
    ),
    FixedRule(
        "pre_scale_bias",
        "Fused attention does not support pre-scale bias.",
        V2,
        "0x2290636: bias_type == NVTE_PRE_SCALE_BIAS",
        lambda q: q.bias == "pre_scale_bias",
    ),
    FixedRule(
        "f16_thd_arch",
        "F16/BF16 fused attention with THD format requires sm90 or later.",
        V2,
        "0x22907e0: F16/BF16, q and kv THD, cmp $0x59 (sm <= 89)",
        lambda q: q.dtype == "f16" and q.q_thd and q.kv_thd and q.sm <= 89,
    ),
    FixedRule(
        "f16_cuda_graph_cudnn",
        "Known cuDNN <= 9.15 issue with CUDA graph. Please upgrade cuDNN.",
        V2,
        "0x22907fb / 0x2290b60: F16/BF16 training, cuDNN <= 91500, SBHD/BSHD, max_seqlen_kv % 128 != 0, CUDA graph, "
        "no padding mask",
        lambda q: (
            q.dtype == "f16"
            and q.is_training
            and q.cudnn_int <= 91500
            and q.qkv_format in ("sbhd", "bshd")
            and q.max_seqlen_kv % 128 != 0
            and q.cuda_graph
            and not q.padding_mask
        ),
    ),
    FixedRule(
        "f16_thd_learnable_cudnn",
        "Known cuDNN < 9.26.0 issue with THD learnable softmax backward. Please upgrade cuDNN.",
        V2,
        "0x229081e-0x229083a: F16/BF16 training, ragged, softmax_type == learnable, cmp $0x169b7 (cuDNN <= 92599)",
        lambda q: (
            q.dtype == "f16" and q.is_training and q.ragged and q.softmax == "learnable" and q.cudnn_int <= 92599
        ),
    ),
    FixedRule(
        "fp8_max_logit",
        "FP8 fused attention does not support return_max_logit=True.",
        V2,
        "0x2290663: FP8, return_max_logit",
        lambda q: q.dtype == "fp8" and q.return_max_logit,
    ),
    FixedRule(
        "fp8_format",
        "FP8 fused attention supports BSHD/SBHD/BHSD/THD formats, found ",
        V2,
        "0x2290671: FP8, qkv format not SBHD/BSHD/THD/BHSD (the format's name follows the text)",
        lambda q: q.dtype == "fp8" and q.qkv_format not in ("sbhd", "bshd", "thd", "bhsd"),
    ),
    FixedRule(
        "fp8_thd_cudnn",
        "FP8 fused attention with THD format requires cuDNN 9.23.0 or later!",
        V2,
        "0x2290c30: FP8, THD, cmp $0x1688b (cuDNN <= 92299)",
        lambda q: q.dtype == "fp8" and q.qkv_format == "thd" and q.cudnn_int <= 92299,
    ),
    FixedRule(
        "fp8_thd_backward_arch",
        "FP8 fused attention with THD format supports backward on sm100+ only!",
        V2,
        "0x2290c59: FP8, THD, training, cmp $0x63 (sm <= 99)",
        lambda q: q.dtype == "fp8" and q.qkv_format == "thd" and q.is_training and q.sm <= 99,
    ),
    FixedRule(
        "fp8_thd_sink_cudnn",
        "FP8 fused attention with THD format and a sink token requires cuDNN 9.26.0 or later for backward!",
        V2,
        "0x2290c63: FP8, THD, training, softmax_type != vanilla, cmp $0x169b7 (cuDNN <= 92599)",
        lambda q: (
            q.dtype == "fp8"
            and q.qkv_format == "thd"
            and q.is_training
            and q.softmax != "vanilla"
            and q.cudnn_int <= 92599
        ),
    ),
    FixedRule(
        "fp8_thd_head_dim",
        "FP8 fused attention with THD format supports head dimensions up to 128 on sm100+ only!",
        V2,
        "0x2291330-0x2291348: FP8, THD, cmp $0x80 on head_dim_qk / head_dim_v",
        lambda q: q.dtype == "fp8" and q.qkv_format == "thd" and max(q.head_dim_qk, q.head_dim_v) > 128,
    ),
    FixedRule(
        "fp8_post_scale_bias",
        "FP8 fused attention does not support pre/post_scale_bias yet!",
        V2,
        "0x22906b9: FP8, bias_type == NVTE_POST_SCALE_BIAS",
        lambda q: q.dtype == "fp8" and q.bias == "post_scale_bias",
    ),
    FixedRule(
        "fp8_alibi",
        "FP8 fused attention does not support ALiBi yet!",
        V2,
        "0x22906c7: FP8, bias_type == NVTE_ALIBI",
        lambda q: q.dtype == "fp8" and q.bias == "alibi",
    ),
    FixedRule(
        "fp8_recipe",
        "FP8 fused attention only supports FP8DelayedScaling or FP8CurrentScaling or MXFP8 recipes!",
        V2,
        "0x22906d5: FP8 with a scaling mode other than tensor scaling (delayed, current) or MXFP8",
        lambda q: q.dtype == "fp8" and not (q.scaling in ("", "delayed_tensor_scaling") or q.mxfp8),
    ),
    FixedRule(
        "mxfp8_cudnn",
        "MXFP8 fused attention requires cuDNN 9.21.0 or later!",
        V2,
        "0x2290fb0: MXFP8 scaling, cmp $0x167c3 (cuDNN <= 92099)",
        lambda q: q.dtype == "fp8" and q.mxfp8 and q.cudnn_int <= 92099,
    ),
)

_DET_BLACKWELL = "Deterministic algorithm is not supported on blackwell architecture"
_FP8_DET = "FP8 deterministic algorithm (required for MXFP8 and d_qk=192/d_v=128) is not supported on Blackwell"
_RAGGED_SINK = (
    "SDPA backward with ragged offsets and a sink token requires cuDNN 9.26.0 or newer (older versions hit an "
    "out-of-bounds read in the compute_dot_do_o pre-pass)."
)
_D192 = "Num hidden_dim d_v should be equal to 128 if d_qk is 192"
_FP8_HOPPER = (
    "sdpa fp8 forward operation is only supported on Hopper architecture and newer. Please consider using a newer "
    "architecture."
)
#: cudnn-frontend as compiled into TE 2.20.2's library: nvidia-cudnn-frontend 1.30.0, the release whose every SDPA
#: condition text the binary holds (1.31.0 and 1.32.0 changed the FP8 backward's head-dim conditions)
_SURFACE = "sdpa_support_surface.h (1.30.0) validate_sdpa_support_surface"
_FWD = "scaled_dot_product_flash_attention.h (1.30.0) SDPANodeBase::pre_validate_node"
_BWD = "scaled_dot_product_flash_attention.h (1.30.0) CompositeSDPABackwardNode::pre_validate_node"
_FP8_BWD = "sdpa_fp8_bwd.h (1.30.0) SDPAFP8BackwardNode::pre_validate_node"


def _heads(q: Query) -> tuple[int, int]:
    return q.head_dim_qk, q.head_dim_v


def _f16_bwd(q: Query) -> bool:
    return q.dtype == "f16" and q.is_training


def _fp8_bwd(q: Query) -> bool:
    return q.dtype == "fp8" and q.is_training


def _f16_det_path(q: Query) -> bool:
    """scaled_dot_product_flash_attention.h: the F16/BF16 backward is deterministic when TE asks, and on Blackwell
    with cuDNN >= 9.23 for d_qk = d_v = 256 (the frontend sets ``is_deterministic_algorithm`` itself)."""
    return q.deterministic or (q.arch[0] == 10 and q.cudnn_int >= 92300 and _heads(q) == (256, 256))


def _fp8_det_path(q: Query) -> bool:
    """sdpa_fp8_bwd.h: the FP8 backward runs the deterministic algorithm when asked, and on Blackwell always for
    MXFP8 and for d_qk <= 192 with d_v <= 128 ('auto-routing to deterministic algorithm')."""
    return q.deterministic or q.mxfp8 or (q.head_dim_qk <= 192 and q.head_dim_v <= 128)


def _band(d_qk: int, d_v: int, multiple: int) -> bool:
    """Both head dims in (256, 512] and multiples of ``multiple``: the frontend's own SM100 engine's band."""
    return 256 < d_qk <= 512 and 256 < d_v <= 512 and d_qk % multiple == 0 and d_v % multiple == 0


def _f16_bwd_blackwell_dims(q: Query) -> bool:
    """The Blackwell (cuDNN >= 9.11) backward head-dim rule outside its d_qk = 192 and d = 256 cases."""
    d_qk, d_v = _heads(q)
    if d_qk == 192 or (q.cudnn_int >= 92300 and (d_qk, d_v) == (256, 256)):
        return False
    return (d_qk > 128 or d_qk % 8 != 0 or d_v > 128 or d_v % 8 != 0) and not _band(d_qk, d_v, 8)


def _fp8_fwd_dims_qk(q: Query) -> bool:
    d_qk, d_v = _heads(q)
    return (
        (d_qk > 128 or d_qk % 16 != 0)
        and not (q.cudnn_int >= 91900 and (d_qk, d_v) == (192, 128))
        and not (q.cudnn_int >= 92600 and (d_qk, d_v) == (256, 256))
        and not _band(d_qk, d_v, 16)
    )


def _fp8_fwd_dims_v(q: Query) -> bool:
    d_qk, d_v = _heads(q)
    return (
        (d_v > 128 or d_v % 16 != 0)
        and not (q.cudnn_int >= 92600 and (d_qk, d_v) == (256, 256))
        and not _band(d_qk, d_v, 16)
    )


def _fp8_d256_mxfp8(q: Query) -> bool:
    return q.mxfp8 and _heads(q) == (256, 256)


def _fe(name: str, text: str, where: str, condition: str, applies: Callable[[Query], bool]) -> FixedRule:
    return FixedRule(name, text, FE, where, applies, condition)


#: cudnn-frontend's SDPA validation of the graphs TE builds, in TE's order: each_pass asks the forward graph, then
#: (training) the backward one; within a graph, the node's checks in source order (the support surface inside the
#: forward node's). Each carries the condition text the error macro stringifies into the binary.
FRONTEND_RULES: tuple[FixedRule, ...] = (
    # ---- forward, F16/BF16 and FP8 (validate_sdpa_support_surface, common part) ----
    _fe(
        "fe_dropout_one",
        "Dropout probability cannot be 1 as corresponding scale wont be well formed.",
        f"{_SURFACE}:141 (and {_BWD}:1482, {_FP8_BWD}:251): training with dropout == 1.0",
        "dropout_probability.has_value() && dropout_probability.value() == 1.0",
        lambda q: q.is_training and q.dropout == 1.0,
    ),
    # ---- forward, FP8 (mma core mode FP8_E4M3/E5M2) ----
    _fe(
        "fe_fp8_cudnn_91",
        "sdpa fp8 forward operation is only supported starting cudnn 9.1.0. Please consider upgrading your current "
        "version.",
        f"{_SURFACE}:178 (and {_FP8_BWD}:91): FP8, cuDNN < 90100",
        "detail::get_backend_version() < 90100",
        lambda q: q.dtype == "fp8" and q.cudnn_int < 90100,
    ),
    _fe(
        "fe_fp8_cudnn_9100",
        "sdpa fp8 forward operation is not supported on cudnn 9.10.0. Please consider upgrading your current version.",
        f"{_SURFACE}:182 (and {_FP8_BWD}:97): FP8, cuDNN == 91000",
        "detail::get_backend_version() == 91000",
        lambda q: q.dtype == "fp8" and q.cudnn_int == 91000,
    ),
    _fe(
        "fe_fp8_arch",
        _FP8_HOPPER,
        f"{_SURFACE}:186 (and {_FP8_BWD}:106): FP8, prop_major < 9",
        "prop_major < 9",
        lambda q: q.dtype == "fp8" and q.arch[0] < 9,
    ),
    _fe(
        "fe_fp8_fwd_head_dim_qk_blackwell",
        "hidden_dim d_qk should be less than or equal to 128 and hidden_dim d_qk should be multiple of 16 unless "
        "d_qk == 192 and d_v == 128 (requires cuDNN 9.19+) or d_qk == d_v == 256 (requires cuDNN 9.26+) or both head "
        "dims are in (256, 512] and multiples of 16",
        f"{_SURFACE}:211: FP8, prop_major >= 10, d_qk > 128 or d_qk % 16, unless 192/128 (cuDNN >= 91900), "
        "256/256 (cuDNN >= 92600) or both in (256, 512] multiples of 16",
        "((d_qk > 128) || (d_qk % 16 != 0)) && !(d192_v128_supported && d_qk == 192 && d_v == 128) && "
        "!(d256_v256_supported && d_qk == 256 && d_v == 256) && !d512_supported",
        lambda q: q.dtype == "fp8" and q.arch[0] >= 10 and _fp8_fwd_dims_qk(q),
    ),
    _fe(
        "fe_fp8_fwd_head_dim_v_blackwell",
        "hidden_dim d_v should be less than or equal to 128 and hidden_dim d_v should be multiple of 16 unless "
        "d_qk == d_v == 256 (requires cuDNN 9.26+) or both head dims are in (256, 512] and multiples of 16",
        f"{_SURFACE}:218: FP8, prop_major >= 10, d_v > 128 or d_v % 16, unless 256/256 (cuDNN >= 92600) or both in "
        "(256, 512] multiples of 16",
        "((d_v > 128) || (d_v % 16 != 0)) && !(d256_v256_supported && d_qk == 256 && d_v == 256) && !d512_supported",
        lambda q: q.dtype == "fp8" and q.arch[0] >= 10 and _fp8_fwd_dims_v(q),
    ),
    _fe(
        "fe_fp8_fwd_head_dim",
        "hidden_dim shoud be less than or equal to 256 and hidden_dim should be multiple of 16",
        f"{_SURFACE}:226: FP8, prop_major < 10, a head dim > 256 or not a multiple of 16",
        "(d_qk > 256) || (d_qk % 16 != 0) || (d_v > 256) || (d_v % 16 != 0)",
        lambda q: q.dtype == "fp8" and q.arch[0] < 10 and any(d > 256 or d % 16 != 0 for d in _heads(q)),
    ),
    # ---- forward, F16/BF16 (mma core mode HALF) ----
    _fe(
        "fe_f16_cudnn_910",
        "SDPA FP16/BF16 forward is not supported on cuDNN 9.10.0/9.10.1 due to known bugs. Please consider upgrading "
        "to 9.10.2 or newer.",
        f"{_SURFACE}:254 (the backward's {_BWD}:1298 has the same condition): F16/BF16, cuDNN 91000 or 91001",
        "detail::get_backend_version() == 91000 || detail::get_backend_version() == 91001",
        lambda q: q.dtype == "f16" and q.cudnn_int in (91000, 91001),
    ),
    _fe(
        "fe_f16_head_dim_multiple_8",
        "hidden_dim should be multiple of 8",
        f"{_SURFACE}:275: F16/BF16, d_qk % 8 or d_v % 8",
        "(d_qk % 8 != 0) || (d_v % 8 != 0)",
        lambda q: q.dtype == "f16" and (q.head_dim_qk % 8 != 0 or q.head_dim_v % 8 != 0),
    ),
    _fe(
        "fe_f16_arch",
        "SDPA FP16/BF16 requires SM80 (Ampere) or newer architecture",
        f"{_SURFACE}:373: F16/BF16, prop_major < 8",
        "prop_major < 8",
        lambda q: q.dtype == "f16" and q.arch[0] < 8,
    ),
    _fe(
        "fe_f16_head_dim_ampere_cudnn",
        "head_dim should be less than or equal to 128 for backend version 9.9 or below on ampere architecture",
        f"{_SURFACE}:379: F16/BF16, prop_major == 8, cuDNN <= 90900, a head dim > 128",
        "detail::get_backend_version() <= 90900 && ((d_qk > 128) || (d_v > 128))",
        lambda q: q.dtype == "f16" and q.arch[0] == 8 and q.cudnn_int <= 90900 and max(_heads(q)) > 128,
    ),
    _fe(
        "fe_f16_head_dim_hopper_cudnn",
        "head_dim should be less than or equal to 256 for backend version 9.9 or below on hopper architecture",
        f"{_SURFACE}:385: F16/BF16, prop_major == 9, cuDNN <= 90900, a head dim > 256",
        "detail::get_backend_version() <= 90900 && ((d_qk > 256) || (d_v > 256))",
        lambda q: q.dtype == "f16" and q.arch[0] == 9 and q.cudnn_int <= 90900 and max(_heads(q)) > 256,
    ),
    _fe(
        "fe_f16_head_dim_blackwell_cudnn",
        "head_dim should be less than or equal to 128 for backend version 9.8 or below on blackwell architecture",
        f"{_SURFACE}:391: F16/BF16, prop_major == 10, cuDNN < 90900, a head dim > 128",
        "(detail::get_backend_version() < 90900) && ((d_qk > 128) || (d_v > 128))",
        lambda q: q.dtype == "f16" and q.arch[0] == 10 and q.cudnn_int < 90900 and max(_heads(q)) > 128,
    ),
    _fe(
        "fe_f16_thd_arch_cudnn",
        "THD (ragged offset) is only supported in Hopper and above : ",
        f"{_SURFACE}:402: F16/BF16, ragged, sm < 90, cuDNN < 91801 (the sm number follows the text)",
        "(context.get_sm_version() > 0 && context.get_sm_version() < 90 && detail::get_backend_version() < 91801)",
        lambda q: q.dtype == "f16" and q.ragged and q.sm < 90 and q.cudnn_int < 91801,
    ),
    # ---- forward node, after the support surface ----
    _fe(
        "fe_sink_cudnn",
        "SDPA with sink_token is not supported before 9.13.",
        f"{_FWD}:317: a sink token (softmax type off_by_one or learnable), cuDNN < 91300",
        "detail::get_backend_version() < 91300 && attributes.inputs.find(input_names::SINK_TOKEN) != "
        "attributes.inputs.end()",
        lambda q: q.softmax != "vanilla" and q.cudnn_int < 91300,
    ),
    _fe(
        "fe_mxfp8_cudnn",
        "MXFP8 SDPA requires cuDNN 9.21.0 or later",
        f"{_FWD}:325 (and {_FP8_BWD}:333): MXFP8, cuDNN < 92100",
        "detail::get_backend_version() < 92100",
        lambda q: q.dtype == "fp8" and q.mxfp8 and q.cudnn_int < 92100,
    ),
    _fe(
        "fe_mxfp8_arch",
        "MXFP8 SDPA is only supported on Blackwell Data Center architectures.",
        f"{_FWD}:334: MXFP8, prop_major != 10",
        "10 != prop_major",
        lambda q: q.dtype == "fp8" and q.mxfp8 and q.arch[0] != 10,
    ),
    # ---- backward, F16/BF16 ----
    _fe(
        "fe_f16_bwd_single_token",
        "s_q = s_kv = 1 is not supported.",
        f"{_BWD}:1293: F16/BF16 training, max_seqlen_q == max_seqlen_kv == 1",
        "s_q == 1 && s_kv == 1",
        lambda q: _f16_bwd(q) and q.max_seqlen_q == 1 and q.max_seqlen_kv == 1,
    ),
    _fe(
        "fe_bwd_ragged_sink_cudnn",
        _RAGGED_SINK,
        f"{_BWD}:1315 and {_FP8_BWD}:190: training, ragged, a sink token (softmax off_by_one or learnable), "
        "cuDNN < 92600",
        "is_ragged && has_sink && detail::get_backend_version() < 92600",
        lambda q: q.is_training and q.ragged and q.softmax != "vanilla" and q.cudnn_int < 92600,
    ),
    _fe(
        "fe_f16_bwd_hopper_192_cudnn",
        _D192,
        f"{_BWD}:1333: F16/BF16 training, prop_major == 9, 91100 <= cuDNN < 91300, 128 < d_qk <= 192, "
        "64 < d_v <= 128, d_v != 128 and d_qk != 192",
        "(d_v != 128) && (d_qk != 192)",
        lambda q: (
            _f16_bwd(q)
            and q.arch[0] == 9
            and 91100 <= q.cudnn_int < 91300
            and 128 < q.head_dim_qk <= 192
            and 64 < q.head_dim_v <= 128
            and q.head_dim_v != 128
            and q.head_dim_qk != 192
        ),
    ),
    _fe(
        "fe_f16_bwd_head_dim_hopper",
        "Num hidden_dim should be less than or equal to 256 and hidden_dim should be multiple of 8",
        f"{_BWD}:1339: F16/BF16 training, prop_major == 9, a head dim > 256 or not a multiple of 8",
        "(d_qk > 256) || (d_qk % 8 != 0) || (d_v > 256) || (d_v % 8 != 0)",
        lambda q: _f16_bwd(q) and q.arch[0] == 9 and any(d > 256 or d % 8 != 0 for d in _heads(q)),
    ),
    _fe(
        "fe_f16_bwd_blackwell_192",
        _D192,
        f"{_BWD}:1346: F16/BF16 training, prop_major == 10, cuDNN >= 91100, d_qk == 192, d_v != 128",
        "(d_v != 128)",
        lambda q: (
            _f16_bwd(q) and q.arch[0] == 10 and q.cudnn_int >= 91100 and q.head_dim_qk == 192 and q.head_dim_v != 128
        ),
    ),
    _fe(
        "fe_f16_bwd_head_dim_blackwell",
        "Num hidden_dim should be less than or equal to 128 and hidden_dim should be multiple of 8 when d_qk != d_v, "
        "unless both head dims are in (256, 512] and multiples of 8",
        f"{_BWD}:1369: F16/BF16 training, prop_major == 10, cuDNN >= 91100, d_qk != 192, not d_qk == d_v == 256 "
        "with cuDNN >= 92300: a head dim > 128 or not a multiple of 8, unless both in (256, 512] multiples of 8",
        "((d_qk > 128) || (d_qk % 8 != 0) || (d_v > 128) || (d_v % 8 != 0)) && !d512_supported",
        lambda q: _f16_bwd(q) and q.arch[0] == 10 and q.cudnn_int >= 91100 and _f16_bwd_blackwell_dims(q),
    ),
    _fe(
        "fe_f16_bwd_head_dim",
        "Num hidden_dim should be less than or equal to 128 and hidden_dim should be multiple of 8",
        f"{_BWD}:1376: F16/BF16 training, prop_major not 9 and not 10 with cuDNN >= 91100 (sm8x, sm12x): a head dim "
        "> 128 or not a multiple of 8",
        "(d_qk > 128) || (d_qk % 8 != 0) || (d_v > 128) || (d_v % 8 != 0)",
        lambda q: (
            _f16_bwd(q)
            and q.arch[0] != 9
            and not (q.arch[0] == 10 and q.cudnn_int >= 91100)
            and any(d > 128 or d % 8 != 0 for d in _heads(q))
        ),
    ),
    _fe(
        "fe_deterministic_blackwell_cudnn",
        f"{_DET_BLACKWELL} with cudnn version below 9.18.0",
        f"{_BWD}:1488: F16/BF16 training on the deterministic path (asked, or d = 256 on cuDNN >= 9.23), "
        "prop_major == 10, cuDNN < 91800",
        "(detail::get_backend_version() < 91800)",
        lambda q: _f16_bwd(q) and _f16_det_path(q) and q.arch[0] == 10 and q.cudnn_int < 91800,
    ),
    _fe(
        "fe_deterministic_blackwell_dropout",
        f"{_DET_BLACKWELL} when dbias, rng/dropout, alibi is enabled",
        f"{_BWD}:1493: F16/BF16 training on the deterministic path, prop_major == 10, dropout or ALiBi",
        "is_dbias || is_rng || is_dropout || attributes.alibi_mask",
        lambda q: _f16_bwd(q) and _f16_det_path(q) and q.arch[0] == 10 and (q.dropout > 0 or q.bias == "alibi"),
    ),
    _fe(
        "fe_deterministic_thd_sm8x_sm12x",
        "Deterministic algorithm is not supported for bprop thd on SM8X and SM12X GPUs",
        f"{_BWD}:1501: F16/BF16 training, ragged, deterministic, prop_major 8 or 12, cuDNN >= 91801",
        "is_ragged && (8 == prop_major || 12 == prop_major) && attributes.is_deterministic_algorithm",
        lambda q: _f16_bwd(q) and q.ragged and q.deterministic and q.arch[0] in (8, 12) and q.cudnn_int >= 91801,
    ),
    _fe(
        "fe_f16_bwd_thd_gqa_cudnn",
        "For cuDNN version below 9.6.0, group-query attention with raggged offset is not supported",
        f"{_BWD}:1537: F16/BF16 training, ragged, num_gqa_groups != num_attn_heads, cuDNN < 90600",
        "detail::get_backend_version() < 90600 && is_ragged && ((h_q != h_k) || (h_q != h_v))",
        lambda q: _f16_bwd(q) and q.ragged and q.num_gqa_groups != q.num_heads and q.cudnn_int < 90600,
    ),
    # ---- backward, FP8 ----
    _fe(
        "fe_fp8_bwd_thd_hopper",
        "sdpa fp8 backward with THD is not supported on Hopper architecture.",
        f"{_FP8_BWD}:183: FP8 training, prop_major == 9, ragged",
        "(prop_major == 9) && is_ragged",
        lambda q: _fp8_bwd(q) and q.arch[0] == 9 and q.ragged,
    ),
    _fe(
        "fe_fp8_bwd_head_dim_qk_blackwell",
        "hidden_dim d_qk shoud be less than or equal to 128 and hidden_dim d_qk should be multiple of 16 unless "
        "d_qk == 192 and d_v == 128, or d_qk == d_v == 256 with MXFP8 scaling",
        f"{_FP8_BWD}:203: FP8 training, prop_major >= 10, d_qk > 128 or d_qk % 16, unless 192/128 or 256/256 with "
        "MXFP8",
        "((d_qk > 128) || (d_qk % 16 != 0)) && !(d_qk == 192 && d_v == 128) && !d256_mxfp8_frost",
        lambda q: (
            _fp8_bwd(q)
            and q.arch[0] >= 10
            and (q.head_dim_qk > 128 or q.head_dim_qk % 16 != 0)
            and _heads(q) != (192, 128)
            and not _fp8_d256_mxfp8(q)
        ),
    ),
    _fe(
        "fe_fp8_bwd_head_dim_v_blackwell",
        "hidden_dim d_v shoud be less than or equal to 128 and hidden_dim d_v should be multiple of 16, unless "
        "d_qk == d_v == 256 with MXFP8 scaling",
        f"{_FP8_BWD}:207: FP8 training, prop_major >= 10, d_v > 128 or d_v % 16, unless 256/256 with MXFP8",
        "((d_v > 128) || (d_v % 16 != 0)) && !d256_mxfp8_frost",
        lambda q: (
            _fp8_bwd(q)
            and q.arch[0] >= 10
            and (q.head_dim_v > 128 or q.head_dim_v % 16 != 0)
            and not _fp8_d256_mxfp8(q)
        ),
    ),
    _fe(
        "fe_fp8_bwd_head_dim",
        "hidden_dim shoud be equal to 128 and hidden_dim should be multiple of 16",
        f"{_FP8_BWD}:213: FP8 training, prop_major < 10 (Hopper): d_qk or d_v other than 128",
        "(d_qk != 128) || (d_qk % 16 != 0) || (d_v != 128) || (d_v % 16 != 0)",
        lambda q: _fp8_bwd(q) and q.arch[0] < 10 and _heads(q) != (128, 128),
    ),
    _fe(
        "fe_fp8_deterministic_blackwell_cudnn",
        f"{_FP8_DET} with cuDNN version below 9.19.0",
        f"{_FP8_BWD}:309: FP8 training on the deterministic path (asked, MXFP8, or d_qk <= 192 with d_v <= 128), "
        "prop_major == 10, cuDNN < 91900",
        "(detail::get_backend_version() < 91900)",
        lambda q: _fp8_bwd(q) and q.arch[0] == 10 and _fp8_det_path(q) and q.cudnn_int < 91900,
    ),
    _fe(
        "fe_fp8_deterministic_blackwell_dropout",
        f"{_FP8_DET} when dropout is enabled",
        f"{_FP8_BWD}:313: FP8 training on the deterministic path, prop_major == 10, dropout",
        "is_dropout",
        lambda q: _fp8_bwd(q) and q.arch[0] == 10 and _fp8_det_path(q) and q.dropout > 0,
    ),
)

RULES = V2_RULES + FRONTEND_RULES


def first_reject(query: Query) -> FixedRule | None:
    """The first fixed rule that refuses ``query``, in TE's order (the v2 function's, then cudnn-frontend's); None
    when the config reaches cuDNN's own support query."""
    return next((rule for rule in RULES if rule.applies(query)), None)


# ---- the rules against the installed binary --------------------------------------------------------------------
def te_root() -> Path:
    """The installed ``transformer_engine`` package's folder (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("transformer_engine")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("transformer_engine is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def so_path() -> Path:
    """The installed libtransformer_engine.so (found without importing TE's torch extension)."""
    root = te_root()
    found = sorted(root.rglob("libtransformer_engine.so"))
    if not found:
        raise FileNotFoundError(f"no libtransformer_engine.so under {root}")
    return found[0]


def _tail_width(rest: int) -> int:
    """How many bytes the compiler's last store of a message covers: a byte, a word, 4 or 8 bytes as an
    immediate in the code, else a 16-byte piece from the pool (each store ends at the message's end)."""
    return rest if rest <= 2 else 4 if rest <= 4 else 8 if rest <= 8 else 16


def _stored(text: str, data: bytes) -> bool:
    """``text`` as a v2 message is stored: its whole 16-byte pieces in the pool, its last store in the bytes."""
    raw = text.encode()
    whole, rest = divmod(len(raw), 16)
    pieces = [raw[16 * k : 16 * k + 16] for k in range(whole)]
    if rest:
        pieces.append(raw[-_tail_width(rest) :])
    return all(p in data for p in pieces)


_POOL_ANCHOR = b"nvte_get_fused_a_attn_backend_v2"
_IDENTIFIER = re.compile(rb"[A-Za-z0-9_]{16}")
_FE_FAMILY = re.compile(rb"(?:FP8 )?[Dd]eterministic algorithm [ -~]*?is not supported[ -~]*(?=\x00)")
_AT = ") at \x00"
_AT_BYTES = _AT.encode()
_DET_WORDS = b"eterministic algorithm "


def _message_held(text: str, data: bytes) -> bool:
    """A cudnn-frontend message as the binary holds it: a whole string, or, for a text ending in a space (the
    binary appends a value, as the sm number), its fixed start."""
    return (text.encode() if text.endswith(" ") else text.encode() + b"\x00") in data


def _pool_pieces(data: bytes) -> list[bytes] | None:
    """The v2 function's constant pool: the printable 16-byte pieces after its own name's two pieces, up to the
    first piece that is not text (identifier-like pieces, other functions' names, left out); None without it."""
    start = data.find(_POOL_ANCHOR)
    if start < 0:
        return None
    pieces, at = [], start + len(_POOL_ANCHOR)
    while True:
        piece = data[at : at + 16]
        if len(piece) < 16 or not all(32 <= c < 127 for c in piece):
            return pieces
        if not _IDENTIFIER.fullmatch(piece):
            pieces.append(piece)
        at += 16


def _string_at(data: bytes, at: int) -> tuple[int, int]:
    """The (start, end) of the printable run around ``at``: the string the binary holds there."""
    start, end = at, at
    while start > 0 and 32 <= data[start - 1] < 127:
        start -= 1
    while end < len(data) and 32 <= data[end] < 127:
        end += 1
    return start, end


def _deterministic_family(data: bytes) -> set[str]:
    """cudnn-frontend's deterministic-algorithm rejects in ``data`` (found by their shared words, then read whole:
    a regex over the whole library takes a quarter of a minute)."""
    found, at = set(), data.find(_DET_WORDS)
    while at >= 0:
        start, end = _string_at(data, at)
        found.update(m.group().decode() for m in _FE_FAMILY.finditer(data[start : end + 1]))
        at = data.find(_DET_WORDS, end)
    return found


def _conditions(data: bytes) -> set[str]:
    """Every cudnn-frontend reject condition in ``data``: the ``#cond`` its error macro leaves as a whole string
    ending in ``") at "`` (a condition the linker stored as the tail of a longer one is found inside that one)."""
    found, at = set(), data.find(_AT_BYTES)
    while at >= 0:
        start = at
        while start > 0 and 32 <= data[start - 1] < 127:
            start -= 1
        if start < at:
            found.add(data[start:at].decode())
        at = data.find(_AT_BYTES, at + 1)
    return found


def drift(data: bytes, rules: tuple[FixedRule, ...] = RULES, classified: Mapping[str, str] | None = None) -> list[str]:
    """What in ``data`` (the .so's bytes) contradicts the rules: a cited text or condition the binary no longer holds,
    a v2 pool piece no cited text contains (a new or changed message), a cudnn-frontend deterministic-algorithm
    message not cited, a cudnn-frontend reject condition that no rule cites and ``classified`` (default
    :data:`te_frontend_texts.CLASSIFIED`) does not list, and a listed condition the binary no longer holds. Empty
    when the data matches the binary."""
    from mbridge_seqpack.analysis.te_frontend_texts import CLASSIFIED

    classified = CLASSIFIED if classified is None else classified
    problems: list[str] = []
    v2 = [r.text for r in rules if r.family == V2]
    conditions = _conditions(data)

    def held_condition(condition: str) -> bool:  # whole, or the tail the linker merged into a longer one
        return any(found.endswith(condition) for found in conditions)

    for rule in rules:
        held = _stored(rule.text, data) if rule.family == V2 else _message_held(rule.text, data)
        if not held:
            problems.append(f"{rule.name}: the binary no longer holds {rule.text!r}")
        if rule.condition and not held_condition(rule.condition):
            problems.append(f"{rule.name}: the binary no longer holds the condition {rule.condition!r}")
    pool = _pool_pieces(data)
    if pool is None:
        problems.append(f"{V2}: its constant pool (after {_POOL_ANCHOR.decode()!r}) is not in the binary")
    for piece in pool or []:
        if not any(piece.decode("latin-1") in text for text in v2):
            problems.append(f"{V2}: a message piece no rule cites: {piece.decode('latin-1')!r}")
    cited_fe = {r.text for r in rules if r.family == FE}
    for found in sorted(_deterministic_family(data)):
        if found not in cited_fe:
            problems.append(f"{FE}: a deterministic-algorithm reject no rule cites: {found!r}")
    cited_conditions = {r.condition for r in rules if r.condition}
    for found in sorted(conditions - cited_conditions - set(classified)):
        problems.append(f"{FE}: a reject condition no rule cites and none classifies: {found!r}")
    for listed in sorted(set(classified) - cited_conditions):
        if not held_condition(listed):
            problems.append(f"{FE}: a classified condition the binary no longer holds: {listed!r}")
    return problems
