"""A vectorised drop-in for Megatron-Bridge's packed-dataset ``collate_fn``.

``GPTSFTPackedDataset.collate_fn`` builds every row with Python loops over segments and tokens
(``np.where`` per segment, list appends, per-element ``torch.LongTensor`` construction). This
produces the same batch dict (same keys, values, dtypes and shapes) from the same ``__getitem__``
items with NumPy on flat arrays. Megatron-Bridge is not imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from mbridge_seqpack.errors import UsageError

__all__ = ["PackedCollator"]


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass
class PackedCollator:
    """Collate packed rows (``input_ids``, ``seq_boundaries``, ``loss_mask``) into a THD batch.

    Arguments mirror ``GPTSFTPackedDataset``: ``max_seq_length`` (the pack size), ``eos_id``,
    ``pad_to_max_length``, ``pad_seq_to_mult`` (>1 emits ``*_padded`` boundaries),
    ``pad_seq_length_to_mult`` (row rounding when not padding to max), ``answer_only_loss``, and for
    ``pad_cu_seqlens`` the pack metadata entries.
    """

    max_seq_length: int
    eos_id: int
    pad_to_max_length: bool = False
    pad_seq_to_mult: int = 1
    pad_seq_length_to_mult: int = 16
    answer_only_loss: bool = True
    pad_cu_seqlens: bool = False
    pack_metadata: Sequence[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.pad_cu_seqlens and not self.pack_metadata:
            raise UsageError("pad_cu_seqlens=True needs pack_metadata (the entries of <N>_metadata.jsonl)")
        if self.pad_cu_seqlens and not self.pad_to_max_length:
            raise UsageError("pad_cu_seqlens=True requires pad_to_max_length=True")

    def _row(self, item: dict[str, Any], max_length: int) -> dict[str, Any]:
        ids = np.asarray(item["input_ids"], dtype=np.int64)
        bounds = np.asarray(item["seq_boundaries"], dtype=np.int64)
        starts, ends = bounds[:-1], bounds[1:] - 1  # each segment drops its last token (labels shift)
        seg = ends - starts
        total = int(seg.sum())
        offsets = np.zeros(len(seg) + 1, dtype=np.int64)
        np.cumsum(seg, out=offsets[1:])
        gather = np.repeat(starts - offsets[:-1], seg) + np.arange(total)
        tokens = ids[gather]
        labels = ids[gather + 1]
        if self.answer_only_loss:
            mask = np.asarray(item["loss_mask"], dtype=np.int64)[gather]
        else:
            mask = (tokens != self.eos_id).astype(np.int64)
        positions = np.arange(total) - np.repeat(offsets[:-1], seg)
        if self.pad_seq_to_mult > 1:
            physical = offsets.tolist()
            if physical[-1] != max_length:
                physical.append(max_length)
            # logical length: up to the last non-EOS token of each segment
            not_eos = tokens != self.eos_id
            seg_id = np.repeat(np.arange(len(seg)), seg)
            last = np.full(len(seg), -1, dtype=np.int64)
            np.maximum.at(last, seg_id[not_eos], np.nonzero(not_eos)[0] - offsets[:-1][seg_id[not_eos]])
            logical = [0, *np.cumsum(last + 1).tolist()]
            if len(physical) > len(logical):
                logical.append(logical[-1])
        else:
            logical, physical = offsets.tolist(), None
            if logical[-1] != max_length:
                logical.append(max_length)
        if self.pad_cu_seqlens:
            cap = max(p["max_samples_per_bin"] for p in self.pack_metadata) + 2  # type: ignore[union-attr]
            if physical is not None:
                extra = cap - len(physical)
                physical += [max_length] * extra
                logical += [logical[-1]] * extra
            else:
                logical += [max_length] * (cap - len(logical))
        return {
            "tokens": tokens,
            "labels": labels,
            "mask": mask,
            "positions": positions,
            "count": total,
            "logical": logical,
            "physical": physical,
        }

    def __call__(self, batch: list[dict[str, Any]]) -> dict[str, Any]:
        lengths = [
            sum(b - a - 1 for a, b in zip(item["seq_boundaries"][:-1], item["seq_boundaries"][1:])) for item in batch
        ]
        if self.pad_to_max_length:
            max_length = self.max_seq_length
        else:
            max_length = min(self.max_seq_length, _ceil_to(max(lengths), self.pad_seq_length_to_mult))
        rows = [self._row(item, max_length) for item in batch]
        n = len(rows)

        def stack(key: str, pad: int) -> torch.Tensor:
            out = np.full((n, max_length), pad, dtype=np.int64)
            for i, r in enumerate(rows):
                out[i, : r["count"]] = r[key]
            return torch.from_numpy(out)

        tokens = stack("tokens", self.eos_id)
        loss_mask = stack("mask", 0)
        loss_mask[tokens == self.eos_id] = 0
        out: dict[str, Any] = {
            "tokens": tokens,
            "labels": stack("labels", self.eos_id),
            "loss_mask": loss_mask,
            "position_ids": stack("positions", 0),
            "token_count": [r["count"] for r in rows],
        }
        has_padded = rows[0]["physical"] is not None
        width = max(len(r["logical"]) for r in rows)
        if has_padded:
            width = max(width, max(len(r["physical"]) for r in rows))

        def boundaries(key: str) -> torch.Tensor:
            arr = np.empty((n, width), dtype=np.int32)
            for i, r in enumerate(rows):
                values = r[key]
                arr[i, : len(values)] = values
                arr[i, len(values) :] = values[-1]
            return torch.from_numpy(arr)

        cu = boundaries("logical")
        cu_padded = boundaries("physical") if has_padded else None
        if self.pad_cu_seqlens:
            meta = self.pack_metadata or []
            safe = max(
                max(p["dataset_max_seqlen"] for p in meta), max_length - min(p["min_packed_seqlen"] for p in meta)
            )
            max_seqlen = torch.full((n,), safe, dtype=torch.int32)  # Megatron-Bridge's shape here
        else:
            ref = cu_padded if cu_padded is not None else cu
            max_seqlen = (ref[:, 1:] - ref[:, :-1]).max(dim=1, keepdim=True).values
        out.update(
            {
                "attention_mask": None,
                "cu_seqlens_q": cu,
                "cu_seqlens_kv": cu,
                "max_seqlen_q": max_seqlen,
                "max_seqlen_kv": max_seqlen,
            }
        )
        if cu_padded is not None:
            out["cu_seqlens_q_padded"] = cu_padded
            out["cu_seqlens_kv_padded"] = cu_padded
        return out
