"""``verify``: everything ``inspect`` checks, then the CPU parity checks on rows of the artifact.

For each checked row: static ``cu_seqlens`` keep the row's boundaries and the metadata's capacity;
packed attention equals each sequence attended alone (on every query near a boundary and a random sample
of the others, so memory stays linear in the row length: a 128k row verifies in seconds); the packed
per-token loss equals the sum of the per-sequence losses; and, for every CP size the row's alignment allows,
the THD zigzag partition followed by reassembly gives the row back. The exit status reflects every problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

__all__ = ["VerifyReport", "verify_artifact", "sampled_attention_parity"]

QUERY_SAMPLE = 512
EDGE = 3  # queries this close to a boundary are always checked


@dataclass
class VerifyReport:
    """``inspect``'s problems plus per-check counts of rows that passed, and the failures."""

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
        lines = [
            f"verify {self.artifact}: {self.rows_checked} row(s), static cu_seqlens capacity {self.capacity}, "
            f"CP sizes {', '.join(map(str, self.cp_sizes)) or 'none'}"
        ]
        lines += [f"  {name:<28} {count}/{self.rows_checked} rows" for name, count in self.passed.items()]
        lines += [f"  FAIL {f}" for f in self.failures[:20]]
        if len(self.failures) > 20:
            lines.append(f"  ... and {len(self.failures) - 20} more")
        lines.append("verify: OK" if self.ok else f"verify: FAILED ({len(self.failures)} failure(s))")
        return "\n".join(lines)


def _rows(path: Path, limit: int) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    seen = 0
    for batch in pq.ParquetFile(str(path)).iter_batches(
        batch_size=64, columns=["input_ids", "loss_mask", "seq_start_id"]
    ):
        for row in batch.to_pylist():
            if seen >= limit:
                return
            seen += 1
            yield row


def _query_sample(physical: list[int], total: int, gen: Any) -> Any:
    """Every query within ``EDGE`` tokens of a boundary, plus ``QUERY_SAMPLE`` random ones."""
    import torch

    bounds = torch.tensor(physical, dtype=torch.int64)
    near = (bounds[:, None] + torch.arange(-EDGE, EDGE + 1)[None, :]).reshape(-1)
    rand = torch.randint(0, max(total, 1), (QUERY_SAMPLE,), generator=gen)
    picked = torch.cat([near, rand])
    return torch.unique(picked[(picked >= 0) & (picked < total)])


