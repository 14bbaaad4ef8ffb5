"""The reference core attention against PyTorch's own scaled_dot_product_attention, one sequence at a time: THD rows
with padded offsets, grouped heads, sliding windows; and every PackedSeqParams field it must read refused or followed
as TE's API documents it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mbridge_seqpack.minilaunch.attention import BadAttentionInputs, NotReproduced, ReferenceCoreAttention

HEADS, GROUPS, DIM = 4, 2, 8


def _config(**changes) -> SimpleNamespace:
    return SimpleNamespace(**{"softmax_type": "vanilla", "fp8": None, "window_size": None, **changes})


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: tuple[int, int] | None = None) -> torch.Tensor:
    """PyTorch's attention over one causal sequence [s, h, d] (key/value heads repeated): the test's reference."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    s = q.shape[0]
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    if window is not None:
        i = torch.arange(s).unsqueeze(1)
        j = torch.arange(s).unsqueeze(0)
        mask &= j >= i - window[0]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
    )
    return out.transpose(0, 1).reshape(s, -1)


def _params(lengths: list[int], gaps: list[int], **changes) -> SimpleNamespace:
    cu = [0]
    padded = [0]
    for n, gap in zip(lengths, gaps):
        cu.append(cu[-1] + n)
        padded.append(padded[-1] + n + gap)
    fields = {
        "qkv_format": "thd",
        "cu_seqlens_q": torch.tensor(cu, dtype=torch.int32),
        "cu_seqlens_kv": torch.tensor(cu, dtype=torch.int32),
        "cu_seqlens_q_padded": torch.tensor(padded, dtype=torch.int32),
        "cu_seqlens_kv_padded": torch.tensor(padded, dtype=torch.int32),
        "max_seqlen_q": max(lengths),
        "max_seqlen_kv": max(lengths),
    }
    return SimpleNamespace(**{**fields, **changes})


def _qkv(total: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(total, HEADS, DIM, generator=gen),
        torch.randn(total, GROUPS, DIM, generator=gen),
        torch.randn(total, GROUPS, DIM, generator=gen),
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 9), st.integers(0, 3)), min_size=1, max_size=5),
    st.sampled_from([None, (2, 0), (0, 0)]),
)
def test_thd_rows_match_pytorch_attention_per_sequence(shape: list[tuple[int, int]], window) -> None:
    lengths, gaps = [n for n, _ in shape], [g for _, g in shape]
    total = sum(lengths) + sum(gaps) + 2  # a tail of row padding
    q, k, v = _qkv(total)
    module = ReferenceCoreAttention(_config(window_size=window), None, DIM)
    out = module(q, k, v, None, attn_mask_type="padding_causal", packed_seq_params=_params(lengths, gaps))
    assert out.shape == (total, HEADS * DIM)
    start = 0
    covered = torch.zeros(total, dtype=torch.bool)
    for n, gap in shape:
        expected = _sdpa(q[start : start + n], k[start : start + n], v[start : start + n], window)
        torch.testing.assert_close(out[start : start + n], expected, rtol=1e-5, atol=1e-5)
        covered[start : start + n] = True
        start += n + gap
    assert bool((out[~covered] == 0).all())  # padding between sequences and the row's tail gives zeros


def test_unpacked_sbhd_matches_pytorch_attention() -> None:
    q, k, v = _qkv(6, seed=1)
    module = ReferenceCoreAttention(_config(), 0.3, DIM)
    out = module(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), None, attn_mask_type="causal")
    assert out.shape == (6, 1, HEADS * DIM)
    expected = _sdpa(q * 0.3 * math.sqrt(DIM), k, v)  # scale 0.3 instead of 1/sqrt(d)
    torch.testing.assert_close(out[:, 0], expected, rtol=1e-5, atol=1e-5)


def test_each_packed_field_is_read() -> None:
    """A shifted cu_seqlens_kv, a max_seqlen below a sequence's length, a THD tensor read as SBHD: each changes the
    output or is refused, as each changes what TE computes."""
    lengths, gaps = [3, 5, 2], [1, 0, 2]
    q, k, v = _qkv(16, seed=2)
    module = ReferenceCoreAttention(_config(), None, DIM)
    good = module(q, k, v, None, attn_mask_type="padding_causal", packed_seq_params=_params(lengths, gaps))
    shifted = _params(lengths, gaps)
    shifted.cu_seqlens_kv_padded = shifted.cu_seqlens_kv_padded + 1
    moved = module(q, k, v, None, attn_mask_type="padding_causal", packed_seq_params=shifted)
    assert not torch.allclose(good, moved)
    with pytest.raises(
        BadAttentionInputs, match="a sequence of 5 tokens exceeds max_seqlen_q=4, which sizes TE's kernel"
    ):
        module(
            q, k, v, None, attn_mask_type="padding_causal", packed_seq_params=_params(lengths, gaps, max_seqlen_q=4)
        )
    with pytest.raises(BadAttentionInputs, match=r"qkv_format='sbhd' reads 4-D tensors; the query is \(16, 4, 8\)"):
        module(q, k, v, None, attn_mask_type="causal", packed_seq_params=_params(lengths, gaps, qkv_format="sbhd"))
    no_mask = module(q, k, v, None, attn_mask_type="padding", packed_seq_params=_params(lengths, gaps))
    assert not torch.allclose(good, no_mask)  # the mask type is read: without causality a token sees its future


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"softmax_type": "learnable"}, "softmax_type='learnable'"),
        ({"fp8": "hybrid", "fp8_dot_product_attention": True}, "FP8"),
    ],
)
def test_what_it_does_not_reproduce_is_said(config: dict, message: str) -> None:
    with pytest.raises(NotReproduced, match=message):
        ReferenceCoreAttention(_config(**config), None, DIM)
