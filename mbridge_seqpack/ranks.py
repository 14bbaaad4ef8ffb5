"""Which process of a job this is, without initialising anything (rank-0-only warnings and file hashing)."""

from __future__ import annotations

import os

__all__ = ["is_rank_zero"]


def is_rank_zero() -> bool:
    """Rank 0 of ``torch.distributed`` when it is initialised, else ``RANK`` (unset: a single process)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank() == 0
    except Exception:  # noqa: BLE001  (a broken torch install must not break validation)
        pass
    return os.environ.get("RANK", "0") == "0"
