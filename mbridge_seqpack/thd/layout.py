"""THD ``PackedSeqParams`` with static (padded) ``cu_seqlens`` for CUDA-graph paths.

A CUDA graph replays fixed shapes. Packed attention takes ``cu_seqlens`` whose length changes with the
number of sequences per row, and a ``max_seqlen`` that changes per batch. Here both are fixed for the
whole run: ``cu_seqlens`` always has ``capacity`` entries (the tail is zero-length segments) and
``max_seqlen`` is a constant safe bound. Padding is ``torch.cat`` with an expanded view of the last
entry, so it never reads a device tensor on the host (no ``.item()``, ``.tolist()``, ``argmin`` or
boolean indexing): value checks run only on CPU tensors, where collate builds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mbridge_seqpack.errors import ArtifactError, SeqpackError, UsageError

__all__ = [
    "StaticTHDLayout",
    "StaticShapeOverflowError",
    "validate_cu_seqlens",
    "pad_cu_seqlens",
    "static_cu_seqlens",
    "static_packed_seq_params",
    "static_thd_batch",
]

SEQUENCE_KEYS = {"tokens": 0, "input_ids": 0, "labels": -100, "loss_mask": 0, "position_ids": 0}


class StaticShapeOverflowError(SeqpackError):
    """A row has more sequences than the static ``cu_seqlens`` capacity holds."""


@dataclass(frozen=True)
class StaticTHDLayout:
    """Fixed shapes for a run: ``capacity`` cu_seqlens entries, ``max_seqlen``, optional row ``width``."""

    capacity: int
    max_seqlen: int
    width: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, int) or self.capacity < 2:
            raise UsageError(
                f"StaticTHDLayout.capacity must be an int >= 2 (0 plus one boundary), got {self.capacity!r}"
            )
        if not isinstance(self.max_seqlen, int) or self.max_seqlen < 1:
            raise UsageError(f"StaticTHDLayout.max_seqlen must be a positive int, got {self.max_seqlen!r}")
        if self.width is not None and (not isinstance(self.width, int) or self.width < 1):
            raise UsageError(f"StaticTHDLayout.width must be a positive int or None, got {self.width!r}")

    @classmethod
    def from_pack_metadata(cls, path: str | Path, row_width: int) -> "StaticTHDLayout":
        """Capacity and max_seqlen from an offline pack's metadata JSON, as Megatron-Bridge sizes them:
        ``max_samples_per_bin + 2`` entries (leading 0, tail segment) and ``max(dataset_max_seqlen,
        row_width - min_packed_seqlen)`` (the tail padding is a segment too)."""
        from mbridge_seqpack.artifact.pack_entry import PackEntry

        try:
            entries = [PackEntry.from_json(e) for e in json.loads(Path(path).read_text())]
            max_samples = max(int(e.max_samples_per_bin) for e in entries)  # type: ignore[arg-type]
            max_seq = max(int(e.dataset_max_seqlen) for e in entries)  # type: ignore[arg-type]
            min_packed = min(int(e.min_packed_seqlen) for e in entries)  # type: ignore[arg-type]
        except FileNotFoundError:
            raise UsageError(
                f"pack metadata {path} does not exist; pass the <N>_metadata.jsonl written with the pack"
            ) from None
        except (json.JSONDecodeError, ArtifactError, TypeError, ValueError) as exc:
            raise UsageError(
                f"pack metadata {path} must be a JSON list of objects with max_samples_per_bin, "
                f"dataset_max_seqlen and min_packed_seqlen ({exc})"
            ) from None
        return cls(capacity=max_samples + 2, max_seqlen=max(max_seq, row_width - min_packed), width=row_width)


def validate_cu_seqlens(cu: torch.Tensor, *, name: str = "cu_seqlens", row_width: int | None = None) -> None:
    """Value checks for host-side boundaries: 1-D integers, start 0, non-decreasing, inside the row."""
    if not isinstance(cu, torch.Tensor):
        raise UsageError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise UsageError(f"{name} must be a non-empty 1-D tensor of boundaries, got shape {tuple(cu.shape)}")
    if cu.dtype.is_floating_point or cu.dtype == torch.bool:
        raise UsageError(f"{name} must hold integers, got dtype {cu.dtype}")
    if cu.device.type != "cpu":
        return  # reading device values would synchronise; collate-time (CPU) callers get the checks
    values = cu.to(torch.int64)
    if values[0] != 0:
        raise UsageError(f"{name}[0] must be 0 (the first sequence starts the row), got {int(values[0])}")
    if (values < 0).any():
        raise UsageError(f"{name} has a negative boundary: {values.tolist()}")
    steps = values[1:] - values[:-1]
    if (steps < 0).any():
        i = int(torch.nonzero(steps < 0)[0]) + 1
        raise UsageError(
            f"{name} must be non-decreasing; {name}[{i}] = {int(values[i])} < {name}[{i - 1}] = {int(values[i - 1])}"
        )
    if row_width is not None and values[-1] > row_width:
        raise UsageError(f"{name}[-1] = {int(values[-1])} is beyond the row width {row_width}")


def pad_cu_seqlens(cu: torch.Tensor, capacity: int, *, name: str = "cu_seqlens") -> torch.Tensor:
    """``cu`` extended to ``capacity`` entries by repeating its last value (zero-length segments).

    Works on the last dimension, so ``[B, n]`` batches pad row-wise. Only the shape is inspected.
    """
    n = cu.shape[-1]
    if n > capacity:
        raise StaticShapeOverflowError(
            f"{name} has {n} entries ({n - 1} segments) but the static capacity is {capacity}; raise the "
            f"capacity to at least {n} (pack metadata max_samples_per_bin + 2), or pack fewer sequences per row. "
            f"Rows are never truncated."
        )
    if n == capacity:
        return cu
    tail = cu[..., -1:].expand(*cu.shape[:-1], capacity - n)
    return torch.cat([cu, tail], dim=-1)


def _with_tail(cu: torch.Tensor, end: int) -> torch.Tensor:
    """Append ``end`` as a final boundary (host tensors only: the caller decided it is needed)."""
    return torch.cat([cu, torch.tensor([end], dtype=cu.dtype, device=cu.device)])


def static_cu_seqlens(
    cu_seqlens: torch.Tensor,
    *,
    capacity: int,
    cu_seqlens_padded: torch.Tensor | None = None,
    row_width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Validated, tail-closed and capacity-padded (logical, physical) boundaries of one row.

    With ``row_width``, a row whose last physical boundary stops short of the width gets a final
    padding segment (zero-length in the logical boundaries), as Megatron-Bridge's packed collate does.
    """
    cu = cu_seqlens.reshape(-1) if cu_seqlens.dim() == 2 and cu_seqlens.shape[0] == 1 else cu_seqlens
    validate_cu_seqlens(cu, name="cu_seqlens", row_width=row_width)
    padded = None
    if cu_seqlens_padded is not None:
        padded = cu_seqlens_padded.reshape(-1) if cu_seqlens_padded.dim() == 2 else cu_seqlens_padded
        validate_cu_seqlens(padded, name="cu_seqlens_padded", row_width=row_width)
        if padded.shape != cu.shape:
            raise UsageError(
                f"cu_seqlens_padded has {padded.numel()} entries and cu_seqlens {cu.numel()}; they "
                f"describe the same segments and must match"
            )
    if row_width is not None and cu.device.type == "cpu":
        physical = padded if padded is not None else cu
        if int(physical[-1]) < row_width:
            if padded is not None:
                padded = _with_tail(padded, row_width)
                cu = _with_tail(cu, int(cu[-1]))
            else:
                cu = _with_tail(cu, row_width)
    cu = pad_cu_seqlens(cu, capacity, name="cu_seqlens")
    if padded is not None:
        padded = pad_cu_seqlens(padded, capacity, name="cu_seqlens_padded")
    return cu, padded


