"""``pack``: JSONL splits -> Megatron-Bridge's tokenization -> bins -> one sealed artifact directory."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mbridge_seqpack.packing.artifact import (
    ArtifactError,
    Fingerprint,
    check_output,
    metadata_path,
    split_paths,
    staged_directory,
    write_metadata,
    write_split,
)
from mbridge_seqpack.packing.balance import (
    DEFAULT_COST,
    SAMPLERS,
    BalanceRecord,
    CostModel,
    StepShape,
    balance_bins,
    file_layout,
    read_order,
    read_order_digest,
    row_costs,
    straggler_ratio,
)
from mbridge_seqpack.packing.digests import FileStamp, verified_sha256
from mbridge_seqpack.packing.level import level_steps
from mbridge_seqpack.packing.packer import pack_lengths, packing_stats
from mbridge_seqpack.packing.phases import reached
from mbridge_seqpack.packing.ray_engine import RayEngine
from mbridge_seqpack.packing.sequences import (
    InputError,
    check_jsonl,
    load_megatron_tokenizer,
    tokenize_split,
    tokenizer_files_sha256,
)

__all__ = ["PackResult", "pack_jsonl", "PackOptions"]

ALGORITHM = "best_fit_decreasing"


@dataclass(frozen=True)
class PackOptions:
    """What shapes the pack, with Megatron-Bridge's names (``PackedSequenceSpecs`` and ``dataset_kwargs``)."""

    pack_size: int
    pad_seq_to_mult: int = 1
    max_seq_length: int | None = None  # Megatron-Bridge: max_single_sequence_length or seq_length
    dataset_kwargs: dict[str, Any] | None = None
    seed: int = 0
    # work balance (packing/balance.py): equal-cost rows, laid out for `data_parallel` ranks reading
    # `micro_batches` rows each per step (global batch / DP with micro batch 1)
    balance: bool = True
    data_parallel: int = 8
    micro_batches: int = 1
    cost: CostModel = DEFAULT_COST
    max_sequences_per_row: int | None = None  # static cu_seqlens capacity under CUDA graphs; may add rows
    # the sampler that will read the pack (dataset.dataloader_type) and its seed (dataset.seed): Megatron-Bridge's
    # GPTSFTDatasetConfig defaults, "batch" and 1234
    sampler: str = "batch"
    sampler_seed: int = 1234
    # a sequence longer than max_seq_length (chat records are not truncated): refuse, or drop it as Megatron-Bridge's
    # prep does (data/packing/algorithms.py create_hist skips it), counting it in the metadata
    overflow: str = "error"

    def validate(self) -> None:
        if self.max_sequences_per_row is not None and (
            not isinstance(self.max_sequences_per_row, int) or self.max_sequences_per_row < 1
        ):
            raise InputError(f"--max-sequences-per-row must be a positive integer, got {self.max_sequences_per_row!r}")
        for name in ("pack_size", "pad_seq_to_mult", "data_parallel", "micro_batches"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.overflow not in ("error", "drop"):
            raise InputError(f"--overflow must be 'error' or 'drop', got {self.overflow!r}")
        if self.sampler not in SAMPLERS:
            raise InputError(f"--sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if not isinstance(self.sampler_seed, int) or isinstance(self.sampler_seed, bool) or self.sampler_seed < 0:
            raise InputError(f"--sampler-seed must be a non-negative integer, got {self.sampler_seed!r}")
        if self.pad_seq_to_mult > self.pack_size:  # Megatron-Bridge's tokenize_dataset raises the same
            raise InputError(f"--pad-seq-to-mult {self.pad_seq_to_mult} must be at most --pack-size {self.pack_size}")
        # a pack size that is not a multiple is fine: Megatron-Bridge pads sequences to at most the largest
        # multiple below it (data/packing/offline.py tokenize_dataset, max_runtime_pad_cap), and so does the pack
        if self.pack_size > MAX_PACK_SIZE:
            raise InputError(
                f"--pack-size {self.pack_size} is beyond {MAX_PACK_SIZE} tokens per row, more than any row fits "
                "in GPU memory; use the training seq_length"
            )
        if self.max_seq_length is not None and not 0 < self.max_seq_length <= self.pack_size:
            raise InputError(f"--max-seq-length {self.max_seq_length} must be in 1..--pack-size ({self.pack_size})")


#: the largest row a pack accepts: a bound against a mistyped size, far above any trainable row (32M tokens)
MAX_PACK_SIZE = 1 << 25


@dataclass(frozen=True)
class PackResult:
    """What was written, and how well each split packed."""

    directory: Path
    metadata: Path
    splits: dict[str, dict[str, Any]]


def _pack_or_drop(lengths: np.ndarray, max_seq_length: int, options: PackOptions, source: Any) -> np.ndarray:
    """Bins for every sequence; one longer than ``max_seq_length`` is refused or, with ``overflow="drop"``,
    left out (bin -1) exactly where Megatron-Bridge's ``create_hist`` skips it."""
    too_long = lengths > max_seq_length
    if too_long.any() and options.overflow == "error":
        raise InputError(
            f"{source}: {int(too_long.sum())} sequence(s) longer than {max_seq_length} tokens (the longest "
            f"{int(lengths.max())}; chat records are not truncated). Megatron-Bridge's prep drops them: pass "
            "--overflow drop to do the same (counted in the metadata), or raise --pack-size / --max-seq-length"
        )
    capped = np.where(too_long, options.pack_size + 1, lengths) if too_long.any() else lengths
    return pack_lengths(capped, options.pack_size, seed=options.seed, overflow="drop")


def _split_entry(name: str, seqs: Any, bins: np.ndarray, pack_size: int, fingerprint: Fingerprint) -> dict[str, Any]:
    lengths = seqs.lengths
    stats = packing_stats(lengths, bins, pack_size)
    placed = bins >= 0
    return {
        "split": name,
        # the keys Megatron-Bridge's GPTSFTPackedDataset reads for pad_cu_seqlens
        "dataset_max_seqlen": int(lengths[placed].max()),
        "max_samples_per_bin": stats.max_sequences_per_bin,
        "min_packed_seqlen": stats.min_bin_tokens,
        "pack_size": pack_size,
        "packing_factor": round(int(placed.sum()) / stats.num_bins, 2),
        "packing_efficiency": round(stats.efficiency * 100, 2),
        "num_rows": stats.num_bins,
        "stats": stats.to_dict(),
        "fingerprint": fingerprint.to_dict(),
    }


def _balanced(lengths: np.ndarray, bins: np.ndarray, options: PackOptions) -> tuple[np.ndarray, BalanceRecord]:
    """Equal-cost rows, leveled step by step for the DP ranks and written where the sampler reads them in the
    order that balances them (its first epoch, for the shuffling ``batch`` sampler); bins renumbered to the
    file order."""
    dp, micro = options.data_parallel, options.micro_batches
    before = row_costs(lengths, bins, int(bins.max()) + 1, options.cost)
    result = balance_bins(
        lengths, bins, options.pack_size, options.cost, seed=options.seed, max_per_bin=options.max_sequences_per_row
    )
    shape = StepShape(options.pack_size, options.cost, dp, micro, options.max_sequences_per_row)
    leveled, order = level_steps(lengths, result.bins, result.num_bins, shape, seed=options.seed)
    costs = row_costs(lengths, leveled, result.num_bins, options.cost)
    layout = file_layout(order, options.sampler, options.sampler_seed)  # the sampler reads `order` (epoch 0)
    position = np.empty_like(layout)
    position[layout] = np.arange(layout.size)
    placed = leveled >= 0
    out = np.where(placed, position[np.where(placed, leveled, 0)], -1)
    ratio = later = None
    if costs.size >= dp * micro:
        in_file = costs[layout]
        later_ratios = [
            straggler_ratio(in_file[read_order(layout.size, options.sampler, options.sampler_seed, epoch)], dp, micro)
            for epoch in range(1, 5)
        ]
        ratio = round(straggler_ratio(costs[order], dp, micro), 6)  # as read in epoch 0
        later = round(float(np.mean(later_ratios)), 6)
    record = BalanceRecord(
        data_parallel=dp,
        micro_batches=micro,
        cost_linear=options.cost.linear,
        cost_attention=options.cost.attention,
        row_cost_cv_before=round(float(before.std() / before.mean()), 6),
        row_cost_cv=round(float(costs.std() / costs.mean()), 6),
        sampler=options.sampler,
        sampler_seed=options.sampler_seed,
        read_order_sha256=read_order_digest(layout.size, options.sampler, options.sampler_seed),
        rows_rebalanced=result.balanced,
        max_sequences_per_row=options.max_sequences_per_row,
        extra_rows_for_cap=result.extra_bins,
        straggler_ratio=ratio,
        straggler_ratio_later_epochs=later,
    )
    return out, record


def _all_cores() -> int:
    """Cores this process may use. (Megatron-Bridge's ``num_tokenizer_workers=-1`` means one process: its
    ``_materialize_dataset_items`` runs serially for any value <= 1.)"""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _megatron_bridge_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-bridge")
    except PackageNotFoundError:
        return "unknown"


def pack_jsonl(
    inputs: dict[str, str | Path],
    *,
    tokenizer: str | Path,
    output_dir: str | Path,
    options: PackOptions,
    overwrite: bool = False,
    workers: int | None = None,
    lines_per_chunk: int = 50_000,
    batched: bool = True,
    engine: RayEngine | None = None,
) -> PackResult:
    """Pack each split (``{"training": path, "validation": path}``) into ``output_dir``, sealed.

    Inputs and options are checked before Megatron-Bridge is imported; tokenization is Megatron-Bridge's own (prompt
    template pieces encoded a chunk per call, ``batched``: packing/batched_tokens.py).
    Memory is bounded by the number of sequences, not of tokens: the tokens are spilled to a file inside the
    staging directory (on the output's disk) and written back one row group at a time.
    With ``engine`` (``pack --ray``: packing/ray_engine.py) the workers of a Ray cluster check, tokenize and write,
    the driver packs; the files are the same bytes.
    """
    from mbridge_seqpack import __version__

    options.validate()
    if "training" not in inputs:
        raise InputError("pack needs a training split (the INPUT argument)")
    unknown = set(inputs) - {"training", "validation"}
    if unknown:
        raise InputError(f"unknown split(s) {sorted(unknown)}; use 'training' and 'validation'")
    kwargs = dict(options.dataset_kwargs or {})
    # a cluster's workers check their own shards (the driver would read every record once more)
    records = {split: check_jsonl(source, kwargs) for split, source in inputs.items()} if engine is None else {}
    tok_sha = tokenizer_files_sha256(tokenizer, verified_sha256)  # the seal of the tokenizer, remembered as a hint
    check_output(Path(output_dir), overwrite=overwrite)  # before the ~40 s Megatron import
    if engine is not None:  # the driver needs no Megatron-Bridge: a worker loads the tokenizer and says its ids
        engine.start()
        eos_id, vocab_size = engine.tokenizer_facts(tokenizer)
    else:
        mb_tokenizer = load_megatron_tokenizer(tokenizer)
        eos_id, vocab_size = int(mb_tokenizer.eos_id), int(mb_tokenizer.vocab_size)
    max_seq_length = options.max_seq_length or options.pack_size
    out = Path(output_dir)
    entries = []
    with staged_directory(out, overwrite=overwrite) as staging:
        reached("staging")
        for split, source in inputs.items():
            input_stamp = FileStamp.of(source)
            fingerprint = Fingerprint(
                input_sha256=verified_sha256(source),
                input_bytes=input_stamp.size,
                tokenizer=str(tokenizer),
                tokenizer_sha256=tok_sha,
                eos_id=eos_id,
                vocab_size=vocab_size,
                dataset_kwargs=json.dumps(kwargs, sort_keys=True, default=str),
                max_seq_length=max_seq_length,
                pack_size=options.pack_size,
                pad_seq_to_mult=options.pad_seq_to_mult,
                algorithm=ALGORITHM + ("+balanced" if options.balance else ""),
                seed=options.seed,
                plugin_version=__version__,
                megatron_bridge_version=_megatron_bridge_version(),
            )
            spill = staging / f".tokens-{split}"  # removed before the staging directory is committed
            seqs = None
            try:
                same_for_both = dict(  # the options a local and a cluster tokenization share
                    max_seq_length=max_seq_length,
                    pad_seq_to_mult=options.pad_seq_to_mult,
                    dataset_kwargs=kwargs,
                    seed=options.seed,
                    batched=batched,
                )
                if engine is not None:
                    seqs = engine.tokenize(source, tokenizer, spill, **same_for_both)
                else:
                    seqs = tokenize_split(
                        source,
                        mb_tokenizer,
                        workers=_all_cores() if workers is None else workers,
                        lines_per_chunk=lines_per_chunk,
                        records=records[split],
                        spill_dir=spill,
                        **same_for_both,
                    )
                bins = _pack_or_drop(seqs.lengths, max_seq_length, options, source)
                balance = None
                if split == "training" and (options.balance or options.max_sequences_per_row) and bins.size:
                    bins, balance = _balanced(seqs.lengths, bins, options)
                entry = _split_entry(split, seqs, bins, options.pack_size, fingerprint)
                entry["dropped_sequences"] = int((bins < 0).sum())
                entry["overflow"] = options.overflow  # what a sequence longer than max_seq_length met
                entry["truncated_sequences"] = seqs.truncated_sequences  # shortened by Megatron-Bridge's prep
                entry["truncated_tokens"] = seqs.truncated_tokens
                entry["tokenization"] = seqs.tokenization
                if balance is not None:
                    entry["balance"] = balance.to_dict()
                target, info = split_paths(staging, options.pack_size)[split], dict(entry)
                if engine is not None:
                    entry["checksums"] = engine.write_split(target, seqs, bins, info, staging / f".parts-{split}")
                else:
                    entry["checksums"] = write_split(target, seqs, bins, info)
            finally:
                seqs = None  # release the memory maps before their files go
                shutil.rmtree(spill, ignore_errors=True)
            entries.append(entry)
        write_metadata(metadata_path(staging, options.pack_size), entries)
    return PackResult(out, metadata_path(out, options.pack_size), {e["split"]: e for e in entries})


__all__ += ["ArtifactError"]
