"""The observations a behaviour record is made of: each a named call of one Megatron-Bridge function on fixed
inputs, returning plain JSON. They run inside the recording subprocess (``_run.py``), where ``megatron.bridge`` is the
checkout under test; nothing here imports Megatron at module level.

A function the version does not have (its module or attribute missing) makes the observation ``absent``; an input
the version cannot build makes it ``not_run``; an exception of the function itself is a behaviour and is recorded
as its value (``{"raised": "Type: message"}``). Bump :data:`VERSION` when an observation's inputs change: records of
different versions are not compared value by value.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

__all__ = ["VERSION", "Observation", "OBSERVATIONS", "Absent", "NotRun", "plain", "find", "names"]

#: the observation set's version: the inputs and what is recorded of each
VERSION = 2

#: the synthetic packed rows (each a list of sequences, token ids; ``E`` is replaced by the tokenizer's EOS) and
#: their loss masks: rows of different fill, one nearly full, the last short (its tail is padding)
E = -1
ROWS = (
    ((11, 12, 13, 14, E), (21, 22, E)),
    ((31, 32, 33, 34, 35, 36, E), (41, 42, 43, 44, 45, 46, 47, E)),
    ((51, 52, E),),
)
PROMPT = 2  # the first tokens of each sequence are prompt (loss mask 0), the rest answer (1)
WIDTH = 20  # the pack size (max_seq_length) of the synthetic rows
CORPUS_ROWS = 48  # the prep packs the first rows of the embedded corpus
PREP_PACK = 2048


class Absent(Exception):
    """The checkout has no such function (an ImportError or AttributeError looking it up)."""


class NotRun(Exception):
    """The checkout has the function but the observation's inputs cannot be built for it."""


@dataclass(frozen=True)
class Observation:
    name: str
    function: str  # what is called, as Megatron-Bridge names it (module:qualname, first candidate)
    inputs: str  # the fixed inputs, in words
    run: Callable[["Context"], Any]


#: every ``module:qualname`` :func:`find` found in this run: where this checkout keeps what an observation's
#: ``function`` names by its 0.6.2 home (the record keeps it as ``megatron_bridge.resolved``)
RESOLVED: set[str] = set()


def find(*candidates: str) -> Any:
    """The first ``module:qualname`` that exists in this checkout (layouts moved between releases); failing all,
    the module of this checkout's ``megatron/bridge`` tree that defines the name at its top level
    (:func:`_defined_in`): a function is observed wherever the commit keeps it."""
    why = []
    at_home = False  # a candidate's module is in this tree but does not import: the function is there, unusable
    for candidate in candidates:
        try:
            obj = _resolve(candidate)
            RESOLVED.add(candidate)
            return obj
        except (ImportError, AttributeError) as exc:
            why.append(f"{candidate}: {type(exc).__name__}: {exc}")
            at_home = at_home or (isinstance(exc, ImportError) and _in_tree(candidate.partition(":")[0]))
    if at_home:  # never another function of the same name elsewhere (diffusion's get_batch is not the step's)
        raise Absent("; ".join(why))
    qualname = candidates[0].partition(":")[2]
    for module_name in _defined_in(qualname.split(".")[0]):
        try:
            obj = _resolve(f"{module_name}:{qualname}")
        except (ImportError, AttributeError) as exc:
            why.append(f"{module_name}:{qualname}: {type(exc).__name__}: {exc}")
            continue
        RESOLVED.add(f"{module_name}:{qualname}")
        return obj
    raise Absent("; ".join(why))


def _resolve(candidate: str) -> Any:
    module_name, _, qualname = candidate.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


_SOURCES: dict[str, str] = {}


