"""Where each row is written so that Megatron-Bridge's sampler reads the rows in the order placement chose.

``read_order`` is the order a sampler reads the file's rows in (``batch``: Megatron-Bridge's seeded permutation,
``single``: file order); ``file_layout`` inverts it for the first epoch.
"""

from __future__ import annotations

import numpy as np

from mbridge_seqpack.errors import UsageError

__all__ = ["SAMPLERS", "read_order", "read_order_digest", "file_layout"]


#: how Megatron-Bridge's samplers read a packed split (``dataset.dataloader_type``): ``batch`` (its SFT
#: datasets' default, ``MegatronPretrainingBatchSampler``) reads a seeded permutation that changes every epoch;
#: ``single`` reads in file order. Both hand position ``j`` of a global batch to DP rank ``j % dp``.
SAMPLERS = ("batch", "single")


def read_order(rows: int, sampler: str, seed: int, epoch: int = 0) -> np.ndarray:
    """File rows in the order the sampler reads them in ``epoch``. ``batch`` as Megatron-Bridge's
    ``MegatronPretrainingBatchSampler.__iter__`` (shuffle on): ``torch.randperm`` with a generator seeded
    ``seed + epoch`` (``seed`` is ``dataset.seed``)."""
    if sampler == "single":
        return np.arange(rows, dtype=np.int64)
    if sampler != "batch":
        raise UsageError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    import torch

    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(rows, generator=generator).numpy().astype(np.int64)


def read_order_digest(rows: int, sampler: str, seed: int) -> str:
    """sha256 of the epoch-0 read order: the ``batch`` sampler's permutation comes from this process's torch,
    and a training environment whose torch permutes otherwise would read the rows in another order."""
    import hashlib

    return hashlib.sha256(read_order(rows, sampler, seed).astype("<i8").tobytes()).hexdigest()


def file_layout(order: np.ndarray, sampler: str, seed: int) -> np.ndarray:
    """Which row to write at each file index so that the sampler reads ``order`` in its first epoch."""
    layout = np.empty_like(order)
    layout[read_order(order.size, sampler, seed)] = order
    return layout