def sampled_attention_parity(q: Any, k: Any, v: Any, cu_seqlens: Any, queries: Any) -> float:
    """Max difference between packed causal attention driven by ``cu_seqlens`` and attention over each query's
    own sequence alone, at ``queries``. Memory O(len(queries) * T), never T x T."""
    import torch

    from mbridge_seqpack.thd.reference import segment_ids

    total = q.shape[0]
    seg = segment_ids(cu_seqlens, total)
    bounds = cu_seqlens.to(torch.int64)
    scale = q.shape[-1] ** -0.5
    worst = 0.0
    for block in queries.split(64):
        scores = torch.einsum("qhd,khd->hqk", q[block], k) * scale  # [heads, Qb, T]
        allowed = (seg[block][:, None] == seg[None, :]) & (torch.arange(total)[None, :] <= block[:, None])
        packed = torch.einsum("hqk,khd->qhd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), v)
        for row, i in enumerate(block.tolist()):
            start = int(bounds[torch.searchsorted(bounds, torch.tensor(i), right=True) - 1])
            alone = torch.einsum(
                "hk,khd->hd",
                (torch.einsum("hd,khd->hk", q[i], k[start : i + 1]) * scale).softmax(-1),
                v[start : i + 1],
            )
            worst = max(worst, float((packed[row] - alone).abs().max()))
    return worst


def _logical_lengths(ids: list[int], starts: list[int], eos: int | None) -> list[int]:
    """Runtime lengths without alignment padding, as Megatron-Bridge's packed collate computes them (up to
    the last non-EOS token); the full segment when the EOS id is unknown."""
    out = []
    for s, e in zip(starts[:-1], starts[1:]):
        seg = np.asarray(ids[s : e - 1])
        if eos is None:
            out.append(len(seg))
            continue
        keep = np.flatnonzero(seg != eos)
        out.append(int(keep[-1]) + 1 if keep.size else 0)
    return out


def verify_artifact(target: str | Path, *, max_rows: int = 16, seed: int = 0) -> VerifyReport:
    """``inspect`` plus the parity checks on up to ``max_rows`` rows of every file of an artifact."""
    import torch

    from mbridge_seqpack.artifact.inspect_artifact import inspect_artifact
    from mbridge_seqpack.artifact.seal import find_metadata
    from mbridge_seqpack.thd.layout import StaticTHDLayout, static_cu_seqlens
    from mbridge_seqpack.thd.reference import packed_token_loss, thd_cp_partition_indices, thd_cp_reassemble

    inspected = inspect_artifact(target)
    report = VerifyReport(Path(target))
    report.failures += [f"inspect: {p}" for p in inspected.all_problems]
    if not inspected.splits or any(s.problems for s in inspected.splits):
        return report
    fp = inspected.fingerprint
    meta, _, _ = find_metadata(inspected.directory)
    eos = int(fp.eos_id) if fp else None
    mult = int(fp.pad_seq_to_mult or 1) if fp else 1
    cp_sizes = tuple(cp for cp in (2, 4, 8, 16) if mult % (2 * cp) == 0)
    report.cp_sizes = cp_sizes
    names = ["static cu_seqlens", "attention parity", "loss parity"] + [
        f"CP{cp} partition round trip" for cp in cp_sizes
    ]
    report.passed = {name: 0 for name in names}
    gen = torch.Generator().manual_seed(seed)
    for split in inspected.splits:
        width = split.pack_size or None
        layout = StaticTHDLayout.from_pack_metadata(meta, width) if (meta is not None and width) else None
        report.capacity = layout.capacity if layout else 0
        for number, row in enumerate(_rows(split.path, max_rows)):
            _verify_row(
                report,
                f"{split.name} row {number}",
                row,
                eos,
                layout,
                width,
                cp_sizes,
                gen,
                packed_token_loss,
                thd_cp_partition_indices,
                thd_cp_reassemble,
                static_cu_seqlens,
            )
    return report


def _verify_row(
    report: VerifyReport,
    where: str,
    row: dict[str, Any],
    eos: int | None,
    layout: Any,
    width: int | None,
    cp_sizes: tuple[int, ...],
    gen: Any,
    packed_token_loss: Any,
    partition: Any,
    reassemble: Any,
    static_cu_seqlens: Any,
) -> None:
    import torch

    ids = row["input_ids"]
    starts = list(row["seq_start_id"]) + [len(ids)]
    seg = [e - s - 1 for s, e in zip(starts[:-1], starts[1:])]  # runtime (aligned) lengths
    physical = torch.tensor(np.cumsum([0, *seg]), dtype=torch.int32)
    logical = torch.tensor(np.cumsum([0, *_logical_lengths(ids, starts, eos)]), dtype=torch.int32)
    ids_t = torch.tensor(ids, dtype=torch.int64)
    tokens = torch.cat([ids_t[s : e - 1] for s, e in zip(starts[:-1], starts[1:])])
    labels = torch.cat([ids_t[s + 1 : e] for s, e in zip(starts[:-1], starts[1:])])
    stored = torch.tensor(row["loss_mask"], dtype=torch.float64)
    mask = torch.cat([stored[s : e - 1] for s, e in zip(starts[:-1], starts[1:])])
    report.rows_checked += 1
    if layout is not None:
        try:
            c, p = static_cu_seqlens(logical, cu_seqlens_padded=physical, capacity=layout.capacity, row_width=width)
            assert c.shape == p.shape == (layout.capacity,), "shape"
            assert p[: len(physical)].tolist() == physical.tolist(), "prefix"
            report.passed["static cu_seqlens"] += 1
        except (AssertionError, ValueError) as exc:
            report.failures.append(f"{where}: static cu_seqlens: {exc}")
    else:
        report.passed["static cu_seqlens"] += 1  # unsealed pack without metadata: nothing static to size
    total = int(physical[-1])
    q, k, v = (torch.randn(total, 2, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    worst = sampled_attention_parity(q, k, v, physical, _query_sample(physical.tolist(), total, gen))
    if worst <= 1e-9:
        report.passed["attention parity"] += 1
    else:
        report.failures.append(f"{where}: packed attention differs from per-sequence attention (max {worst:.3g})")
    logits = torch.randn(total, 64, generator=gen, dtype=torch.float64)
    lab = labels % 64
    packed_loss, _ = packed_token_loss(logits, lab, mask)
    separate = sum(
        packed_token_loss(logits[a:b], lab[a:b], mask[a:b])[0]
        for a, b in zip(physical[:-1].tolist(), physical[1:].tolist())
    )
    if torch.allclose(packed_loss, torch.as_tensor(separate, dtype=torch.float64), rtol=1e-12, atol=1e-12):
        report.passed["loss parity"] += 1
    else:
        report.failures.append(
            f"{where}: packed loss {float(packed_loss):.6g} != per-sequence sum {float(separate):.6g}"
        )
    for cp in cp_sizes:
        try:
            shards = [tokens[partition(physical, cp, r)] for r in range(cp)]
            assert torch.equal(reassemble(shards, physical), tokens), "tokens differ after reassembly"
            report.passed[f"CP{cp} partition round trip"] += 1
        except (AssertionError, ValueError) as exc:
            report.failures.append(f"{where}: CP{cp}: {exc}")
