"""``pack --ray``: tokenize and write on a Ray cluster's workers, pack on the driver; the same bytes as one machine.

1. The input JSONL is cut into shards at line boundaries (``shard_bytes`` each). Ray Data maps every shard on a
   worker: the worker checks its records (messages name the input file and its line numbers), tokenizes them with
   Megatron-Bridge's code (``tokenize_split``: the same function, options and batching as a local pack) and
   spills tokens and loss mask next to the output. Only the lengths (8 bytes a sequence) come back.
2. The driver packs and balances the lengths exactly as a local pack does (the sequences are the file's, in the
   file's order: each example is tokenized on its own, so the shard it falls in changes nothing).
3. Ray Data maps the row groups of each split, in consecutive parts, on the workers: each writes its part of the
   Parquet file from the spilled tokens. The driver joins the parts (artifact/parquet_stitch.py: the row groups'
   bytes copied, one footer), reads the file back once for the column checksums and seals it with one metadata
   file. The file is byte-identical to a local pack of the same input (tested on a local cluster).

The output directory must be on storage every node sees (the spilled tokens and parts are written beside it, in
the pack's staging directory, and removed with it). Ray is an optional extra (``pip install
'mbridge-seqpack[ray]'``); this module imports it only when a pack asks for it.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from mbridge_seqpack.artifact.pack_phases import reached
from mbridge_seqpack.artifact.row_tokens import read_segments
from mbridge_seqpack.errors import SeqpackError
from mbridge_seqpack.tokenization.sequences import InputError, SequenceOffsets, max_record_bytes

__all__ = ["RayEngine", "Shard", "ShardJob", "ShardedSequences", "plan_shards", "connect"]

#: how many times a task may fail (its worker killed, out of memory, a node lost) before the pack stops: Ray Data
#: retries a task forever by default (data/_internal/remote_fn.py cached_remote_fn: max_retries=-1), so a shard that
#: kills its worker every time would never stop
TASK_FAILURES = 3
#: sets the tries of a task for ``pack --ray`` (a positive integer)
TASK_FAILURES_ENV = "MBRIDGE_SEQPACK_RAY_TASK_FAILURES"
#: each try of a shard appends a line here (in its spill directory), so the driver can name the shard that failed
ATTEMPTS = "attempts"

#: the default shard: large enough that a worker's Megatron-Bridge start-up (one per worker process, ~40 s) is
#: paid once for many shards, small enough that a few hundred fill a cluster
SHARD_BYTES = 64 << 20


def connect(address: str) -> Any:
    """Join the cluster at ``address`` (``auto``: the one this node belongs to; ``host:port`` or ``ray://...``),
    or start one on this machine (``local``). Returns the ``ray`` module."""
    try:
        import ray
        import ray.data  # noqa: F401  (Ray Data: the ``data`` extra of ray)
    except ImportError as exc:
        raise InputError(
            f"--ray needs Ray Data ({exc}); install it with: pip install 'mbridge-seqpack[ray]'"
        ) from None
    if not ray.is_initialized():
        try:
            if address == "local":
                ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise InputError(
                f"--ray {address}: cannot join the cluster ({str(exc)[:200]}); start it with `ray start --head` "
                "(then --ray auto on a node of it), pass its address, or --ray local"
            ) from None
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the driver's own bar counts bytes and tokens across the workers
    context.execution_options.preserve_order = True
    context.execution_options.verbose_progress = False
    return ray


@dataclass(frozen=True)
class Shard:
    """A byte range of the input, cut at line boundaries; ``first_line`` numbers its first line in the file."""

    index: int
    start: int
    end: int
    first_line: int


def plan_shards(path: Path, shard_bytes: int = SHARD_BYTES) -> list[Shard]:
    """Cut ``path`` after the first newline at or past every ``shard_bytes``; count the lines before each cut (one
    read of the file at disk speed: messages from the workers number lines as the file does)."""
    size = path.stat().st_size
    cuts = [0]
    with open(path, "rb") as handle:
        while cuts[-1] + shard_bytes < size:
            end = _line_end(handle, cuts[-1] + shard_bytes - 1)  # the end of the line holding the byte before the cut
            if end >= size:
                break
            cuts.append(end)
        cuts.append(size)
        shards, line = [], 1
        for index, (start, end) in enumerate(zip(cuts, cuts[1:])):
            shards.append(Shard(index, start, end, line))
            handle.seek(start)
            remaining = end - start
            while remaining:
                block = handle.read(min(remaining, 1 << 24))
                line += block.count(b"\n")
                remaining -= len(block)
    return shards


def _line_end(handle: Any, position: int, block: int = 1 << 20) -> int:
    """The offset just past the newline at or after ``position`` (the file's size without one), read a block at a
    time: a line of any length is never read whole."""
    handle.seek(position)
    while True:
        data = handle.read(block)
        if not data:
            return handle.tell()
        found = data.find(b"\n")
        if found >= 0:
            return position + found + 1
        position += len(data)


@dataclass(frozen=True)
class ShardJob:
    """What every worker needs to tokenize a shard as a local pack would."""

    source: str  # the input file (shared storage), absolute
    tokenizer: str  # the tokenizer directory (shared storage), absolute
    max_seq_length: int
    pad_seq_to_mult: int
    dataset_kwargs: dict[str, Any]
    seed: int
    batched: bool
    spill_root: str
    shown: str = ""  # the input file as the user named it, for messages (default: source)
    tokenizer_config: Any = None  # the recipe's TokenizerConfig (pack --recipe), else Megatron-Bridge's defaults
    record_limit: int | None = None  # the driver's record limit (tokenization/sequences.py max_record_bytes)


_TOKENIZERS: dict[tuple[str, str], Any] = {}  # one Megatron-Bridge tokenizer per worker process, directory, config


def _tokenizer(path: str, config: Any = None) -> Any:
    key = (path, repr(config))
    if key not in _TOKENIZERS:
        from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

        _TOKENIZERS[key] = load_megatron_tokenizer(path, config)
    return _TOKENIZERS[key]


def tokenizer_facts(path: str, config: Any = None) -> tuple[int, int, str]:
    """(EOS id, vocabulary size, sealed settings) of the Megatron-Bridge tokenizer at ``path``, on a worker (the
    driver does not import Megatron-Bridge)."""
    from mbridge_seqpack.tokenization.tokenizer_settings import sealed_settings

    tokenizer = _tokenizer(path, config)
    return int(tokenizer.eos_id), int(tokenizer.vocab_size), sealed_settings(path, config)


def shard_directory(job: ShardJob, index: int) -> Path:
    return Path(job.spill_root) / f"shard_{index:06d}"


def tokenize_shard(row: dict[str, Any], job: ShardJob) -> dict[str, Any]:
    """Ray Data map function (on a worker): check and tokenize one shard, spill it; return its lengths. A refusal
    (a bad record) comes back as data: Ray passes a worker's exception to the driver as text only."""
    shard = Shard(**row)
    try:
        return {**_tokenize_shard(shard, job), "error": ""}
    except SeqpackError as exc:  # a bad record, a spill the disk refused: as data, as write_part's
        return {**_result(shard, 0, b"", 0, 0, ""), "error": str(exc)}


def _result(shard: Shard, records: int, sizes: bytes, cut: int, cut_tokens: int, how: str) -> dict[str, Any]:
    return {
        "index": shard.index,
        "records": records,
        "bytes": shard.end - shard.start,
        "sizes": sizes,
        "truncated_sequences": cut,
        "truncated_tokens": cut_tokens,
        "tokenization": how,
    }


def _tokenize_shard(shard: Shard, job: ShardJob) -> dict[str, Any]:
    from mbridge_seqpack.tokenization.sequences import check_jsonl, tokenize_split

    directory = shard_directory(job, shard.index)
    # not parents=True: the driver made the spill root inside its staging directory; a task that outlives a killed
    # driver, after the next pack removed that directory, must stop here, not re-create it
    try:
        directory.mkdir(exist_ok=True)
    except FileNotFoundError:
        raise InputError(
            f"{job.spill_root}: the pack's staging directory is gone (its driver stopped or was killed); this shard "
            "is not written"
        ) from None
    with open(directory / ATTEMPTS, "a") as attempts:  # before any work: a try killed later is counted
        attempts.write("try\n")
    piece = directory / "input.jsonl"
    with open(job.source, "rb") as source, open(piece, "wb") as out:
        source.seek(shard.start)
        remaining = shard.end - shard.start
        while remaining:
            block = source.read(min(remaining, 1 << 24))
            if not block:
                raise InputError(
                    f"{job.shown or job.source}: shorter than when it was cut into shards (changed?); re-run pack"
                )
            out.write(block)
            remaining -= len(block)
    shown = job.shown or job.source
    records = check_jsonl(
        piece, job.dataset_kwargs, first_line=shard.first_line, shown=shown, shard=True, limit=job.record_limit
    )
    seqs = tokenize_split(
        piece,
        _tokenizer(job.tokenizer, job.tokenizer_config),
        max_seq_length=job.max_seq_length,
        pad_seq_to_mult=job.pad_seq_to_mult,
        dataset_kwargs=job.dataset_kwargs,
        seed=job.seed,
        workers=1,
        progress=False,
        records=records,
        spill_dir=directory / "spill",
        batched=job.batched,
        first_line=shard.first_line,
        shown=shown,
        record_limit=job.record_limit,
    )
    piece.unlink()
    sizes = np.diff(seqs.offsets).astype(np.int64).tobytes()
    return _result(shard, records, sizes, seqs.truncated_sequences, seqs.truncated_tokens, seqs.tokenization)


@dataclass
class ShardedSequences(SequenceOffsets):
    """The tokenized sequences of every shard, in file order: global offsets, tokens read from each shard's spill
    files. Quacks as ``TokenizedSequences`` for the packer; the row writer calls its ``gather``
    (artifact/row_tokens.py)."""

    offsets: np.ndarray  # int64, len n+1: global token offsets
    shard_dirs: list[str]  # each shard's spill directory
    shard_bases: np.ndarray  # int64, len shards+1: each shard's first global token
    truncated_sequences: int = 0
    truncated_tokens: int = 0
    tokenization: str = "per example"

    def gather(self, starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tokens (int64) and loss mask (int8) of the sequences at global token ``starts``, concatenated."""
        starts, sizes = np.asarray(starts, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
        shard_of = np.searchsorted(self.shard_bases, starts, side="right") - 1
        local = starts - self.shard_bases[shard_of]
        positions = np.cumsum(sizes) - sizes
        ids = np.empty(int(sizes.sum()), dtype=np.int64)
        mask = np.empty(ids.size, dtype=np.int8)
        for shard in np.unique(shard_of).tolist():
            mine = shard_of == shard
            for name, out in (("tokens.int64", ids), ("loss_mask.int8", mask)):
                path = Path(self.shard_dirs[shard]) / "spill" / name
                if not read_segments(path, out, positions[mine], local[mine], sizes[mine]):
                    raise InputError(f"{self.shard_dirs[shard]}: spilled tokens end early (truncated); re-run")
        return ids, mask


def write_part(row: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """Ray Data map function (on a worker): write the row groups ``row["first"]:row["end"]`` of the plan's bounds to
    the part file ``row["path"]``."""
    import ray

    from mbridge_seqpack.artifact.store import write_row_groups

    layout, seqs = ray.get(plan["layout"]), ray.get(plan["seqs"])
    bounds = plan["bounds"][row["first"] : row["end"]]
    try:
        write_row_groups(Path(row["path"]), layout, seqs, bounds, plan["info"])
    except SeqpackError as exc:  # a full disk, truncated spill files
        return {"part": row["part"], "rows": 0, "error": str(exc)}
    return {"part": row["part"], "rows": bounds[-1][1] - bounds[0][0], "error": ""}


class RayEngine:
    """Tokenization and row writing on a Ray cluster (``address`` as :func:`connect` takes it): a ``PackEngine``
    (pipeline/engine.py)."""

    def __init__(
        self,
        address: str,
        shard_bytes: int = SHARD_BYTES,
        progress: bool | None = None,
        task_failures: int | None = None,
    ) -> None:
        if not isinstance(shard_bytes, int) or shard_bytes < 1:
            raise InputError(f"--ray-shard-mb must be positive, got {shard_bytes!r}")
        if task_failures is None:
            text = os.environ.get(TASK_FAILURES_ENV, "")
            given: Any = int(text) if text.isdigit() else text  # the text itself where it is not a count
            task_failures = given if text else TASK_FAILURES
        if not isinstance(task_failures, int) or isinstance(task_failures, bool) or task_failures < 1:
            raise InputError(f"{TASK_FAILURES_ENV} must be a positive integer, got {task_failures!r}")
        self.address, self.shard_bytes, self.progress = address, shard_bytes, progress
        self.task_failures = task_failures  # a task's tries: Ray retries it task_failures - 1 times
        self.ray: Any = None

    def start(self) -> None:
        self.ray = connect(self.address)

    def check_inputs(self, inputs: Mapping[str, str | Path], dataset_kwargs: dict[str, Any]) -> None:
        """Nothing: each worker checks its own shards (the driver would read every record once more)."""

    def tokenizer_facts(self, tokenizer: str | Path, config: Any = None) -> tuple[int, int, str]:
        """(EOS id, vocabulary size, sealed settings) of the tokenizer, loaded by a worker (which keeps it for its
        shards); joins the cluster first (the driver needs no Megatron-Bridge)."""
        if self.ray is None:
            self.start()
        task = self.ray.remote(num_cpus=1, max_retries=self.task_failures - 1)(tokenizer_facts)
        try:
            return tuple(  # type: ignore[return-value]
                self.ray.get(task.remote(str(Path(tokenizer).absolute()), config))
            )
        except self.ray.exceptions.RayError as exc:
            last = [line for line in str(exc).splitlines() if line.strip()][-1:] or [type(exc).__name__]
            raise InputError(
                f"--ray: the tokenizer {tokenizer} cannot be loaded on a worker ({last[0][:200]})"
            ) from None

    def _bar(self, **kwargs: Any) -> Any:
        from mbridge_seqpack.textout import progress_bar

        return progress_bar(enabled=self.progress, **kwargs)

    def tokenize(
        self,
        source: str | Path,
        tokenizer: str | Path,
        spill: Path,
        *,
        max_seq_length: int,
        pad_seq_to_mult: int,
        dataset_kwargs: dict[str, Any],
        seed: int,
        batched: bool = True,
        tokenizer_config: Any = None,
    ) -> ShardedSequences:
        """Tokenize ``source`` shard by shard on the workers, as ``tokenize_split`` with these options; the lengths
        come back, the tokens stay spilled under ``spill`` (paths made absolute for the workers)."""
        job = ShardJob(
            source=str(Path(source).absolute()),
            tokenizer=str(Path(tokenizer).absolute()),
            max_seq_length=max_seq_length,
            pad_seq_to_mult=pad_seq_to_mult,
            dataset_kwargs=dataset_kwargs,
            seed=seed,
            batched=batched,
            spill_root=str(Path(spill).absolute()),
            shown=str(source),
            tokenizer_config=tokenizer_config,
            record_limit=max_record_bytes(),
        )
        ray = self.ray
        source = Path(job.source)
        Path(job.spill_root).mkdir(parents=True, exist_ok=True)
        shards = plan_shards(source, self.shard_bytes)
        dataset = ray.data.from_items([asdict(shard) for shard in shards], override_num_blocks=len(shards))
        mapped = _map(dataset, tokenize_shard, {"job": job}, self.task_failures)
        results: dict[int, dict[str, Any]] = {}
        begin, tokens = time.perf_counter(), 0
        failed = _FailedShard(job, shards, results, self.task_failures)
        with self._bar(
            total=source.stat().st_size, unit="B", unit_scale=True, desc=f"tokenize {source.name} (ray)"
        ) as bar:
            for row in _iterate(mapped, failed):  # in shard order: the first refusal is the one a local pack gives
                if not results:
                    reached("tokenizing")  # the first shard is back, the others in flight
                results[row["index"]] = row
                tokens += int(np.frombuffer(row["sizes"], dtype=np.int64).sum())
                bar.update(row["bytes"])
                bar.set_postfix_str(
                    f"{len(results)}/{len(shards)} shards, "
                    f"{tokens / max(time.perf_counter() - begin, 1e-9):,.0f} tokens/s"
                )
        ordered = [results[shard.index] for shard in shards]
        if sum(row["records"] for row in ordered) == 0:
            raise InputError(f"{job.shown}: no records; pass a JSONL file with one example per line")
        sizes = [np.frombuffer(row["sizes"], dtype=np.int64) for row in ordered]
        offsets = np.zeros(sum(s.size for s in sizes) + 1, dtype=np.int64)
        np.cumsum(np.concatenate(sizes), out=offsets[1:])
        bases = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum([int(s.sum()) for s in sizes], out=bases[1:])
        how = next((row["tokenization"] for row in ordered if row["records"]), "per example")
        return ShardedSequences(
            offsets,
            [str(shard_directory(job, shard.index)) for shard in shards],
            bases,
            sum(row["truncated_sequences"] for row in ordered),
            sum(row["truncated_tokens"] for row in ordered),
            how,
        )

    def write_split(
        self, path: Path, seqs: ShardedSequences, bins: np.ndarray, info: dict[str, Any]
    ) -> dict[str, Any]:
        """Write one split's file from the workers, a part per worker (in ``.parts-<split>`` beside it, in the
        staging directory), joined into one file and sealed."""
        from mbridge_seqpack.artifact.parquet_stitch import stitch_parquet
        from mbridge_seqpack.artifact.store import ColumnDigests, RowSources, row_group_bounds, sealed_checksums

        ray = self.ray
        layout = RowSources.of(seqs, bins)
        bounds = row_group_bounds(layout)
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        cuts = _balanced_cuts(layout, bounds, min(cpus, len(bounds)))
        work = path.parent / f".parts-{info['split']}"
        work.mkdir(parents=True, exist_ok=True)
        parts = [
            {"part": k, "first": a, "end": b, "path": str(work / f"part_{k:05d}.parquet")}
            for k, (a, b) in enumerate(zip(cuts, cuts[1:]))
        ]
        plan = {"layout": ray.put(layout), "seqs": ray.put(seqs), "bounds": bounds, "info": info}
        mapped = _map(
            ray.data.from_items(parts, override_num_blocks=len(parts)), write_part, {"plan": plan}, self.task_failures
        )
        with self._bar(total=layout.num_rows, unit="row", desc=f"write {path.name} (ray)") as bar:
            for row in _iterate(mapped):
                reached("writing")  # parts written, others in flight
                bar.update(row["rows"])
        stitch_parquet([Path(part["path"]) for part in parts], path)
        shutil.rmtree(work, ignore_errors=True)
        digests = ColumnDigests(layout)
        digests.update_from_file(path)
        return sealed_checksums(path, digests)


def _balanced_cuts(layout: Any, bounds: list[tuple[int, int]], parts: int) -> list[int]:
    """Indexes into ``bounds`` cutting it into ``parts`` consecutive runs of about equal tokens."""
    ends = layout.token_offsets[[end for _, end in bounds]]
    targets = ends[-1] * np.arange(1, parts) / parts
    inner = np.searchsorted(ends, targets, side="left") + 1
    return sorted({0, *np.clip(inner, 1, len(bounds) - 1).tolist(), len(bounds)}) if parts > 1 else [0, len(bounds)]


def _map(dataset: Any, fn: Any, fn_kwargs: dict[str, Any], tries: int) -> Any:
    """``dataset.map(fn)`` on one CPU a task, each task tried at most ``tries`` times. Ray Data's own default retries
    a task forever; ``max_retries`` is still a Ray remote argument there (Ray 2.60 warns it will need another
    spelling in 2.64: its named parameters have none yet)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        return dataset.map(fn, fn_kwargs=fn_kwargs, num_cpus=1, max_retries=tries - 1)


@dataclass
class _FailedShard:
    """Which shard a failed tokenizing map was on: the one not back whose tries (its ``attempts`` file) are the
    most."""

    job: ShardJob
    shards: list[Shard]
    results: dict[int, Any]
    tries: int

    def __call__(self) -> str:
        def tried(shard: Shard) -> int:
            try:
                return (shard_directory(self.job, shard.index) / ATTEMPTS).read_text().count("\n")
            except OSError:
                return 0

        pending = [shard for shard in self.shards if shard.index not in self.results]
        if not pending:
            return "a task"
        shard = max(pending, key=tried)
        return (
            f"shard {shard.index} of {self.job.shown or self.job.source} (bytes {shard.start}-{shard.end}, from line "
            f"{shard.first_line}), tried {tried(shard)} time(s) of {self.tries},"
        )


def _iterate(mapped: Any, failed: Any = None) -> Any:
    """The rows of a Ray Data map as they finish; a worker's refusal (its row's ``error``) is raised here, and a task
    that failed its every try (its worker killed, out of memory) stops the pack in one line, naming the shard
    (``failed()``) and the last error."""
    import ray

    try:
        for row in mapped.iter_rows():
            if row["error"]:
                raise InputError(row["error"])
            yield row
    except ray.exceptions.RayError as exc:
        last = [line for line in str(exc).splitlines() if line.strip()][-1:] or [type(exc).__name__]
        where = failed() if failed is not None else "a worker task"
        raise InputError(
            f"--ray: {where} failed ({type(exc).__name__}: {last[0][:200]}); nothing was written; see the Ray logs "
            "of the cluster (`ray logs`), then re-run pack"
        ) from None
