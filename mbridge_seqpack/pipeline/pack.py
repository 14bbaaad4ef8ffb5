"""``pack``: JSONL splits -> Megatron-Bridge's tokenization -> bins -> one sealed artifact directory."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mbridge_seqpack.artifact.pack_entry import PackEntry, split_entry
from mbridge_seqpack.artifact.pack_phases import reached
from mbridge_seqpack.artifact.seal_key import seal_key
from mbridge_seqpack.artifact.store import (
    ArtifactError,
    Fingerprint,
    metadata_path,
    split_paths,
    staged_directory,
    write_metadata,
)
from mbridge_seqpack.digests import FileStamp, verified_sha256
from mbridge_seqpack.pipeline.engine import LocalEngine, PackEngine
from mbridge_seqpack.placement.cost import DEFAULT_COST, CostModel
from mbridge_seqpack.placement.layout import StepShape
from mbridge_seqpack.placement.rows import RowRequest, place_rows
from mbridge_seqpack.placement.sampler import SAMPLERS
from mbridge_seqpack.tokenization.sequences import (
    InputError,
    check_chat_template,
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
    # work balance (placement/): equal-cost rows, laid out for `data_parallel` ranks reading
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
        if self.overflow == "drop" and not (self.dataset_kwargs or {}).get("chat"):
            # GPTSFTDataset._multiple_truncation cuts every prompt/answer example to max_seq_length, so none is ever
            # longer: the flag would be accepted and do nothing
            raise InputError(
                "--overflow drop acts on chat records only (--chat, or a recipe's ChatSFTPreprocessingConfig): "
                "Megatron-Bridge's prep truncates prompt/answer records to --max-seq-length, so none is longer and "
                "none is dropped; leave --overflow out"
            )
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

    def row_request(self, max_seq_length: int) -> RowRequest:
        """What placement is asked for (placement/rows.py)."""
        shape = StepShape(
            self.pack_size, self.cost, self.data_parallel, self.micro_batches, self.max_sequences_per_row
        )
        return RowRequest(shape, max_seq_length, self.seed, self.overflow, self.sampler, self.sampler_seed)


#: the largest row a pack accepts: a bound against a mistyped size, far above any trainable row (32M tokens)
MAX_PACK_SIZE = 1 << 25


@dataclass(frozen=True)
class PackResult:
    """What was written, and how well each split packed."""

    directory: Path
    metadata: Path
    splits: dict[str, PackEntry]  # the metadata entry of each split, as sealed


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
    engine: PackEngine | None = None,
    tokenizer_config: Any = None,
    seal_key_file: str | Path | None = None,
) -> PackResult:
    """Pack each split (``{"training": path, "validation": path}``) into ``output_dir``, sealed.

    Inputs and options are checked before Megatron-Bridge is imported; tokenization is Megatron-Bridge's own (prompt
    template pieces encoded a chunk per call, ``batched``: tokenization/batched_tokens.py).
    Memory is bounded by the number of sequences, not of tokens: the tokens are spilled to a file inside the
    staging directory (on the output's disk) and written back one row group at a time.
    ``engine`` checks the records, tokenizes and writes (pipeline/engine.py): by default this machine's, with
    ``workers`` processes and ``lines_per_chunk``; with ``pack --ray`` (pipeline/ray_engine.py) the workers of a Ray
    cluster, the driver packs; the files are the same bytes. ``tokenizer_config``: the recipe's ``TokenizerConfig``
    (``pack --recipe``), built over ``tokenizer`` as the launch builds it; without one Megatron-Bridge's defaults for a
    Hugging Face directory. What the build reads of it is sealed (fingerprint ``tokenizer_settings``). The
    metadata is also keyed (HMAC-SHA256, artifact/seal_key.py) with the key in ``seal_key_file``, else the one
    ``$MBRIDGE_SEQPACK_SEAL_KEY_FILE`` / ``$MBRIDGE_SEQPACK_SEAL_KEY`` hold, when there is one.
    """
    from mbridge_seqpack import __version__

    # the walk of the data (scripts/pack_walk.py) goes down once: what this function decides, the inputs
    # (tokenization, the tokenizer's seal), the output (artifact), tokenization, placement, the artifact's files
    options.validate()
    if "training" not in inputs:
        raise InputError("pack needs a training split (the INPUT argument)")
    unknown = set(inputs) - {"training", "validation"}
    if unknown:
        raise InputError(f"unknown split(s) {sorted(unknown)}; use 'training' and 'validation'")
    kwargs = dict(options.dataset_kwargs or {})
    max_seq_length = options.max_seq_length or options.pack_size
    rows = options.row_request(max_seq_length)
    versions = {"plugin_version": __version__, "megatron_bridge_version": _megatron_bridge_version()}
    engine = engine or LocalEngine(workers, lines_per_chunk)  # its kind is never asked again
    # before the ~40 s Megatron import: the inputs, the tokenizer's files, the output
    engine.check_inputs(inputs, kwargs)
    check_chat_template(tokenizer, kwargs)
    tok_sha = tokenizer_files_sha256(tokenizer, verified_sha256)  # the seal of the tokenizer, remembered as a hint
    out = Path(output_dir)
    entries: list[PackEntry] = []
    # the output is checked first (store.check_output), then staged under its lock; removed again if the
    # tokenizer cannot load
    key = seal_key(seal_key_file)  # before the output is staged and the tokenizer loads: a bad key is the user's
    with staged_directory(out, overwrite=overwrite) as staging:
        reached("staging")
        eos_id, vocab_size, settings = engine.tokenizer_facts(tokenizer, tokenizer_config)
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
                tokenizer_settings=settings,
                **versions,
            )
            spill = staging / f".tokens-{split}"  # removed before the staging directory is committed
            seqs = None
            try:
                seqs = engine.tokenize(
                    source,
                    tokenizer,
                    spill,
                    max_seq_length=max_seq_length,
                    pad_seq_to_mult=options.pad_seq_to_mult,
                    dataset_kwargs=kwargs,
                    seed=options.seed,
                    batched=batched,
                    tokenizer_config=tokenizer_config,
                )
                placed = place_rows(
                    seqs.lengths,
                    rows,
                    balance=split == "training" and bool(options.balance or options.max_sequences_per_row),
                    source=source,
                )
                bins = placed.bins
                entry = split_entry(split, seqs, placed, fingerprint.to_dict(), options.overflow)
                target = split_paths(staging, options.pack_size)[split]
                checksums = engine.write_split(target, seqs, bins, dict(entry))  # the entry in the file's schema
                # what a check compares an explicit pack with: in the sealed entry, not in the rows' file (the same
                # input packs into the same Parquet bytes wherever it lies)
                entries.append(
                    replace(PackEntry.from_json(entry), input_path=str(Path(source).resolve()), checksums=checksums)
                )
            finally:
                seqs = None  # release the memory maps before their files go
                shutil.rmtree(spill, ignore_errors=True)
        write_metadata(metadata_path(staging, options.pack_size), entries, key)
    return PackResult(out, metadata_path(out, options.pack_size), {str(e.split): e for e in entries})


__all__ += ["ArtifactError"]
