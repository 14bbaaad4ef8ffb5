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
from typing import Any, Literal

import numpy as np

from mbridge_seqpack.packing.artifact import (
    ENTRY_SEAL,
    ArtifactError,
    digest_columns,
    entry_digest,
    list_column,
    read_parquet_fingerprint,
    split_paths,
)
from mbridge_seqpack.packing.digests import launch_sha256, verified_sha256

__all__ = [
    "SplitReport",
    "ArtifactReport",
    "inspect_artifact",
    "resolve_files",
    "find_metadata",
    "seal_problems",
    "entry_for",
]


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
    balance: dict[str, Any] | None = None

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
            "balance": self.balance,
            "problems": self.problems,
            "notes": self.notes,
        }


@dataclass
class ArtifactReport:
    """The whole artifact: its fingerprint, each file, and problems that concern no single file."""

    directory: Path
    fingerprint: dict[str, Any]
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
            "fingerprint": self.fingerprint,
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
                f"pack_size={fp.get('pack_size')} pad_seq_to_mult={fp.get('pad_seq_to_mult')} "
                f"algorithm={fp.get('algorithm')} seed={fp.get('seed')}",
                "  seal     ",
                hang=hang,
            )
            lines += wrap(f"input {str(fp.get('input_sha256'))[:12]}", hang)
            lines += wrap(
                f"tokenizer {fp.get('tokenizer')} ({str(fp.get('tokenizer_sha256'))[:12]}, "
                f"eos {fp.get('eos_id')}, vocab {fp.get('vocab_size')})",
                hang,
                hang=hang + "  ",
            )
            lines += wrap(
                f"megatron-bridge {fp.get('megatron_bridge_version')}, plugin {fp.get('plugin_version')}", hang
            )
        for p in self.problems:
            lines += wrap(p, "  PROBLEM: ", hang=" " * 11)
        for s in self.splits:
            seal = "sealed" if s.sealed else "UNSEALED"
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
                b = s.balance
                lines += wrap(
                    f"modeled straggler ratio at DP {b['data_parallel']}, {b['micro_batches']} row(s) per "
                    f"rank per step: {b['as_read']:.4f} as {b['read_by']} reads it, "
                    f"{b['shuffled']:.4f} under a shuffling sampler, {b['megatron_bridge_order']:.4f} "
                    f"for Megatron-Bridge's own rows read the same way; row cost spread {b['row_cost_cv']:.1%}",
                    "    ",
                    hang="      ",
                )
            for n in s.notes:
                lines += wrap(n, "    note: ", hang=" " * 10)
            for p in s.problems:
                lines += wrap(p, "    PROBLEM: ", hang=" " * 13)
        count = len(self.all_problems)
        lines.append("inspect: OK" if self.ok else f"inspect: FAILED ({count} problem(s))")
        return "\n".join(lines)


def resolve_files(target: str | Path) -> list[Path]:
    """The Parquet files a packed path names: a file, or every ``*.parquet``/``*.pq`` of a directory (as
    Megatron-Bridge's packed dataset resolves a directory)."""
    path = Path(target)
    if path.is_dir():
        files = sorted({*path.glob("*.parquet"), *path.glob("*.pq")})
        if not files:
            raise ArtifactError(f"{target}: no .parquet files in this directory; pass a pack directory")
        return files
    if not path.is_file():
        raise ArtifactError(f"{target}: no such file or directory")
    return [path]


