"""``inspect``: verify a packed artifact (seal, structure, values), report statistics, draw a histogram.

Sealed packs (written by ``mbridge-seqpack pack``) are checked against their metadata before any byte is
parsed: every split listed, file size and sha256 equal, one fingerprint throughout; then every column's
checksum, the row structure and the values (token ids inside the vocabulary, EOS closing every sequence
when the template adds one, loss on some token of every sequence, each input record exactly once).
Packs written by Megatron-Bridge itself carry no seal: their structure and values are checked and the
report says they are unsealed. Problems are reported, never raised; only "nothing to inspect" raises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mbridge_seqpack.artifact.pack_entry import PackEntry
from mbridge_seqpack.artifact.seal import (
    REPACK,
    entry_for,
    find_metadata,
    lost_fingerprint_problem,
    resolve_files,
    seal_problems,
)
from mbridge_seqpack.artifact.store import (
    ArtifactError,
    Fingerprint,
    digest_columns,
    list_column,
    read_parquet_fingerprint,
)
from mbridge_seqpack.placement.record import BalanceRecord, BalanceReport, balance_report

__all__ = ["SplitReport", "ArtifactReport", "inspect_artifact"]


@dataclass
class SplitReport:
    """Statistics and findings of one packed file."""

    name: str
    path: Path
    rows: int = 0
    sequences: int = 0
    tokens: int = 0
    row_padding: int = 0
    pack_size: int = 0
    sequences_per_row: dict[int, int] = field(default_factory=dict)
    sealed: bool = False
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    balance: BalanceReport | None = None
    # for the plot (cli/histogram.py): each sequence's length as trained (the label shift taken off) and each
    # row's filled tokens; not in to_dict, whose figures summarize them
    sequence_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    row_fill: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)

    @property
    def efficiency(self) -> float:
        slots = self.rows * self.pack_size
        return self.tokens / slots if slots else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "split": self.name,
            "path": str(self.path),
            "sealed": self.sealed,
            "rows": self.rows,
            "sequences": self.sequences,
            "tokens": self.tokens,
            "row_padding_tokens": self.row_padding,
            "pack_size": self.pack_size,
            "efficiency": round(self.efficiency, 6),
            "sequences_per_row": {str(k): v for k, v in sorted(self.sequences_per_row.items())},
            "balance": self.balance.to_dict() if self.balance else None,
            "problems": self.problems,
            "notes": self.notes,
        }


@dataclass
class ArtifactReport:
    """The whole artifact: its fingerprint, each file, and problems that concern no single file."""

    directory: Path
    fingerprint: Fingerprint | None
    splits: list[SplitReport]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(not s.problems for s in self.splits)

    @property
    def all_problems(self) -> list[str]:
        return self.problems + [f"{s.path.name}: {p}" for s in self.splits for p in s.problems]

    def to_dict(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "ok": self.ok,
            "fingerprint": self.fingerprint.to_dict() if self.fingerprint else {},
            "problems": self.problems,
            "splits": [s.to_dict() for s in self.splits],
        }

    def to_text(self) -> str:
        """The report for people, at most 100 columns."""
        from mbridge_seqpack.textout import wrap

        fp = self.fingerprint
        lines = wrap(str(self.directory), "packed artifact ", hang="  ")
        hang = " " * 11
        if fp:
            lines += wrap(
                f"pack_size={fp.pack_size} pad_seq_to_mult={fp.pad_seq_to_mult} algorithm={fp.algorithm} "
                f"seed={fp.seed}",
                "  seal     ",
                hang=hang,
            )
            lines += wrap(f"input {str(fp.input_sha256)[:12]}", hang)
            lines += wrap(
                f"tokenizer {fp.tokenizer} ({str(fp.tokenizer_sha256)[:12]}, eos {fp.eos_id}, vocab {fp.vocab_size})",
                hang,
                hang=hang + "  ",
            )
            lines += wrap(f"megatron-bridge {fp.megatron_bridge_version}, plugin {fp.plugin_version}", hang)
        for p in self.problems:
            lines += wrap(p, "  PROBLEM: ", hang=" " * 11)
        for s in self.splits:
            seal = "sealed" if s.sealed else "UNSEALED"
            if (self.problems or s.problems) and not s.tokens:  # not read: no counts to show
                lines += wrap(f"{s.name} ({s.path.name}, {seal}): not read", "  ", hang="    ")
                lines += [line for p in s.problems for line in wrap(p, "    PROBLEM: ", hang=" " * 13)]
                continue
            lines += wrap(
                f"{s.name} ({s.path.name}, {seal}): {s.rows} rows, {s.sequences} sequences, "
                f"{s.tokens:,} tokens, efficiency {s.efficiency:.2%}",
                "  ",
                hang="    ",
            )
            if s.sequences_per_row:
                keys = sorted(s.sequences_per_row)
                lines.append(
                    f"    sequences per row: {keys[0]}..{keys[-1]} "
                    f"(median {int(np.median(np.repeat(keys, [s.sequences_per_row[k] for k in keys])))})"
                )
            if s.balance:
                lines += wrap(s.balance.to_text(), "    ", hang="      ")
            for n in s.notes:
                lines += wrap(n, "    note: ", hang=" " * 10)
            for p in s.problems:
                lines += wrap(p, "    PROBLEM: ", hang=" " * 13)
        count = len(self.all_problems)
        lines.append("inspect: OK" if self.ok else f"inspect: FAILED ({count} problem(s))")
        return "\n".join(lines)


def _check_rows(
    report: SplitReport,
    columns: dict[str, tuple[np.ndarray, np.ndarray]],
    fp: Fingerprint | None,
    stats: dict[str, Any],
    balance: BalanceRecord | None = None,
    entry: PackEntry | None = None,
) -> None:
    problems = report.problems
    row_off, ids = columns["input_ids"]
    mask_off, mask = columns["loss_mask"]
    seq_off, starts = columns["seq_start_id"]
    if not np.array_equal(row_off, mask_off):
        problems.append("loss_mask and input_ids differ in length on some row")
        return
    per_row = np.diff(seq_off)
    report.rows, report.sequences = len(per_row), len(starts)
    if (per_row == 0).any():
        problems.append(f"{int((per_row == 0).sum())} row(s) hold no sequence")
        return
    row_of_seq = np.repeat(np.arange(len(per_row)), per_row)
    if (starts[seq_off[:-1]] != 0).any():
        problems.append("seq_start_id does not start at 0 on some row")
        return
    abs_starts = starts + row_off[:-1][row_of_seq]
    ends = np.append(abs_starts[1:], 0)
    ends[seq_off[1:] - 1] = row_off[1:]  # a row's last sequence runs to the row end
    seg = ends - abs_starts
    if (seg < 2).any():
        problems.append(
            f"{int((seg < 2).sum())} segment(s) shorter than 2 tokens: boundaries are not strictly increasing"
        )
        return
    runtime = np.bincount(row_of_seq, weights=seg - 1, minlength=len(per_row)).astype(np.int64)
    # the runtime lengths (input_ids minus the label shift) Megatron-Bridge's packing metadata counts
    if entry is not None:
        read_by_megatron = {
            "max_samples_per_bin": int(per_row.max()),
            "dataset_max_seqlen": int((seg - 1).max()),
            "min_packed_seqlen": int(runtime.min()),
        }
        wrong = {k: (getattr(entry, k), v) for k, v in read_by_megatron.items() if getattr(entry, k) != v}
        if wrong:
            problems.append(
                "metadata disagrees with the rows on what Megatron-Bridge reads: "
                + ", ".join(f"{k}={meta} (rows: {rows})" for k, (meta, rows) in wrong.items())
            )
            return
    report.balance = balance_report(seg - 1, row_of_seq, len(per_row), balance)
    report.tokens = int(runtime.sum())
    report.sequence_lengths, report.row_fill = (seg - 1).astype(np.int64), runtime
    hist_k, hist_v = np.unique(per_row, return_counts=True)
    report.sequences_per_row = {int(k): int(v) for k, v in zip(hist_k, hist_v)}
    if not np.isin(mask, (0, 1)).all():
        problems.append("loss_mask holds values other than 0 and 1")
    if (ids < 0).any():
        problems.append(f"{int((ids < 0).sum())} negative token id(s)")
    no_loss = np.add.reduceat(mask, abs_starts) == 0 if len(abs_starts) else np.zeros(0, bool)
    if no_loss.all() and len(no_loss):
        problems.append("no sequence has any loss token: the loss mask is empty")
    elif no_loss.any():
        report.notes.append(f"{int(no_loss.sum())} sequence(s) have no loss token (truncated answers)")
    if fp is None:
        return
    pack_size, mult = int(fp.pack_size), int(fp.pad_seq_to_mult)
    report.pack_size = pack_size
    report.row_padding = int(len(per_row) * pack_size - runtime.sum())
    if (runtime > pack_size).any():
        problems.append(f"{int((runtime > pack_size).sum())} row(s) exceed the pack size {pack_size}")
    if mult > 1 and ((seg - 1) % mult).any():
        problems.append(f"{int(((seg - 1) % mult > 0).sum())} sequence(s) not padded to a multiple of {mult}")
    vocab = int(fp.vocab_size or 0)
    if vocab and (ids >= vocab).any():
        problems.append(f"{int((ids >= vocab).sum())} token id(s) outside the vocabulary (>= {vocab})")
    kwargs = json.loads(fp.dataset_kwargs or "{}")
    if not kwargs.get("chat") and kwargs.get("add_eos", True):
        closing = ids[ends - 1]
        if (closing != int(fp.eos_id)).any():
            problems.append(
                f"{int((closing != int(fp.eos_id)).sum())} sequence(s) do not end in EOS "
                f"({fp.eos_id}), where the template puts it"
            )
    if "sequence_index" in columns:
        _, index = columns["sequence_index"]
        n = int(stats.get("num_sequences", len(index)))
        counts = np.bincount(index, minlength=n) if len(index) and index.min() >= 0 else np.zeros(n, np.int64)
        if len(counts) > n or (counts > 1).any():
            problems.append(f"{int((counts > 1).sum())} input sequence(s) appear more than once")
        missing = int((counts[:n] == 0).sum())
        if missing != int(stats.get("num_dropped", 0)):
            problems.append(f"{missing} input sequence(s) are missing")


def _inspect_file(
    path: Path, meta: Path | None, entries: list[PackEntry] | None
) -> tuple[SplitReport, Fingerprint | None]:
    import pyarrow.parquet as pq

    name = path.name.split("_")[0] if "_" in path.name else path.stem
    report = SplitReport(name, path)
    try:
        info = read_parquet_fingerprint(path)
    except ArtifactError as exc:
        report.problems.append(str(exc).removeprefix(f"{path}: "))  # already ends in the re-pack advice
        return report, None
    fp: Fingerprint | None = None
    entry = entry_for(entries, info) if info is not None else None
    if info is not None:
        report.sealed, report.name = True, str(info.get("split", name))
        fp = Fingerprint.from_dict(info["fingerprint"])
        report.problems += seal_problems(path, info, entry, meta)
        if report.problems:
            return report, fp
    elif lost := lost_fingerprint_problem(path, meta, entries):
        report.problems.append(lost)
        return report, fp
    else:
        report.notes.append(
            "unsealed: no mbridge_seqpack fingerprint (written by Megatron-Bridge or another tool); "
            "structure and values checked, content cannot be verified against a seal"
        )
    try:
        table = pq.read_table(str(path))
    except (OSError, ValueError, MemoryError) as exc:
        report.problems.append(f"unreadable Parquet data ({str(exc)[:120]}) - {REPACK}")
        return report, fp
    missing = {"input_ids", "loss_mask", "seq_start_id"} - set(table.column_names)
    if missing:
        report.problems.append(f"missing column(s) {sorted(missing)} that Megatron-Bridge reads")
        return report, fp
    columns = {name: list_column(table.column(name)) for name in table.column_names}
    if info is not None:
        sealed_sums = ((entry.checksums if entry else None) or {}).get("columns", {})
        bad = sorted(k for k, v in digest_columns(columns).items() if sealed_sums.get(k) != v)
        if bad:
            report.problems.append(f"column checksum(s) differ from the seal: {', '.join(bad)} - {REPACK}")
            return report, fp
    _check_rows(report, columns, fp, info.get("stats", {}) if info else {}, BalanceRecord.of_entry(info), entry)
    return report, fp


def inspect_artifact(target: str | Path) -> ArtifactReport:
    """Verify every file of a packed artifact (a directory or one file) and collect its statistics."""
    files = resolve_files(target)
    directory = files[0].parent
    meta, entries, meta_problem = find_metadata(directory)
    report = ArtifactReport(directory, None, [])
    if meta_problem:
        report.problems.append(meta_problem)
    fingerprints = []
    for path in files:
        split, fp = _inspect_file(path, meta, entries)
        report.splits.append(split)
        if fp is not None:
            fingerprints.append(fp)
    unique = {json.dumps(fp.settings(), sort_keys=True) for fp in fingerprints}
    if len(unique) > 1:
        report.problems.append(f"{len(unique)} different pack settings among the files: mixed packs in one place")
    names = [s.name for s in report.splits]
    if len(set(names)) < len(names):
        report.problems.append(f"a split appears in more than one file ({', '.join(sorted(names))}): mixed packs")
    if fingerprints:
        report.fingerprint = fingerprints[0]
        listed = {e.split for e in entries or [] if isinstance(e.fingerprint, dict)}
        absent = sorted(listed - set(names)) if Path(target).is_dir() else []
        if absent:
            report.problems.append(f"split(s) {absent} listed in the metadata have no file: incomplete pack")
    return report