def static_packed_seq_params(
    cu_seqlens: torch.Tensor,
    *,
    capacity: int,
    max_seqlen: int,
    cu_seqlens_padded: torch.Tensor | None = None,
    row_width: int | None = None,
) -> Any:
    """Megatron-Core ``PackedSeqParams(qkv_format="thd")`` with ``capacity``-entry boundaries and a fixed
    ``max_seqlen`` (q and kv identical), whatever the number of sequences in the row."""
    from megatron.core.packed_seq_params import PackedSeqParams

    if not isinstance(max_seqlen, int) or max_seqlen < 1:
        raise UsageError(f"max_seqlen must be a positive int (a fixed bound for the run), got {max_seqlen!r}")
    cu, padded = static_cu_seqlens(
        cu_seqlens, capacity=capacity, cu_seqlens_padded=cu_seqlens_padded, row_width=row_width
    )
    cu = cu.to(torch.int32)
    padded = padded.to(torch.int32) if padded is not None else None
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=padded,
        cu_seqlens_kv_padded=padded,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
    )


# ---- training-step injection ----------------------------------------------------------------------


def _pad_row_width(batch: dict[str, Any], width: int) -> None:
    """Right-pad sequence tensors ``[..., T]`` to ``width`` (pad tokens, ignore labels, zero loss)."""
    for key, value in SEQUENCE_KEYS.items():
        tensor = batch.get(key)
        if not isinstance(tensor, torch.Tensor) or tensor.dim() < 2:
            continue
        short = width - tensor.shape[-1]
        if short < 0:
            raise StaticShapeOverflowError(
                f"batch['{key}'] has {tensor.shape[-1]} tokens per row, more than the static width {width}"
            )
        if short:
            fill = tensor.new_full((*tensor.shape[:-1], short), value)
            batch[key] = torch.cat([tensor, fill], dim=-1)
    if "total_tokens" in batch:
        batch["total_tokens"] = width