def _in_tree(module_name: str) -> bool:
    """Whether this checkout has the module's source (``a/b.py`` or ``a/b/__init__.py`` under its ``src``)."""
    import megatron.bridge

    src = Path(megatron.bridge.__file__).resolve().parents[2]
    path = src.joinpath(*module_name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _defined_in(name: str) -> list[str]:
    """The modules of this checkout's ``megatron.bridge`` that define ``name`` (``def``/``class`` at column 0), in
    path order; the tree's sources are read once per record."""
    import re

    import megatron.bridge

    root = Path(megatron.bridge.__file__).resolve().parent
    if not _SOURCES:
        for path in sorted(root.rglob("*.py")):
            try:
                _SOURCES[str(path)] = path.read_text()
            except (OSError, UnicodeDecodeError):
                continue
    pattern = re.compile(rf"^(?:async def|def|class) {re.escape(name)}\b", re.MULTILINE)
    found = []
    for file, text in _SOURCES.items():
        if pattern.search(text):
            parts = Path(file).relative_to(root.parents[1]).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def plain(value: Any) -> Any:
    """JSON of a value: tensors and arrays as nested lists, dataclasses as dicts, tuples as lists."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def raised(exc: BaseException) -> dict[str, str]:
    """An exception as a recorded value (first line of its message: paths and addresses vary)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return {"raised": f"{type(exc).__name__}: {text}"[:300]}


class Context:
    """What observations share within one record: a scratch folder, the tokenizer, built datasets."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self._tokenizer: Any = None
        self._datasets: dict[tuple[Any, ...], Any] = {}
        #: observation name -> the (file, qualname) of every Megatron-Bridge function it ran (census.scan's input)
        self.functions_run: dict[str, set[tuple[str, str]]] = {}

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir

            config = find("megatron.bridge.training.tokenizers.config:TokenizerConfig")
            build = find("megatron.bridge.training.tokenizers.tokenizer:build_tokenizer")
            self._tokenizer = build(
                config(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(embedded_tokenizer_dir()))
            )
        return self._tokenizer

    def packed_rows(self, mult: int) -> list[dict[str, list[int]]]:
        """:data:`ROWS` as the prep stores packed rows; for ``mult`` > 1 each sequence pre-padded with EOS so its
        training length (tokens minus one) is a multiple of ``mult``, as ``_pre_pad_data_point`` pads."""
        eos = int(self.tokenizer.eos_id)
        rows = []
        for row in ROWS:
            ids: list[int] = []
            mask: list[int] = []
            starts: list[int] = []
            for seq in row:
                tokens = [eos if t == E else t for t in seq]
                keep = [0] * PROMPT + [1] * (len(tokens) - PROMPT)
                while (len(tokens) - 1) % mult:
                    tokens.append(eos)
                    keep.append(0)
                starts.append(len(ids))
                ids += tokens
                mask += keep
            assert len(ids) <= WIDTH + 1, "a synthetic row wider than the pack"
            rows.append({"input_ids": ids, "loss_mask": mask, "seq_start_id": starts})
        return rows

    def packed_dataset(self, mult: int, *, pad_cu_seqlens: bool = False, max_num_samples: int | None = None) -> Any:
        """Megatron-Bridge's ``GPTSFTPackedDataset`` over :meth:`packed_rows` (a ``.npy`` pack, read by all)."""
        key = (mult, pad_cu_seqlens, max_num_samples)
        if key in self._datasets:
            return self._datasets[key]
        import numpy as np

        cls = find(
            "megatron.bridge.data.packing.gpt_sft:GPTSFTPackedDataset",
            "megatron.bridge.data.datasets.sft:GPTSFTPackedDataset",
        )
        folder = self.scratch / f"pack_m{mult}"
        folder.mkdir(exist_ok=True)
        path = folder / "training.npy"
        if not path.exists():
            np.save(path, np.array(self.packed_rows(mult), dtype=object), allow_pickle=True)
        meta = folder / "metadata.jsonl"
        meta.write_text(json.dumps([{"max_samples_per_bin": 3, "dataset_max_seqlen": 8, "min_packed_seqlen": 2}]))
        kwargs: dict[str, Any] = dict(
            file_path=str(path),
            tokenizer=self.tokenizer,
            max_seq_length=WIDTH,
            pad_to_max_length=True,
            seed=1234,
            return_cu_seqlen=True,
            pad_cu_seqlens=pad_cu_seqlens,
            pack_metadata_file_path=str(meta),
            max_num_samples=max_num_samples,
            label_key="output",
            truncation_field="input",
            prompt_template="{input} {output}",
        )
        if "pad_seq_to_mult" in inspect.signature(cls.__init__).parameters:
            kwargs["pad_seq_to_mult"] = mult
        try:
            dataset = cls(**kwargs)
        except TypeError as exc:
            raise NotRun(f"{cls.__qualname__}({', '.join(kwargs)}): {exc}") from exc
        self._datasets[key] = dataset
        return dataset


# ---------------------------------------------------------------------------------------------------------------
# the observations


def _collate(ctx: Context, mult: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, pad_cu, indices in (
        ("rows 0,1,2", False, (0, 1, 2)),
        ("rows 2,-1 (-1: the sentinel of a padded final batch)", False, (2, -1)),
        ("rows 0,1,2 pad_cu_seqlens", True, (0, 1, 2)),
    ):
        dataset = ctx.packed_dataset(mult, pad_cu_seqlens=pad_cu)
        try:
            out[label] = plain(dataset.collate_fn([dataset[i] for i in indices]))
        except Exception as exc:  # noqa: BLE001  (the function's own failure is its behaviour)
            out[label] = raised(exc)
    return out


def collate_packed_m1(ctx: Context) -> Any:
    return _collate(ctx, 1)


def collate_packed_m4(ctx: Context) -> Any:
    return _collate(ctx, 4)


def mapped_padding(ctx: Context) -> Any:
    """A packed dataset with a samples mapping (``max_num_samples`` set, as a trainer's sample count sets it): the
    sampler's -1 sentinel of a padded final batch goes through the mapping first."""
    dataset = ctx.packed_dataset(1, max_num_samples=6)
    out: dict[str, Any] = {"samples_mapping": plain(dataset.samples_mapping)}
    for idx in (0, -1):
        try:
            item = dataset[idx]
            out[f"item {idx}"] = {"input_ids": plain(item["input_ids"]), "loss_mask": plain(item["loss_mask"])}
        except Exception as exc:  # noqa: BLE001
            out[f"item {idx}"] = raised(exc)
    try:
        batch = dataset.collate_fn([dataset[0], dataset[-1]])
        out["collate 0,-1 loss_mask"] = plain(batch["loss_mask"])
    except Exception as exc:  # noqa: BLE001
        out["collate 0,-1 loss_mask"] = raised(exc)
    return out


def _metadata_for_step(module: Any, batch: dict[str, Any]) -> dict[str, Any]:
    """What the step hands ``get_packed_seq_params``: its own selection where it has one, else the batch."""
    select = getattr(module, "_packed_metadata_for_forward", None)
    return select(batch) if select is not None else batch


def packed_seq_params(ctx: Context) -> Any:
    get_params = find("megatron.bridge.training.utils.packed_seq_utils:get_packed_seq_params")
    step = find("megatron.bridge.training.gpt_step:get_batch")
    module = inspect.getmodule(step)
    out: dict[str, Any] = {}
    for mult in (1, 4):
        for pad_cu in (False, True):
            dataset = ctx.packed_dataset(mult, pad_cu_seqlens=pad_cu)
            label = f"pad_seq_to_mult {mult}{' pad_cu_seqlens' if pad_cu else ''}, row 0"
            try:
                batch = dataset.collate_fn([dataset[0]])
                out[label] = plain(get_params(_metadata_for_step(module, batch)))
            except Exception as exc:  # noqa: BLE001
                out[label] = raised(exc)
    return out


def _one_process_world() -> None:
    """A one-process gloo world: Megatron's ``get_pg_rank`` reads a group's rank only once torch.distributed is
    initialized (megatron/core/utils.py get_pg_rank), and no collective of a world of one leaves the host."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


class _Group:
    """A process group's rank and size, all the step reads of it on one host (no collective is issued)."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


@contextmanager
def _host_cuda() -> Iterator[None]:
    """The host stands in for the GPU and for the ranks of a group: ``Tensor.cuda()`` keeps the tensor where it
    is (only which keys the step moves is observed), and ``torch.distributed.get_rank``/``get_world_size`` of a
    :class:`_Group` answer its rank and size (one process plays any rank of a CP or PP group; nothing is sent)."""
    import torch
    import torch.distributed as dist

    saved = torch.Tensor.cuda, dist.get_rank, dist.get_world_size
    real_rank, real_size = saved[1], saved[2]

    def get_rank(group: Any = None) -> int:
        return group.rank() if isinstance(group, _Group) else real_rank(group)

    def get_world_size(group: Any = None) -> int:
        return group.size() if isinstance(group, _Group) else real_size(group)

    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    dist.get_rank, dist.get_world_size = get_rank, get_world_size
    try:
        yield
    finally:
        torch.Tensor.cuda, dist.get_rank, dist.get_world_size = saved  # type: ignore[method-assign]


def _packed_cfg() -> Any:
    """An offline-packed SFT config as the step reads it (both field spellings of the releases)."""
    specs = SimpleNamespace(packed_sequence_size=WIDTH, pad_cu_seqlens=False)
    dataset = SimpleNamespace(
        packed_sequence_specs=specs,
        offline_packing_specs=specs,
        enable_offline_packing=True,
        pack_sequences_in_batch=False,
        enable_in_batch_packing=False,
        skip_getting_attention_mask_from_dataset=True,
    )
    model = SimpleNamespace(virtual_pipeline_model_parallel_size=None, is_hybrid_model=False, seq_length=WIDTH)
    return SimpleNamespace(dataset=dataset, model=model)


def get_batch_pp_stages(ctx: Context) -> Any:
    get_batch = find("megatron.bridge.training.gpt_step:get_batch")
    dataset = ctx.packed_dataset(1)
    _one_process_world()
    out: dict[str, Any] = {}
    for label, rank in (("first of 3", 0), ("middle of 3", 1), ("last of 3", 2)):
        pg = SimpleNamespace(pp=_Group(rank, 3), cp=_Group(0, 1), tp=_Group(0, 1))
        batch = dataset.collate_fn([dataset[0]])
        try:
            with _host_cuda():
                got = get_batch(iter([batch]), _packed_cfg(), pg_collection=pg)
            out[label] = [None if v is None else plain(v) for v in got]
        except Exception as exc:  # noqa: BLE001
            out[label] = raised(exc)
    return out


@contextmanager
def _te_partition_on_host() -> Iterator[None]:
    """TE's ``thd_get_partitioned_indices`` (CUDA only) replaced, where Megatron-Core calls it
    (``megatron.core.utils.tex``), by its CPU transliteration (mbridge_seqpack/equivalence/cp.py
    ``te_partition_indices``): the CP split runs on any host and the same everywhere."""
    import megatron.core.utils as mcore_utils

    from mbridge_seqpack.equivalence.cp import te_partition_indices

    saved = getattr(mcore_utils, "tex", None)
    mcore_utils.tex = SimpleNamespace(thd_get_partitioned_indices=te_partition_indices)
    try:
        yield
    finally:
        mcore_utils.tex = saved


def cp_partition_indices(ctx: Context) -> Any:
    partition = find("megatron.bridge.training.utils.packed_seq_utils:get_thd_cp_partition_indices")
    import torch

    _one_process_world()
    out: dict[str, Any] = {}
    for label, cu in (
        ("cu_seqlens 0,4,12,20", [0, 4, 12, 20]),
        ("cu_seqlens 0,8,20 padded 20,20", [0, 8, 20, 20, 20]),
    ):
        for rank in (0, 1):
            try:
                with _host_cuda(), _te_partition_on_host():
                    got = partition(
                        torch.tensor(cu, dtype=torch.int32), total_tokens=WIDTH, cp_group=_Group(rank, 2), device="cpu"
                    )
                out[f"{label}, CP 2 rank {rank}"] = plain(got)
            except Exception as exc:  # noqa: BLE001
                out[f"{label}, CP 2 rank {rank}"] = raised(exc)
    return out


def get_batch_cp2(ctx: Context) -> Any:
    """The step's CP split of a packed row: each rank of CP 2 gets its half of every sequence (pad_seq_to_mult 4,
    2 x CP, as Megatron-Bridge requires of packed CP), with and without ``pad_cu_seqlens``."""
    get_batch = find("megatron.bridge.training.gpt_step:get_batch")
    _one_process_world()
    out: dict[str, Any] = {}
    for pad_cu in (False, True):
        dataset = ctx.packed_dataset(4, pad_cu_seqlens=pad_cu)
        for rank in (0, 1):
            label = f"CP 2 rank {rank}{', pad_cu_seqlens' if pad_cu else ''}"
            pg = SimpleNamespace(pp=_Group(0, 1), cp=_Group(rank, 2), tp=_Group(0, 1))
            batch = dataset.collate_fn([dataset[0]])
            try:
                with _host_cuda(), _te_partition_on_host():
                    got = get_batch(iter([batch]), _packed_cfg(), pg_collection=pg)
                out[label] = [None if v is None else plain(v) for v in got]
            except AssertionError as exc:
                if "parallel group is not initialized" in str(exc):  # Megatron-Core's global state, not pg_collection
                    raise NotRun(f"this commit's get_batch reads Megatron-Core's parallel state: {exc}") from exc
                out[label] = raised(exc)
            except Exception as exc:  # noqa: BLE001
                out[label] = raised(exc)
    return out


def in_batch_packing(ctx: Context) -> Any:
    pack = find("megatron.bridge.data.packing.in_batch:pack_right_padded_sequence_batch_to_mcore_thd")
    import torch

    out: dict[str, Any] = {}
    lengths = (5, 3, 7)
    for mult in (1, 4):
        tokens = torch.zeros(len(lengths), 8, dtype=torch.long)
        labels = torch.full((len(lengths), 8), -100, dtype=torch.long)
        mask = torch.zeros(len(lengths), 8)
        for r, n in enumerate(lengths):
            tokens[r, :n] = torch.arange(10 * (r + 1), 10 * (r + 1) + n)
            labels[r, : n - 1] = tokens[r, 1:n]
            mask[r, : n - 1] = 1
        batch = {
            "tokens": tokens,
            "labels": labels,
            "loss_mask": mask,
            "position_ids": torch.arange(8).repeat(len(lengths), 1),
            "attention_mask": (tokens != 0) | (torch.arange(8) < torch.tensor(lengths)[:, None]),
        }
        try:
            pack(batch, pad_to_multiple_of=mult)
            out[f"rows of 5,3,7 tokens in 8, pad_to_multiple_of {mult}"] = plain(batch)
        except Exception as exc:  # noqa: BLE001
            out[f"rows of 5,3,7 tokens in 8, pad_to_multiple_of {mult}"] = raised(exc)
    return out


def prep_pack(ctx: Context) -> Any:
    """Megatron-Bridge's offline prep on the first rows of the embedded corpus: the pack's bytes and metadata."""
    import hashlib

    import numpy as np

    from mbridge_seqpack.recipes.building_blocks import embedded_data_dir

    try:
        prep = find("megatron.bridge.data.packing.offline:prepare_gpt_sft_packed_data")
        extra: dict[str, Any] = {"dataset_builder": find("megatron.bridge.data.builders.gpt_sft:build_gpt_sft_split")}
    except Absent:
        prep = find("megatron.bridge.data.datasets.packed_sequence:prepare_packed_sequence_data")
        extra = {}
    source = ctx.scratch / "corpus.jsonl"
    lines = (embedded_data_dir() / "training.jsonl").read_text().splitlines()[:CORPUS_ROWS]
    source.write_text("\n".join(lines) + "\n")
    out: dict[str, Any] = {}
    for mult in (1, 4):
        pack = ctx.scratch / f"prep_m{mult}.npy"
        meta = ctx.scratch / f"prep_m{mult}_metadata.jsonl"
        params = inspect.signature(prep).parameters
        kwargs = {k: v for k, v in {"num_tokenizer_workers": 1, "pad_seq_to_mult": mult}.items() if k in params}
        try:
            prep(
                input_path=source,
                output_path=pack,
                output_metadata_path=meta,
                packed_sequence_size=PREP_PACK,
                tokenizer=ctx.tokenizer,
                max_seq_length=PREP_PACK,
                seed=0,
                **kwargs,
                **extra,
            )
        except Exception as exc:  # noqa: BLE001
            out[f"pad_seq_to_mult {mult}"] = raised(exc)
            continue
        rows = np.load(pack, allow_pickle=True)
        out[f"pad_seq_to_mult {mult}"] = {
            "rows": len(rows),
            "row_lengths": [len(r["input_ids"]) for r in rows],
            "seq_start_id": [list(map(int, r["seq_start_id"])) for r in rows],
            "loss_tokens": [int(sum(r["loss_mask"])) for r in rows],
            "rows_sha256": hashlib.sha256(
                json.dumps([plain({k: r[k] for k in sorted(r)}) for r in rows]).encode()
            ).hexdigest(),
            "metadata": json.loads(meta.read_text()),
        }
    return out


def census_scan(ctx: Context) -> Any:
    """The guards (``raise``/``assert``: condition and message, contract/guards.py) of every Megatron-Bridge
    function each observation ran, by observation: what the fixed inputs pass through, found where this commit keeps
    it. Filled by :func:`run_all`, which watches the other observations run."""
    import megatron.bridge

    from mbridge_seqpack.contract.guards import guards_of_source

    root = Path(megatron.bridge.__file__).resolve().parents[2]
    parsed: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for name, functions in sorted(ctx.functions_run.items()):
        found: list[tuple[str, str]] = []  # (fingerprint, where and what)
        for file, qualname in sorted(functions):
            if file not in parsed:
                try:
                    parsed[file] = guards_of_source(Path(file).read_text())
                except (OSError, SyntaxError, UnicodeDecodeError):
                    parsed[file] = {}
            where = Path(file).resolve().relative_to(root) if Path(file).resolve().is_relative_to(root) else file
            for guard in parsed[file].get(qualname, []):
                found.append((guard.fingerprint, f"{where} {qualname}: {' '.join(guard.text.split())}"[:300]))
        # keyed by fingerprint (a renamed or moved function keeps its guards), numbered among equal fingerprints
        guards: dict[str, str] = {}
        seen: dict[str, int] = {}
        for fingerprint, shown in sorted(found):
            n = seen[fingerprint] = seen.get(fingerprint, -1) + 1
            guards[f"{fingerprint}::{n}"] = shown
        out[name] = guards
    return out


def validate_verdicts(ctx: Context) -> Any:
    """``ConfigContainer.validate()`` of Megatron-Bridge itself (the plugin not installed) on the rule cases that
    build without a data set: the verdict is ``ok`` or the exception it raises."""
    import torch.distributed as dist

    from mbridge_seqpack.contract.cases import VALIDATE_CASES

    if dist.is_initialized():  # a step observation's one-process world: validate() would read its size, not the case's
        dist.destroy_process_group()
    out: dict[str, Any] = {}
    for case in VALIDATE_CASES:
        try:
            cfg = case.build(find)
        except (ImportError, AttributeError, TypeError, Absent) as exc:
            out[case.name] = {"config": case.config, "status": "not_run", "why": f"{type(exc).__name__}: {exc}"}
            continue
        try:
            cfg.validate()
            verdict: Any = "ok"
        except Exception as exc:  # noqa: BLE001
            verdict = raised(exc)["raised"]
        out[case.name] = {"config": case.config, "verdict": verdict}
    return out


OBSERVATIONS: tuple[Observation, ...] = (
    Observation(
        "prep.pack",
        "megatron.bridge.data.packing.offline:prepare_gpt_sft_packed_data",
        f"first {CORPUS_ROWS} rows of the embedded corpus, pack {PREP_PACK}, seed 0, pad_seq_to_mult 1 and 4",
        prep_pack,
    ),
    Observation(
        "collate.packed.mult1",
        "megatron.bridge.data.packing.gpt_sft:GPTSFTPackedDataset.collate_fn",
        "3 synthetic packed rows in 20 (one short), pad_seq_to_mult 1; rows 0,1,2; 2,-1; pad_cu_seqlens",
        collate_packed_m1,
    ),
    Observation(
        "collate.packed.mult4",
        "megatron.bridge.data.packing.gpt_sft:GPTSFTPackedDataset.collate_fn",
        "the same rows pre-padded to multiples of 4, pad_seq_to_mult 4",
        collate_packed_m4,
    ),
    Observation(
        "collate.packed.mapped_padding",
        "megatron.bridge.data.packing.gpt_sft:GPTSFTPackedDataset.__getitem__",
        "the synthetic rows with max_num_samples 6 (a samples mapping); items 0 and -1",
        mapped_padding,
    ),
    Observation(
        "collate.in_batch",
        "megatron.bridge.data.packing.in_batch:pack_right_padded_sequence_batch_to_mcore_thd",
        "3 right-padded rows of 5, 3, 7 tokens in 8; pad_to_multiple_of 1 and 4",
        in_batch_packing,
    ),
    Observation(
        "step.packed_seq_params",
        "megatron.bridge.training.utils.packed_seq_utils:get_packed_seq_params",
        "row 0 of the packed collate, pad_seq_to_mult 1 and 4, with and without pad_cu_seqlens",
        packed_seq_params,
    ),
    Observation(
        "step.get_batch.pp_stages",
        "megatron.bridge.training.gpt_step:get_batch",
        "row 0 of the packed collate on the first, middle and last of 3 PP stages, CP 1, offline packing",
        get_batch_pp_stages,
    ),
    Observation(
        "step.get_batch.cp2",
        "megatron.bridge.training.gpt_step:get_batch",
        "row 0 of the packed collate, pad_seq_to_mult 4, with and without pad_cu_seqlens, on CP 2 ranks 0 and 1"
        " (one PP stage; TE's CUDA partition kernel: its CPU transliteration)",
        get_batch_cp2,
    ),
    Observation(
        "cp.partition_indices",
        "megatron.bridge.training.utils.packed_seq_utils:get_thd_cp_partition_indices",
        "20 tokens, cu_seqlens 0,4,12,20 and 0,8,20 with two padded boundaries, CP 2 ranks 0 and 1 (TE's CUDA"
        " partition kernel: its CPU transliteration)",
        cp_partition_indices,
    ),
    Observation(
        "validate.rule_cases",
        "megatron.bridge.training.config:ConfigContainer.validate",
        "the rule cases of mbridge_seqpack/contract/cases.py (packed SFT configs), plugin not installed",
        validate_verdicts,
    ),
    Observation(
        "census.scan",
        "mbridge_seqpack.contract.guards:guards_of_source",
        "the raise/assert guards (condition and message) of every Megatron-Bridge function the other observations"
        " ran, by observation",
        census_scan,
    ),
)


def names() -> list[str]:
    return [o.name for o in OBSERVATIONS]


#: the observations whose functions census.scan does not scan: the config checks (their verdicts are the
#: observation) and the census itself
_NOT_WATCHED = ("validate.rule_cases", "census.scan")


def _seed() -> None:
    """Every random generator the observed code may draw from, seeded before each observation: Megatron-Bridge's
    offline prep ignored its own ``seed`` before PR 4891 (it shuffled with NumPy's global state), so without this
    two records of one commit could differ."""
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def _one(obs: Observation, ctx: Context) -> dict[str, Any]:
    head = {"function": obs.function, "inputs": obs.inputs}
    _seed()
    try:
        return {**head, "status": "ok", "value": obs.run(ctx)}
    except Absent as exc:
        return {**head, "status": "absent", "why": str(exc)[:500]}
    except NotRun as exc:
        return {**head, "status": "not_run", "why": str(exc)[:500]}
    except Exception as exc:  # noqa: BLE001  (building this version's inputs failed: recorded, not fatal)
        return {**head, "status": "not_run", "why": raised(exc)["raised"]}


def run_all(only: list[str] | None = None) -> dict[str, Any]:
    """Every observation (or those named), each ``{"status": "ok", "value": ...}`` or ``absent``/``not_run``.
    With ``census.scan`` wanted, every other observation runs (watched), kept in the record only if wanted."""
    import megatron.bridge

    from mbridge_seqpack.contract.ran import FunctionsRun

    census = not only or "census.scan" in only
    root = Path(megatron.bridge.__file__).parent
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mbridge_seqpack_contract_") as scratch:
        ctx = Context(Path(scratch))
        try:
            ctx.tokenizer  # built before any watch: its construction is no observation's
        except Exception:  # noqa: BLE001  (an observation that needs it records why)
            pass
        for obs in OBSERVATIONS:
            wanted, watched = not only or obs.name in only, census and obs.name not in _NOT_WATCHED
            if obs.name == "census.scan" or not (wanted or watched):
                continue
            if watched:
                with FunctionsRun(root) as watch:
                    result = _one(obs, ctx)
                if result["status"] == "ok":
                    ctx.functions_run[obs.name] = watch.functions
            else:
                result = _one(obs, ctx)
            if wanted:
                results[obs.name] = result
        if census:
            results["census.scan"] = _one(next(o for o in OBSERVATIONS if o.name == "census.scan"), ctx)
    return results
