"""CPU references for packed attention, packed loss and THD context-parallel partitioning.

Plain PyTorch, driven only by ``cu_seqlens``: what the parity tests and ``mbridge-seqpack verify``
compare packed computation against. The CP split mirrors the per-document zigzag that Megatron-Core
applies to THD batches (Transformer Engine's ``thd_get_partitioned_indices``): every sequence, padded to
a multiple of 2*CP, is cut into 2*CP chunks and rank r holds chunks r and 2*CP-1-r.
"""

from __future__ import annotations

import torch

from mbridge_seqpack.errors import UsageError

__all__ = [
    "segment_ids",
    "varlen_causal_attention",
    "packed_token_loss",
    "thd_cp_partition_indices",
    "thd_cp_reassemble",
]


def segment_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Segment index of every token position; positions past the last boundary form one extra segment."""
    positions = torch.arange(total, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens.to(torch.int64).contiguous(), positions, right=True) - 1


def varlen_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor
) -> torch.Tensor:
    """Causal attention of ``[T, heads, dim]`` tensors where token i sees token j only inside its own segment."""
    total = q.shape[0]
    seg = segment_ids(cu_seqlens, total)
    idx = torch.arange(total, device=q.device)
    allowed = (seg[:, None] == seg[None, :]) & (idx[None, :] <= idx[:, None])
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=allowed
    )
    return out.transpose(0, 1)


def packed_token_loss(
    logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of masked token cross-entropies, number of loss tokens): Megatron's per-token loss pair."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # at least fp32, keep fp64
    losses = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    mask = loss_mask.to(losses.dtype)
    return (losses * mask).sum(), mask.sum()


def thd_cp_partition_indices(cu_seqlens_padded: torch.Tensor, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Token indices that CP rank ``cp_rank`` holds of a THD row (zigzag per document)."""
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise UsageError(f"cp_rank must be in [0, {cp_size}) with cp_size >= 1, got rank {cp_rank} of {cp_size}")
    bounds = cu_seqlens_padded.to(torch.int64).tolist()
    chunks = 2 * cp_size
    parts = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        length = end - start
        if length == 0:
            continue
        if length % chunks:
            raise UsageError(
                f"segment [{start}, {end}) has length {length}, not a multiple of 2*CP = {chunks}; "
                f"pad sequences to pad_seq_to_mult (THD would silently drop tokens)"
            )
        size = length // chunks
        for chunk in (cp_rank, chunks - 1 - cp_rank):
            parts.append(torch.arange(start + chunk * size, start + (chunk + 1) * size))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)


def thd_cp_reassemble(shards: list[torch.Tensor], cu_seqlens_padded: torch.Tensor) -> torch.Tensor:
    """Inverse of the partition: put every rank's shard back at its token positions."""
    cp_size = len(shards)
    total = int(cu_seqlens_padded[-1])
    out = shards[0].new_empty((total, *shards[0].shape[1:]))
    filled = torch.zeros(total, dtype=torch.bool)
    for rank, shard in enumerate(shards):
        index = thd_cp_partition_indices(cu_seqlens_padded, cp_size, rank)
        if filled[index].any():
            raise UsageError("CP shards overlap: a token is held by two ranks")
        out[index] = shard
        filled[index] = True
    if not filled.all():
        raise UsageError(f"CP shards miss {int((~filled).sum())} token(s)")
    return out
