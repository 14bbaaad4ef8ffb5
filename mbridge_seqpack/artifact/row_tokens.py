"""The tokens of placed rows, read back from what tokenization handed over: its arrays in memory, or its spill
files (memory-mapped), a batch of rows at a time.

Tokenization hands the writer data (``TokenizedSequences``: tokens, loss mask, offsets), not a reader: the rows
are gathered here, where they are written, so ``pack``'s data moves from tokenization to the artifact and does not
come back. A Ray pack's sequences (pipeline/ray_engine.py ``ShardedSequences``) sit in one spill directory per
shard; they read their own shards with :func:`read_segments`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from mbridge_seqpack.errors import InputError

__all__ = ["gather_tokens", "loss_counts", "read_segments"]


def gather_tokens(seqs: Any, starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tokens (int64) and loss mask (int8) of the sequences at ``starts`` (token offsets) with ``sizes`` tokens,
    concatenated in that order.

    ``seqs`` holds ``tokens`` and ``loss_mask`` arrays (tokenization's ``TokenizedSequences``), or reads its own
    (a ``gather`` method: a Ray pack's shards). Spilled (memory-mapped) arrays are read with ``preadv`` straight
    into the result: mapping their pages would put far more of the file in this process's resident set than the
    few sequences read (the kernel maps around every fault)."""
    starts, sizes = np.asarray(starts, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    own_reader = getattr(seqs, "gather", None)
    if own_reader is not None:
        return own_reader(starts, sizes)
    total = int(sizes.sum())
    positions = np.cumsum(sizes) - sizes
    out = []
    for array in (seqs.tokens, seqs.loss_mask):
        if not isinstance(array, np.memmap):
            out.append(np.asarray(array[np.repeat(starts - positions, sizes) + np.arange(total)]))
            continue
        buffer = np.empty(total, dtype=array.dtype)
        if not read_segments(array.filename, buffer, positions, starts, sizes, array.offset):
            raise InputError(f"{array.filename}: spilled tokens end early (truncated); re-run pack")
        out.append(buffer)
    return out[0].astype(np.int64, copy=False), out[1].astype(np.int8, copy=False)


def read_segments(
    path: str | Path, out: np.ndarray, positions: np.ndarray, starts: np.ndarray, sizes: np.ndarray, offset: int = 0
) -> bool:
    """Read ``sizes[i]`` items of ``out``'s dtype at item ``starts[i]`` of the file ``path`` (its items begin at
    byte ``offset``) into ``out[positions[i]:]``, one ``preadv`` straight into the result each; False when the file
    ends early (truncated)."""
    view, item = memoryview(out).cast("B"), out.itemsize
    fd = os.open(path, os.O_RDONLY)
    try:
        for position, start, size in zip(positions.tolist(), starts.tolist(), sizes.tolist()):
            wanted = size * item
            if os.preadv(fd, [view[position * item : position * item + wanted]], offset + start * item) != wanted:
                return False
    finally:
        os.close(fd)
    return True


def loss_counts(seqs: Any, bins: Any, chunk_tokens: int = 1 << 20) -> dict[str, int]:
    """Tokens the packed rows train on (their stored loss mask) and the packed sequences that train on none (a
    chat record without an assistant turn, say): counted, sealed, shown in the summary. Read as the row writer
    reads them (artifact/row_tokens.py), about ``chunk_tokens`` tokens at a time, so a local and a cluster pack
    agree and the memory it takes does not grow with the tokens."""
    offsets = np.asarray(seqs.offsets, dtype=np.int64)
    kept = np.asarray(bins) >= 0
    loss_tokens = zero = 0
    start, count = 0, offsets.size - 1
    while start < count:
        end = int(np.searchsorted(offsets, offsets[start] + chunk_tokens, side="right")) - 1
        end = min(max(end, start + 1), count)
        sizes = offsets[start + 1 : end + 1] - offsets[start:end]
        _, mask = gather_tokens(seqs, offsets[start:end], sizes)
        ends = np.cumsum(sizes)
        cumulative = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
        per_sequence = (cumulative[ends] - cumulative[ends - sizes])[kept[start:end]]
        loss_tokens += int(per_sequence.sum())
        zero += int((per_sequence == 0).sum())
        start = end
    return {"loss_tokens": loss_tokens, "zero_loss_sequences": zero}
