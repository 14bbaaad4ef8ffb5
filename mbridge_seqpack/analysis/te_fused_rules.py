"""Transformer Engine's fixed FusedAttention support rules, as data: what ``nvte_get_fused_attn_backend_v2``
(libtransformer_engine.so, TE 2.20.2) and the cudnn-frontend validation compiled into it refuse before cuDNN's own
support query runs on the device.

TE's Python selection hands each config to ``tex.get_fused_attn_backend``, which calls
``nvte_get_fused_attn_backend_v2``: it first applies fixed rules over the config, the architecture and the cuDNN
version, each with a reject message, and only then asks cuDNN (``support_verdict_f16`` / ``support_verdict_fp8``),
which needs a GPU. The fixed rules are read from the installed binary: each :class:`FixedRule` carries the reject
text exactly as the binary builds it, and its condition with the thresholds the compiled code compares (disassembly
of ``nvte_get_fused_attn_backend_v2`` at the cited addresses: ``cmp $0x59`` sm <= 89, ``cmp $0x1688b`` cuDNN <=
92299, ...). The cudnn-frontend rules are those of its SDPA backward nodes (``scaled_dot_product_flash_attention.h``,
``sdpa_fp8_bwd.h``), whose texts the binary holds as plain strings.

The binary keeps the v2 function's messages the way its compiler emitted them: 16-byte pieces in a constant pool
(shared between messages), the last few bytes as an immediate in the code. :func:`drift` checks the cited texts
against the bytes of the installed .so on those terms, and reports any message of the two families the data does
not cite.
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


def _fp8_det_path(q: Query) -> bool:
    """sdpa_fp8_bwd.h: the FP8 backward runs the deterministic algorithm when asked, and always for MXFP8 and
    d_qk=192/d_v=128 on Blackwell ('auto-routing to deterministic algorithm')."""
    return q.deterministic or q.mxfp8 or (q.head_dim_qk, q.head_dim_v) == (192, 128)


#: cudnn-frontend's SDPA backward validation (run on the built graph, before cuDNN's heuristics query)
FRONTEND_RULES: tuple[FixedRule, ...] = (
    FixedRule(
        "fe_deterministic_blackwell_cudnn",
        f"{_DET_BLACKWELL} with cudnn version below 9.18.0",
        FE,
        "scaled_dot_product_flash_attention.h: F16/BF16 backward, deterministic, prop_major == 10, cuDNN < 91800",
        lambda q: q.dtype == "f16" and q.is_training and q.deterministic and q.arch[0] == 10 and q.cudnn_int < 91800,
    ),
    FixedRule(
        "fe_deterministic_blackwell_dropout",
        f"{_DET_BLACKWELL} when dbias, rng/dropout, alibi is enabled",
        FE,
        "scaled_dot_product_flash_attention.h: F16/BF16 backward, deterministic, prop_major == 10, dropout or ALiBi",
        lambda q: (
            q.dtype == "f16"
            and q.is_training
            and q.deterministic
            and q.arch[0] == 10
            and (q.dropout > 0 or q.bias == "alibi")
        ),
    ),
    FixedRule(
        "fe_deterministic_thd_sm8x_sm12x",
        "Deterministic algorithm is not supported for bprop thd on SM8X and SM12X GPUs",
        FE,
        "scaled_dot_product_flash_attention.h: F16/BF16 backward, ragged, deterministic, prop_major 8 or 12, "
        "cuDNN >= 91801",
        lambda q: (
            q.dtype == "f16"
            and q.is_training
            and q.ragged
            and q.deterministic
            and q.arch[0] in (8, 12)
            and q.cudnn_int >= 91801
        ),
    ),
    FixedRule(
        "fe_fp8_deterministic_blackwell_cudnn",
        f"{_FP8_DET} with cuDNN version below 9.19.0",
        FE,
        "sdpa_fp8_bwd.h: FP8 backward on the deterministic path, prop_major == 10, cuDNN < 91900",
        lambda q: q.dtype == "fp8" and q.is_training and _fp8_det_path(q) and q.arch[0] == 10 and q.cudnn_int < 91900,
    ),
    FixedRule(
        "fe_fp8_deterministic_blackwell_dropout",
        f"{_FP8_DET} when dropout is enabled",
        FE,
        "sdpa_fp8_bwd.h: FP8 backward on the deterministic path, prop_major == 10, dropout",
        lambda q: q.dtype == "fp8" and q.is_training and _fp8_det_path(q) and q.arch[0] == 10 and q.dropout > 0,
    ),
)

RULES = V2_RULES + FRONTEND_RULES


def first_reject(query: Query) -> FixedRule | None:
    """The first fixed rule that refuses ``query``, in TE's order (the v2 function's, then cudnn-frontend's); None
    when the config reaches cuDNN's own support query."""
    return next((rule for rule in RULES if rule.applies(query)), None)


# ---- the rules against the installed binary --------------------------------------------------------------------
def so_path() -> Path:
    """The installed libtransformer_engine.so (found without importing TE's torch extension)."""
    import importlib.util

    spec = importlib.util.find_spec("transformer_engine")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("transformer_engine is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
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


def drift(data: bytes, rules: tuple[FixedRule, ...] = RULES) -> list[str]:
    """What in ``data`` (the .so's bytes) contradicts the rules: a cited text the binary no longer holds, a v2 pool
    piece no cited text contains (a new or changed message), a cudnn-frontend deterministic-algorithm message not
    cited. Empty when the data matches the binary."""
    problems: list[str] = []
    v2 = [r.text for r in rules if r.family == V2]
    for rule in rules:
        held = _stored(rule.text, data) if rule.family == V2 else rule.text.encode() + b"\x00" in data
        if not held:
            problems.append(f"{rule.name}: the binary no longer holds {rule.text!r}")
    pool = _pool_pieces(data)
    if pool is None:
        problems.append(f"{V2}: its constant pool (after {_POOL_ANCHOR.decode()!r}) is not in the binary")
    for piece in pool or []:
        if not any(piece.decode("latin-1") in text for text in v2):
            problems.append(f"{V2}: a message piece no rule cites: {piece.decode('latin-1')!r}")
    cited_fe = {r.text for r in rules if r.family == FE}
    for found in sorted({m.group().decode() for m in _FE_FAMILY.finditer(data)}):
        if found not in cited_fe:
            problems.append(f"{FE}: a deterministic-algorithm reject no rule cites: {found!r}")
    return problems
