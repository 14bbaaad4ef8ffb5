"""``inspect``: load a packed artifact, verify every invariant, report statistics, draw a histogram."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mbridge_seqpack.packing.artifact import ArtifactError, read_parquet_fingerprint

__all__ = ["SplitReport", "ArtifactReport", "inspect_artifact", "find_artifact_files"]


@dataclass
class SplitReport:
    """Statistics and verification findings of one packed split."""

    name: str
    path: Path
    rows: int
    sequences: int
    real_tokens: int
    alignment_padding: int
    row_padding: int
    pack_size: int
    sequences_per_row: dict[int, int]
    problems: list[str] = field(default_factory=list)

    @property
    def efficiency(self) -> float:
        slots = self.rows * self.pack_size
        return (slots - self.alignment_padding - self.row_padding) / slots if slots else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"split": self.name, "path": str(self.path), "rows": self.rows, "sequences": self.sequences,
                "real_tokens": self.real_tokens, "alignment_padding_tokens": self.alignment_padding,
                "row_padding_tokens": self.row_padding, "pack_size": self.pack_size,
                "efficiency": round(self.efficiency, 6),
                "sequences_per_row": {str(k): v for k, v in sorted(self.sequences_per_row.items())},
                "problems": self.problems}


@dataclass
class ArtifactReport:
    """The whole artifact: its fingerprint and each split."""

    directory: Path
    fingerprint: dict[str, Any]
    splits: list[SplitReport]

    @property
    def ok(self) -> bool:
        return all(not s.problems for s in self.splits)

    def to_dict(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "ok": self.ok, "fingerprint": self.fingerprint,
                "splits": [s.to_dict() for s in self.splits]}

    def to_text(self) -> str:
        fp = self.fingerprint
        lines = [f"packed artifact {self.directory}",
                 f"  fingerprint  pack_size={fp.get('pack_size')} pad_seq_to_mult={fp.get('pad_seq_to_mult')} "
                 f"algorithm={fp.get('algorithm')} seed={fp.get('seed')} plugin={fp.get('plugin_version')}",
                 f"               input sha256 {str(fp.get('input_sha256'))[:16]}...  tokenizer "
                 f"{fp.get('tokenizer')} (sha256 {str(fp.get('tokenizer_sha256'))[:16]}...)"]
        for s in self.splits:
            hist = ", ".join(f"{k}:{v}" for k, v in sorted(s.sequences_per_row.items()))
            lines += [f"  {s.name}: {s.rows} rows, {s.sequences} sequences, {s.real_tokens:,} real tokens, "
                      f"efficiency {s.efficiency:.2%}",
                      f"    padding: {s.alignment_padding:,} alignment + {s.row_padding:,} row-tail tokens",
                      f"    sequences per row: {hist}"]
            lines += [f"    PROBLEM: {p}" for p in s.problems]
        lines.append("verify: OK" if self.ok else
                     f"verify: FAILED ({sum(len(s.problems) for s in self.splits)} problem(s))")
        return "\n".join(lines)


def find_artifact_files(target: str | Path) -> tuple[Path, list[Path]]:
    """Metadata file and split files of an artifact directory (or of the directory holding one file)."""
    path = Path(target)
    directory = path if path.is_dir() else path.parent
    if not directory.is_dir():
        raise ArtifactError(f"{target}: no such artifact directory")
    metas = sorted(directory.glob("*_metadata.jsonl"))
    parquet = sorted(directory.glob("*.idx.parquet")) if path.is_dir() else [path]
    if not parquet:
        raise ArtifactError(f"{directory}: no packed .idx.parquet files")
    if len(metas) != 1:
        raise ArtifactError(f"{directory}: expected one <N>_metadata.jsonl, found {len(metas)}; the artifact is "
                            f"incomplete (an interrupted pack writes it last) - re-run mbridge-seqpack pack")
    return metas[0], parquet


def _check_split(name: str, path: Path, table: Any, pack_size: int, pad_mult: int,
                 expected_sequences: int | None, dropped: int) -> SplitReport:
    ids = table.column("input_ids").combine_chunks()
    mask = table.column("loss_mask").combine_chunks()
    starts = table.column("seq_start_id").combine_chunks()
    problems: list[str] = []
    row_off = ids.offsets.to_numpy()
    if not np.array_equal(row_off, mask.offsets.to_numpy()):
        problems.append("loss_mask and input_ids differ in length on some row")
    mask_values = mask.values.to_numpy(zero_copy_only=False).astype(np.int64)
    seq_row_off = starts.offsets.to_numpy()
    per_row = np.diff(seq_row_off)
    start_vals = starts.values.to_numpy(zero_copy_only=False).astype(np.int64)
    row_of_seq = np.repeat(np.arange(len(per_row)), per_row)
    abs_starts = start_vals + row_off[:-1][row_of_seq]
    ends = np.append(abs_starts[1:], 0)
    filled = per_row > 0
    ends[seq_row_off[1:][filled] - 1] = row_off[1:][filled]  # a row's last sequence runs to the row end
    seg = ends - abs_starts
    first_ok = start_vals[seq_row_off[:-1][per_row > 0]] == 0
    if (per_row == 0).any():
        problems.append(f"{int((per_row == 0).sum())} row(s) hold no sequence")
    if not first_ok.all():
        problems.append("seq_start_id does not start at 0 on some row")
    structural_ok = not (seg < 2).any()
    if not structural_ok:
        problems.append("boundaries are not strictly increasing (a segment of fewer than 2 tokens)")
    runtime = np.bincount(row_of_seq, weights=seg - 1, minlength=len(per_row)).astype(np.int64)
    if (runtime > pack_size).any():
        problems.append(f"{int((runtime > pack_size).sum())} row(s) exceed the pack size {pack_size}")
    if pad_mult > 1 and ((seg - 1) % pad_mult).any():
        problems.append(f"{int(((seg - 1) % pad_mult > 0).sum())} sequence(s) not padded to a multiple of {pad_mult}")
    if "sequence_length" in table.column_names and structural_ok:
        orig = table.column("sequence_length").combine_chunks().values.to_numpy(zero_copy_only=False).astype(np.int64)
        # stored (label-aligned) mask positions orig-1 .. seg-1 predict padding: they must be 0
        pad_counts = seg - orig
        if (pad_counts < 0).any():
            problems.append("a recorded sequence_length exceeds its segment")
        else:
            pos = np.repeat(abs_starts + orig - 1, pad_counts + 1) + _ramp(pad_counts + 1)
            if mask_values[pos].any():
                problems.append(f"padding carries loss on {int(mask_values[pos].sum())} position(s)")
        alignment = int(pad_counts.clip(min=0).sum())
    else:
        alignment = 0
    if "sequence_index" in table.column_names:
        idx = table.column("sequence_index").combine_chunks().values.to_numpy(zero_copy_only=False)
        n = expected_sequences if expected_sequences is not None else len(idx)
        counts = np.bincount(idx, minlength=n) if len(idx) else np.zeros(n, dtype=np.int64)
        if len(counts) > n or (counts > 1).any():
            problems.append(f"{int((counts > 1).sum())} sequence(s) appear more than once")
        missing = int((counts[:n] == 0).sum())
        if missing != dropped:
            problems.append(f"{missing} sequence(s) of the input are missing ({dropped} were dropped as too long)")
    real = int((seg - 1).sum()) - alignment
    hist_k, hist_v = np.unique(per_row, return_counts=True)
    return SplitReport(name, path, len(per_row), int(len(seg)), real, alignment,
                       int(len(per_row) * pack_size - runtime.sum()), pack_size,
                       {int(k): int(v) for k, v in zip(hist_k, hist_v)}, problems)


def _ramp(counts: np.ndarray) -> np.ndarray:
    """0..c-1 for each c in counts, concatenated."""
    total = int(counts.sum())
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(total) - offsets


def inspect_artifact(target: str | Path, *, png: str | Path | None = None) -> ArtifactReport:
    """Verify an artifact written by ``pack`` and collect its statistics."""
    import pyarrow.parquet as pq

    meta_path, files = find_artifact_files(target)
    try:
        entries = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{meta_path}: unreadable metadata ({exc}); re-run mbridge-seqpack pack") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ArtifactError(f"{meta_path}: metadata must be a JSON list of objects")
    by_split = {e.get("split"): e for e in entries}
    reports = []
    fingerprint: dict[str, Any] = {}
    for path in files:
        info = read_parquet_fingerprint(path)
        if info is None:
            raise ArtifactError(f"{path}: has no mbridge_seqpack fingerprint; it was not written by mbridge-seqpack")
        entry = by_split.get(info.get("split"))
        if entry is None:
            raise ArtifactError(f"{path}: split {info.get('split')!r} is not in {meta_path.name}; stale or mixed "
                                f"artifact - re-run mbridge-seqpack pack")
        if entry.get("fingerprint") != info.get("fingerprint"):
            raise ArtifactError(f"{path}: fingerprint differs from {meta_path.name}; the files come from different "
                                f"pack runs - re-run mbridge-seqpack pack")
        fingerprint = info["fingerprint"]
        try:
            table = pq.read_table(str(path))
        except (OSError, ValueError) as exc:
            raise ArtifactError(f"{path}: corrupted Parquet data ({exc}); re-run mbridge-seqpack pack") from None
        stats = info.get("stats", {})
        reports.append(_check_split(info["split"], path, table, int(fingerprint["pack_size"]),
                                    int(fingerprint["pad_seq_to_mult"]), stats.get("num_sequences"),
                                    int(stats.get("num_dropped", 0))))
    report = ArtifactReport(meta_path.parent, fingerprint, reports)
    if png is not None:
        _draw_histogram(report, Path(png))
    return report


def _draw_histogram(report: ArtifactReport, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(report.splits), figsize=(6 * len(report.splits), 4), squeeze=False)
    for ax, split in zip(axes[0], report.splits):
        keys = sorted(split.sequences_per_row)
        values = np.repeat(keys, [split.sequences_per_row[k] for k in keys])
        ax.hist(values, bins=min(40, max(1, len(keys))), color="#4C72B0", edgecolor="white")
        ax.set_title(f"{split.name}: {split.rows} rows, efficiency {split.efficiency:.1%}")
        ax.set_xlabel("sequences per packed row")
        ax.set_ylabel("rows")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
