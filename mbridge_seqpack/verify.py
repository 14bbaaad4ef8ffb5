"""``verify``: replay the CPU parity checks on the rows of a user's packed artifact.

For each checked row: static ``cu_seqlens`` keep the row's boundaries and the metadata's capacity;
packed attention equals each sequence attended alone; the packed per-token loss equals the sum of the
per-sequence losses and padding carries no loss; and, for every CP size the row's alignment allows,
the THD zigzag partition followed by reassembly gives the row back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["VerifyReport", "verify_artifact"]


@dataclass
class VerifyReport:
    """Per-check counts of rows that passed, and the first failures."""

    artifact: Path
    rows_checked: int = 0
    capacity: int = 0
    cp_sizes: tuple[int, ...] = ()
    passed: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and self.rows_checked > 0

    def to_text(self) -> str:
        lines = [f"verify {self.artifact}: {self.rows_checked} row(s), static cu_seqlens capacity {self.capacity}, "
                 f"CP sizes {', '.join(map(str, self.cp_sizes)) or 'none'}"]
        lines += [f"  {name:<28} {count}/{self.rows_checked} rows" for name, count in self.passed.items()]
        lines += [f"  FAIL {f}" for f in self.failures[:20]]
        lines.append("verify: OK" if self.ok else f"verify: FAILED ({len(self.failures)} failure(s))")
        return "\n".join(lines)


def _rows(path: Path, limit: int) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    batch = next(pq.ParquetFile(str(path)).iter_batches(batch_size=limit), None)  # not the whole file
    return batch.to_pylist() if batch is not None else []


def verify_artifact(target: str | Path, *, max_rows: int = 16, seed: int = 0) -> VerifyReport:
    """Run the parity checks on up to ``max_rows`` training rows of an artifact from ``pack``."""
    import torch

    from mbridge_seqpack.packing.inspect_artifact import find_artifact_files, inspect_artifact
    from mbridge_seqpack.reference import (
        packed_token_loss,
        thd_cp_partition_indices,
        thd_cp_reassemble,
        varlen_causal_attention,
    )
    from mbridge_seqpack.thd import StaticTHDLayout, static_cu_seqlens

    inspected = inspect_artifact(target)  # refuses incomplete, corrupted or mixed artifacts first
    meta, files = find_artifact_files(target)
    pack_size = int(inspected.fingerprint["pack_size"])
    mult = int(inspected.fingerprint["pad_seq_to_mult"])
    layout = StaticTHDLayout.from_pack_metadata(meta, pack_size)
    cp_sizes = tuple(cp for cp in (2, 4, 8, 16) if mult % (2 * cp) == 0)
    report = VerifyReport(Path(target), capacity=layout.capacity, cp_sizes=cp_sizes)
    names = ["static cu_seqlens", "attention parity", "loss parity", "padding has no loss"] + [
        f"CP{cp} partition round trip" for cp in cp_sizes]
    report.passed = {name: 0 for name in names}
    gen = torch.Generator().manual_seed(seed)
    train = [f for f in files if f.name.startswith("training")] or files
    for number, row in enumerate(_rows(train[0], max_rows)):
        ids = torch.tensor(row["input_ids"], dtype=torch.int64)
        stored_mask = torch.tensor(row["loss_mask"], dtype=torch.float64)
        starts = list(row["seq_start_id"]) + [len(ids)]
        originals = row.get("sequence_length") or [e - s for s, e in zip(starts[:-1], starts[1:])]
        seg = [e - s - 1 for s, e in zip(starts[:-1], starts[1:])]  # runtime (aligned) lengths
        tokens = torch.cat([ids[s:e - 1] for s, e in zip(starts[:-1], starts[1:])])
        labels = torch.cat([ids[s + 1:e] for s, e in zip(starts[:-1], starts[1:])])
        mask = torch.cat([stored_mask[s:e - 1] for s, e in zip(starts[:-1], starts[1:])])
        physical = torch.tensor(np.cumsum([0, *seg]), dtype=torch.int32)
        logical = torch.tensor(np.cumsum([0, *[o - 1 for o in originals]]), dtype=torch.int32)
        where = f"row {number}"
        report.rows_checked += 1
        try:
            c, p = static_cu_seqlens(logical, cu_seqlens_padded=physical, capacity=layout.capacity,
                                     row_width=pack_size)
            assert c.shape == p.shape == (layout.capacity,), "shape"
            assert p[:len(physical)].tolist() == physical.tolist(), "prefix"
            report.passed["static cu_seqlens"] += 1
        except (AssertionError, ValueError) as exc:
            report.failures.append(f"{where}: static cu_seqlens: {exc}")
            continue
        total = int(physical[-1])
        # the whole static row: real segments, the tail padding segment, zero-length capacity padding
        q, k, v = (torch.randn(pack_size, 2, 8, generator=gen, dtype=torch.float64) for _ in range(3))
        packed = varlen_causal_attention(q, k, v, p)[:total]
        alone = torch.cat([
            torch.nn.functional.scaled_dot_product_attention(
                q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1), is_causal=True
            ).transpose(0, 1)
            for a, b in zip(physical[:-1].tolist(), physical[1:].tolist())])
        if torch.allclose(packed, alone, rtol=1e-9, atol=1e-9):
            report.passed["attention parity"] += 1
        else:
            report.failures.append(f"{where}: packed attention differs from per-sequence attention "
                                   f"(max {float((packed - alone).abs().max()):.3g})")
        logits = torch.randn(total, 64, generator=gen, dtype=torch.float64)
        lab = labels % 64
        packed_loss, _ = packed_token_loss(logits, lab, mask)
        separate = sum(packed_token_loss(logits[a:b], lab[a:b], mask[a:b])[0]
                       for a, b in zip(physical[:-1].tolist(), physical[1:].tolist()))
        if torch.allclose(packed_loss, torch.as_tensor(separate, dtype=torch.float64), rtol=1e-12, atol=1e-12):
            report.passed["loss parity"] += 1
        else:
            report.failures.append(f"{where}: packed loss {float(packed_loss):.6g} != per-sequence sum "
                                   f"{float(separate):.6g}")
        pad_loss = sum(float(mask[a + o - 1:b].sum()) for a, b, o in
                       zip(physical[:-1].tolist(), physical[1:].tolist(), originals))
        if pad_loss == 0:
            report.passed["padding has no loss"] += 1
        else:
            report.failures.append(f"{where}: alignment padding carries loss on {int(pad_loss)} position(s)")
        for cp in cp_sizes:
            try:
                shards = [tokens[thd_cp_partition_indices(physical, cp, r)] for r in range(cp)]
                back = thd_cp_reassemble(shards, physical)
                assert torch.equal(back, tokens), "tokens differ after reassembly"
                report.passed[f"CP{cp} partition round trip"] += 1
            except (AssertionError, ValueError) as exc:
                report.failures.append(f"{where}: CP{cp}: {exc}")
    return report