def find_metadata(directory: Path) -> tuple[Path | None, list[dict[str, Any]] | None, str | None]:
    """(path, entries, problem) of the ``<N>_metadata.jsonl`` in ``directory``."""
    metas = sorted(directory.glob("*_metadata.jsonl"))
    if not metas:
        return None, None, None
    if len(metas) > 1:
        return None, None, f"{len(metas)} metadata files ({', '.join(m.name for m in metas)}): packs are mixed"
    try:
        entries = json.loads(metas[0].read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return metas[0], None, f"{metas[0].name}: unreadable metadata ({exc})"
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return metas[0], None, f"{metas[0].name}: metadata must be a JSON list of objects"
    return metas[0], entries, None


REPACK = "re-run mbridge-seqpack pack"
SPLIT_NAMES = ("training", "validation", "test")


def entry_for(entries: list[dict[str, Any]] | None, info: dict[str, Any]) -> dict[str, Any] | None:
    """The metadata entry of the split a sealed file says it holds."""
    return next((e for e in reversed(entries or []) if e.get("split") == info.get("split")), None)  # last wins


def lost_fingerprint_problem(path: Path, meta: Path | None, entries: list[dict[str, Any]] | None) -> str | None:
    """A file without a fingerprint where the metadata beside it seals a file of that very name: its footer was
    damaged (a byte flip in the fingerprint's key), not written by another tool, so it must not pass as unsealed."""
    for entry in entries or []:
        if not isinstance(entry, dict) or not entry.get("checksums"):
            continue
        try:
            sealed = split_paths(path.parent, int(entry["pack_size"])).get(str(entry.get("split")))
        except (KeyError, TypeError, ValueError):
            continue
        if sealed is not None and sealed.name == path.name:
            return (
                f"no mbridge_seqpack fingerprint, but {meta.name if meta else 'the metadata'} seals this file: "
                f"it was modified or corrupted - {REPACK}"
            )
    return None


def seal_problems(
    path: Path,
    info: dict[str, Any],
    entry: dict[str, Any] | None,
    meta: Path | None,
    *,
    contents: Literal["verify", "launch", "size"] = "verify",
) -> list[str]:
    """Compare one sealed file with its metadata entry before parsing it: its size always, its sha256 read now
    (``verify``), or remembered from a full read of this very file when there is one (``launch``, O(metadata))."""
    if meta is None:
        return [f"no <N>_metadata.jsonl next to it: the pack is incomplete (interrupted?) - {REPACK}"]
    if entry is None:
        return [f"its split {info.get('split')!r} is not in {meta.name}: stale or mixed files - {REPACK}"]
    if entry.get("fingerprint") != info.get("fingerprint"):
        return [f"fingerprint differs from {meta.name}: the files come from different pack runs - {REPACK}"]
    if entry.get(ENTRY_SEAL) != entry_digest(entry):
        return [
            f"its entry in {meta.name} was edited or is unsealed (Megatron-Bridge sizes cu_seqlens from "
            f"max_samples_per_bin / dataset_max_seqlen / min_packed_seqlen there) - {REPACK}"
        ]
    named = path.name.split("_")[0]
    if named in SPLIT_NAMES and named != info.get("split"):  # a renamed file is fine, a swapped one is not
        return [
            f"the file is named for another split than the {info.get('split')!r} rows it holds (swapped?) - {REPACK}"
        ]
    sums = entry.get("checksums") or {}
    if not isinstance(sums, dict) or "file_sha256" not in sums:
        return [f"{meta.name} has no checksums for it - {REPACK}"]
    size = path.stat().st_size
    if size != sums.get("file_bytes"):
        return [f"file is {size} bytes, the seal says {sums.get('file_bytes')}: truncated or modified - {REPACK}"]
    digest = {"verify": verified_sha256, "launch": launch_sha256}.get(contents)
    if digest is not None and digest(path) != sums["file_sha256"]:
        return [f"sha256 differs from the seal: the file was modified or corrupted - {REPACK}"]
    return []


def _check_rows(
    report: SplitReport,
    columns: dict[str, tuple[np.ndarray, np.ndarray]],
    fp: dict[str, Any],
    stats: dict[str, Any],
    balance: dict[str, Any] | None = None,
    entry: dict[str, Any] | None = None,
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
        wrong = {k: (entry.get(k), v) for k, v in read_by_megatron.items() if entry.get(k) != v}
        if wrong:
            problems.append(
                "metadata disagrees with the rows on what Megatron-Bridge reads: "
                + ", ".join(f"{k}={meta} (rows: {rows})" for k, (meta, rows) in wrong.items())
            )
            return
    report.balance = _balance_report(seg - 1, row_of_seq, len(per_row), balance or {})
    report.tokens = int(runtime.sum())
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
    if not fp:
        return
    pack_size, mult = int(fp["pack_size"]), int(fp["pad_seq_to_mult"])
    report.pack_size = pack_size
    report.row_padding = int(len(per_row) * pack_size - runtime.sum())
    if (runtime > pack_size).any():
        problems.append(f"{int((runtime > pack_size).sum())} row(s) exceed the pack size {pack_size}")
    if mult > 1 and ((seg - 1) % mult).any():
        problems.append(f"{int(((seg - 1) % mult > 0).sum())} sequence(s) not padded to a multiple of {mult}")
    vocab = int(fp.get("vocab_size", 0))
    if vocab and (ids >= vocab).any():
        problems.append(f"{int((ids >= vocab).sum())} token id(s) outside the vocabulary (>= {vocab})")
    kwargs = json.loads(fp.get("dataset_kwargs") or "{}")
    if not kwargs.get("chat") and kwargs.get("add_eos", True):
        closing = ids[ends - 1]
        if (closing != int(fp["eos_id"])).any():
            problems.append(
                f"{int((closing != int(fp['eos_id'])).sum())} sequence(s) do not end in EOS "
                f"({fp['eos_id']}), where the template puts it"
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


def _balance_report(
    lengths: np.ndarray, row_of_seq: np.ndarray, rows: int, recorded: dict[str, Any]
) -> dict[str, Any] | None:
    """The modeled straggler ratio of the rows as the sampler the pack was laid out for reads them (the
    ``batch`` sampler: its first epoch), under a shuffling sampler, and for the rows in the order
    Megatron-Bridge's first-fit-decreasing prep would write them (longest first sequence first), read by the
    same sampler."""
    from mbridge_seqpack.packing.balance import DEFAULT_COST, CostModel, read_order, row_costs, straggler_ratio

    dp, micro = int(recorded.get("data_parallel", 8)), int(recorded.get("micro_batches", 1))
    if rows < dp * micro:
        return None  # not one full step (e.g. a small validation split): nothing to balance
    cost = CostModel(
        float(recorded.get("cost_linear", DEFAULT_COST.linear)),
        float(recorded.get("cost_attention", DEFAULT_COST.attention)),
    )
    costs = row_costs(lengths, row_of_seq, rows, cost)
    longest = np.zeros(rows, dtype=np.int64)
    np.maximum.at(longest, row_of_seq, lengths)
    tokens = np.bincount(row_of_seq, weights=lengths, minlength=rows)
    ffd_order = np.lexsort((-tokens, -longest))
    shuffled = [straggler_ratio(costs[np.random.default_rng(s).permutation(rows)], dp, micro) for s in range(16)]
    sampler, seed = str(recorded.get("sampler", "single")), int(recorded.get("sampler_seed", 0))
    read = read_order(rows, sampler, seed)
    return {
        "data_parallel": dp,
        "micro_batches": micro,
        "read_by": f"the batch sampler (seed {seed}, epoch 0)" if sampler == "batch" else "the sequential sampler",
        "as_read": round(straggler_ratio(costs[read], dp, micro), 6),
        "shuffled": round(float(np.mean(shuffled)), 6),
        "megatron_bridge_order": round(straggler_ratio(costs[ffd_order][read], dp, micro), 6),
        "row_cost_cv": round(float(costs.std() / costs.mean()), 6) if rows else 0.0,
    }


def _inspect_file(path: Path, meta: Path | None, entries: list[dict[str, Any]] | None) -> tuple[SplitReport, dict]:
    import pyarrow.parquet as pq

    name = path.name.split("_")[0] if "_" in path.name else path.stem
    report = SplitReport(name, path)
    try:
        info = read_parquet_fingerprint(path)
    except ArtifactError as exc:
        report.problems.append(str(exc).removeprefix(f"{path}: "))  # already ends in the re-pack advice
        return report, {}
    fp: dict[str, Any] = {}
    entry = entry_for(entries, info) if info is not None else None
    if info is not None:
        report.sealed, report.name, fp = True, str(info.get("split", name)), info["fingerprint"]
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
        sealed_sums = (entry or {}).get("checksums", {}).get("columns", {})
        bad = sorted(k for k, v in digest_columns(columns).items() if sealed_sums.get(k) != v)
        if bad:
            report.problems.append(f"column checksum(s) differ from the seal: {', '.join(bad)} - {REPACK}")
            return report, fp
    _check_rows(report, columns, fp, info.get("stats", {}) if info else {}, (info or {}).get("balance"), entry)
    return report, fp


def inspect_artifact(target: str | Path, *, png: str | Path | None = None) -> ArtifactReport:
    """Verify every file of a packed artifact (a directory or one file) and collect its statistics."""
    files = resolve_files(target)
    directory = files[0].parent
    meta, entries, meta_problem = find_metadata(directory)
    report = ArtifactReport(directory, {}, [])
    if meta_problem:
        report.problems.append(meta_problem)
    fingerprints = []
    for path in files:
        split, fp = _inspect_file(path, meta, entries)
        report.splits.append(split)
        if fp:
            fingerprints.append(fp)
    unique = {json.dumps({k: v for k, v in fp.items() if k != "input_sha256"}, sort_keys=True) for fp in fingerprints}
    if len(unique) > 1:
        report.problems.append(f"{len(unique)} different pack settings among the files: mixed packs in one place")
    names = [s.name for s in report.splits]
    if len(set(names)) < len(names):
        report.problems.append(f"a split appears in more than one file ({', '.join(sorted(names))}): mixed packs")
    if fingerprints:
        report.fingerprint = fingerprints[0]
        listed = {e.get("split") for e in entries or [] if isinstance(e.get("fingerprint"), dict)}
        absent = sorted(listed - set(names)) if Path(target).is_dir() else []
        if absent:
            report.problems.append(f"split(s) {absent} listed in the metadata have no file: incomplete pack")
    if png is not None and report.splits:
        _draw_histogram(report, Path(png))
    return report


def _draw_histogram(report: ArtifactReport, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = [s for s in report.splits if s.sequences_per_row]
    if not splits:
        return
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(len(splits), 1, figsize=(8, 3.2 * len(splits)), squeeze=False)
    for ax, split in zip(axes[:, 0], splits):
        keys = sorted(split.sequences_per_row)
        values = np.repeat(keys, [split.sequences_per_row[k] for k in keys])
        top = keys[-1] + 1
        ax.hist(values, bins=min(40, top), range=(0, top), color="#4C72B0", edgecolor="white")
        ax.set_xlim(0, top * 1.05)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(
            f"{split.name}: {split.rows} rows of {split.pack_size} tokens, efficiency {split.efficiency:.1%}, "
            f"{keys[0]}..{keys[-1]} sequences per row"
        )
        ax.set_xlabel("sequences per packed row")
        ax.set_ylabel("rows")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
