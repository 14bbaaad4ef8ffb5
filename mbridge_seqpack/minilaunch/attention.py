"""Core attention on CPU, reading what Transformer Engine's ``DotProductAttention`` reads (its kernels are CUDA only).

The step's model uses Megatron-Core's own attention module around it (QKV projection, RoPE, the THD squeeze, output
projection); only the core (softmax(QK^T)V) is this reference, and it takes its inputs the way TE's documented API
does, from the ``PackedSeqParams`` ``TEDotProductAttention`` forwards (``kept_packed_seq_params``):

- ``qkv_format``: ``"thd"`` reads ``[t, h, d]`` tensors and the cumulative lengths; ``"sbhd"`` / ``"bshd"`` read
  4-D tensors (a THD tensor read as SBHD is refused, as TE's shape checks refuse it: ``BadAttentionInputs``);
- sequence k's tokens start at ``cu_seqlens_*_padded[k]`` (``cu_seqlens_*`` where no padded offsets are given) and
  number ``cu_seqlens_*[k+1] - cu_seqlens_*[k]``; everything else in the row is padding, whose output is zero;
- ``max_seqlen_q`` / ``max_seqlen_kv`` bound every sequence (a longer one is refused: TE sizes its kernel by them);
- the mask type (``causal``, ``padding_causal``, ``*_bottom_right``, ``no_mask``, ``padding``), the sliding window
  ``(left, right)``, the softmax scale and grouped-query heads, as TE applies them.

Anything else TE would do differently (attention bias, ALiBi, soft-capping, a non-vanilla softmax, FP8) is not
reproduced: :class:`NotReproduced` says which, and the step's verdict is then not determined.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["BadAttentionInputs", "NotReproduced", "ReferenceCoreAttention", "attend"]


class NotReproduced(RuntimeError):
    """The config asks TE's attention for something this reference does not reproduce (the message says what)."""


class BadAttentionInputs(RuntimeError):
    """Inputs TE's attention refuses or computes wrong: a layout that does not match the tensors, cumulative lengths
    past the tensor, a sequence longer than the ``max_seqlen`` that sizes the kernel (the message says which)."""


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    bottom_right: bool,
    window: tuple[int, int] | None,
) -> torch.Tensor:
    """One sequence: ``query`` [sq, h, d], ``key`` [sk, g, d], ``value`` [sk, g, dv] -> [sq, h, dv], in float32."""
    heads, groups = query.shape[1], key.shape[1]
    if heads % groups:
        raise NotReproduced(f"{heads} query heads over {groups} key/value groups")
    key = key.float().repeat_interleave(heads // groups, dim=1)
    value = value.float().repeat_interleave(heads // groups, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float(), key) * scale
    sq, sk = query.shape[0], key.shape[0]
    rows = torch.arange(sq).unsqueeze(1) + (sk - sq if bottom_right else 0)
    cols = torch.arange(sk).unsqueeze(0)
    allowed = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        allowed &= cols <= rows
    if window is not None:
        left, right = window
        if left >= 0:
            allowed &= cols >= rows - left
        if right >= 0:
            allowed &= cols <= rows + right
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a query that may see nothing gives zeros
    return torch.einsum("hqk,khd->qhd", weights, value)


def _bounds(cu: torch.Tensor, padded: torch.Tensor | None) -> list[tuple[int, int]]:
    starts = (padded if padded is not None else cu).tolist()
    lengths = (cu[1:] - cu[:-1]).tolist()
    return [(int(s), int(n)) for s, n in zip(starts, lengths)]


class ReferenceCoreAttention(torch.nn.Module):
    """Stands in for a layer's core attention module (TE's or Megatron-Core's) in the step's model: the same call,
    ``(query, key, value, attention_mask, attn_mask_type=..., attention_bias=..., packed_seq_params=...)``."""

    def __init__(self, config: Any, softmax_scale: float | None, head_dim: int) -> None:
        super().__init__()
        if getattr(config, "softmax_type", "vanilla") not in (None, "vanilla"):
            raise NotReproduced(f"softmax_type={config.softmax_type!r}")
        if getattr(config, "fp8", None) and getattr(config, "fp8_dot_product_attention", False):
            raise NotReproduced("FP8 dot-product attention")
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        window = getattr(config, "window_size", None)
        self.window = tuple(window) if window is not None else None

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
        **unused: Any,
    ) -> torch.Tensor:
        if attention_bias is not None:
            raise NotReproduced("an attention bias")
        mask_type = getattr(attn_mask_type, "name", attn_mask_type) or "causal"
        causal = "causal" in mask_type
        bottom_right = "bottom_right" in mask_type
        fmt = getattr(packed_seq_params, "qkv_format", None) or "sbhd"
        if fmt == "thd":
            return self._thd(query, key, value, packed_seq_params, causal, bottom_right)
        if query.dim() != 4:
            raise BadAttentionInputs(f"qkv_format={fmt!r} reads 4-D tensors; the query is {tuple(query.shape)}")
        if fmt == "sbhd":
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        if attention_mask is not None and attention_mask.any():
            raise NotReproduced("an explicit attention mask over unpacked rows")
        rows = [
            attend(q, k, v, scale=self.scale, causal=causal, bottom_right=bottom_right, window=self.window)
            for q, k, v in zip(query, key, value)
        ]
        out = torch.stack(rows).to(query.dtype)  # [b, s, h, dv]
        if fmt == "sbhd":
            out = out.transpose(0, 1)
        return out.reshape(*out.shape[:2], -1)

    def _thd(self, query: Any, key: Any, value: Any, params: Any, causal: bool, bottom_right: bool) -> torch.Tensor:
        if query.dim() != 3:
            raise BadAttentionInputs(f"qkv_format='thd' reads [t, h, d] tensors; the query is {tuple(query.shape)}")
        if params.cu_seqlens_q is None or params.cu_seqlens_kv is None:
            raise BadAttentionInputs("qkv_format='thd' needs cu_seqlens_q and cu_seqlens_kv")
        q_bounds = _bounds(params.cu_seqlens_q, params.cu_seqlens_q_padded)
        kv_bounds = _bounds(params.cu_seqlens_kv, params.cu_seqlens_kv_padded)
        if len(q_bounds) != len(kv_bounds):
            raise BadAttentionInputs(f"{len(q_bounds)} query sequences against {len(kv_bounds)} key/value sequences")
        out = torch.zeros(query.shape[0], query.shape[1], value.shape[2], dtype=torch.float32)
        for (qs, qn), (ks, kn) in zip(q_bounds, kv_bounds):
            for n, bound, name in (
                (qn, params.max_seqlen_q, "max_seqlen_q"),
                (kn, params.max_seqlen_kv, "max_seqlen_kv"),
            ):
                if bound is not None and n > int(bound):
                    raise BadAttentionInputs(
                        f"a sequence of {n} tokens exceeds {name}={int(bound)}, which sizes TE's kernel"
                    )
            if qs + qn > query.shape[0] or ks + kn > key.shape[0]:
                raise BadAttentionInputs("cu_seqlens point past the end of the packed tensor")
            if qn == 0:
                continue
            out[qs : qs + qn] = attend(
                query[qs : qs + qn],
                key[ks : ks + kn],
                value[ks : ks + kn],
                scale=self.scale,
                causal=causal,
                bottom_right=bottom_right,
                window=self.window,
            )
        return out.to(query.dtype).reshape(query.shape[0], -1)