def static_thd_batch(batch: dict[str, Any], layout: StaticTHDLayout) -> dict[str, Any]:
    """One collated THD batch with static shapes: fixed width (if the layout has one), ``capacity``-entry
    boundaries, constant ``max_seqlen``. Batches without ``cu_seqlens_q`` pass through unchanged; a batch
    Megatron-Bridge's ``pad_cu_seqlens`` collate already made static is returned as it is."""
    if not isinstance(batch, dict) or "cu_seqlens_q" not in batch:
        return batch
    out = dict(batch)
    if layout.width is not None:
        _pad_row_width(out, layout.width)
    cu = out["cu_seqlens_q"]
    padded = out.get("cu_seqlens_q_padded")
    rows_2d = cu.dim() == 2
    cu_rows = list(cu) if rows_2d else [cu]
    padded_rows = (list(padded) if rows_2d else [padded]) if padded is not None else [None] * len(cu_rows)
    new_cu, new_padded = [], []
    for row_cu, row_padded in zip(cu_rows, padded_rows):
        c, p = static_cu_seqlens(
            row_cu, capacity=layout.capacity, cu_seqlens_padded=row_padded, row_width=layout.width
        )
        new_cu.append(c.to(torch.int32))
        new_padded.append(p.to(torch.int32) if p is not None else None)
    stack = (lambda rows: torch.stack(rows)) if rows_2d else (lambda rows: rows[0])
    out["cu_seqlens_q"] = out["cu_seqlens_kv"] = stack(new_cu)
    if padded is not None:
        out["cu_seqlens_q_padded"] = out["cu_seqlens_kv_padded"] = stack(new_padded)
    _set_max_seqlen(out, layout.max_seqlen)
    return out


def _set_max_seqlen(out: dict[str, Any], max_seqlen: int) -> None:
    """``max_seqlen`` as a *host* tensor (shape and dtype of the batch's own): Megatron-Bridge's
    ``get_batch_from_iterator`` reads it back with ``.cpu()``, a device-to-host copy that a CUDA-graph capture
    forbids when the value lives on the device (as after ``FullCudaGraphWrapper.data_read``)."""
    for key in ("max_seqlen_q", "max_seqlen_kv"):
        old = out.get(key)
        out[key] = (
            torch.full(old.shape, max_seqlen, dtype=old.dtype)
            if isinstance(old, torch.Tensor)
            else torch.tensor(max_seqlen, dtype=torch.int32)
        )
