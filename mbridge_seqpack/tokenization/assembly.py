"""Megatron-Bridge's prompt-template examples assembled a chunk at a time, in arrays.

Once the template pieces are encoded (tokenization/batched_tokens.py), what is left of Megatron-Bridge's prep is Python
run example by example: ``GPTSFTDataset._process_example`` joins the pieces with the virtual-token placeholders
(EOS), BOS, SEP and EOS and sets ``answer_start_idx`` (data/datasets/gpt_sft.py), ``tokenize_dataset`` pads each
example for ``pad_seq_to_mult`` (data/packing/offline.py), and ``fill_packing_strategy`` masks every position from
``answer_start_idx - 1`` on (data/packing/algorithms.py). For an example that needs no truncation that is a
concatenation, done here for the whole chunk in one ``np.concatenate``. Every other example (one Megatron-Bridge
truncates, or cuts to the pad cap, or a record with a missing or non-text field) is left to Megatron-Bridge's own
code: the dataset its ``tokenize_dataset`` materializes (:class:`RemainingExamples`) holds just those, so their
tokens, padding and errors are its own. Tested byte for byte against Megatron-Bridge's per-example path.

Where the assembly does not apply at all (a dataset class other than ``GPTSFTDataset``, records read through a
reader other than the JSONL lines, special-token ids that are not integers), :func:`assembly_refusal` says why and
every example runs Megatron-Bridge's code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mbridge_seqpack.tokenization.batched_tokens import Batch

__all__ = [
    "AssemblyRequest",
    "ChunkArrays",
    "ChunkAssembly",
    "RemainingExamples",
    "assemble",
    "assembly_refusal",
    "from_items",
]


@dataclass(frozen=True)
class ChunkArrays:
    """One tokenized chunk: tokens (int64), stored loss mask (int8), tokens per example, tokens truncated."""

    ids: np.ndarray
    mask: np.ndarray
    sizes: np.ndarray
    truncated: np.ndarray


def stored_mask(item: dict[str, Any], length: int) -> np.ndarray:
    """Megatron-Bridge's ``fill_packing_strategy``: a ``loss_mask`` rolled left by one, else every position
    from ``answer_start_idx - 1`` on (int8, ``length`` entries)."""
    mask = np.zeros(length, dtype=np.int8)
    if "loss_mask" in item:
        given = np.asarray(as_list(item["loss_mask"]), dtype=bool)
        mask[: given.size - 1] = given[1:]
        return mask
    mask[max(int(item["answer_start_idx"]) - 1, 0) :] = 1
    return mask


def as_list(values: Any) -> list[Any]:
    """Megatron-Bridge's chat path returns tensors, its prompt path lists."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


def from_items(items: Any) -> ChunkArrays:
    """Megatron-Bridge's materialized examples (``tokenize_dataset``'s output) as arrays."""
    from mbridge_seqpack.tokenization.truncation import truncated_tokens

    ids = [np.asarray(as_list(item["input_ids"]), dtype=np.int64) for item in items]
    sizes = np.fromiter((x.size for x in ids), dtype=np.int64, count=len(ids))
    return ChunkArrays(
        np.concatenate(ids) if ids else np.zeros(0, np.int64),
        np.concatenate([stored_mask(item, x.size) for item, x in zip(items, ids)]) if ids else np.zeros(0, np.int8),
        sizes,
        np.fromiter((truncated_tokens(item) for item in items), dtype=np.int64, count=len(ids)),
    )


def _token_id(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def assembly_refusal(dataset: Any, batch: Batch) -> str | None:
    """Why the chunk's examples are assembled one by one by Megatron-Bridge's code (None: in arrays here)."""
    from mbridge_seqpack.tokenization.truncation import CountingGPTSFTDataset

    if batch.refusal is not None:
        return batch.refusal
    if type(dataset) is not CountingGPTSFTDataset:
        return f"the dataset class {type(dataset).__name__}"
    if batch.records is None or len(batch.records) != len(dataset):
        return "records read through the dataset's own reader"
    tokenizer = dataset.tokenizer
    needed = {"eos_id": tokenizer.eos_id} if dataset.add_eos or dataset.virtual_tokens else {}
    if dataset.add_bos:
        needed["bos_id"] = tokenizer.bos_id
    if dataset.add_sep:
        needed["sep_id"] = dataset.sep_id
    needed["eod"] = tokenizer.eod
    for name, value in needed.items():
        if not _token_id(value):
            return f"a {name} of {value!r}"
    return None


@dataclass
class ChunkAssembly:
    """The chunk's examples in order: arrays of the assembled ones and a place for each one left to Megatron-Bridge
    (``remaining``, ascending indices into the chunk)."""

    parts: list[np.ndarray | None]  # None: the tokens of the next remaining example go here
    sizes: np.ndarray  # tokens per example (-1 for a remaining one until merged)
    mask_from: np.ndarray  # first position of the stored loss mask
    remaining: np.ndarray

    def merge(self, items: Any) -> ChunkArrays:
        """The whole chunk, with ``items`` (Megatron-Bridge's materialized ``remaining`` examples) in place."""
        if len(items) != self.remaining.size:
            raise RuntimeError(f"{len(items)} examples came back from Megatron-Bridge, {self.remaining.size} expected")
        theirs = from_items(items)
        sizes = self.sizes.copy()
        sizes[self.remaining] = theirs.sizes
        pieces = np.split(theirs.ids, np.cumsum(theirs.sizes)[:-1]) if len(items) else []
        slots = iter(pieces)
        ids = np.concatenate([next(slots) if part is None else part for part in self.parts]) if self.parts else None
        ends = np.cumsum(sizes)
        starts = ends - sizes
        position = np.arange(int(ends[-1]) if sizes.size else 0) - np.repeat(starts, sizes)
        mask = (position >= np.repeat(self.mask_from, sizes)).astype(np.int8)
        their_ends = np.cumsum(theirs.sizes).tolist()
        for start, size, end in zip(starts[self.remaining].tolist(), theirs.sizes.tolist(), their_ends):
            mask[start : start + size] = theirs.mask[end - size : end]
        truncated = np.zeros(sizes.size, dtype=np.int64)
        truncated[self.remaining] = theirs.truncated
        return ChunkArrays(ids if ids is not None else np.zeros(0, np.int64), mask, sizes, truncated)


@dataclass
class AssemblyRequest:
    """What ``tokenize_split`` asks of the dataset builder for one chunk (``tokenize_dataset``'s length and pad
    multiple) and what it got: the assembly, or why there is none."""

    max_seq_length: int
    pad_seq_to_mult: int
    done: ChunkAssembly | None = None
    refusal: str | None = None

    def build(self, dataset: Any, batch: Batch) -> Any:
        """The dataset for ``tokenize_dataset`` to materialize: the examples left to Megatron-Bridge's code, or all
        of them when the assembly does not apply."""
        self.refusal = assembly_refusal(dataset, batch)
        if self.refusal is not None:
            return dataset
        self.done = assemble(dataset, batch, max_seq_length=self.max_seq_length, pad_seq_to_mult=self.pad_seq_to_mult)
        return RemainingExamples(dataset, self.done.remaining)

    def chunk(self, items: Any) -> ChunkArrays:
        """The chunk's arrays from what ``tokenize_dataset`` returned."""
        return self.done.merge(items) if self.done is not None else from_items(items)


class RemainingExamples:
    """The examples Megatron-Bridge's code still assembles, as the dataset its ``tokenize_dataset`` materializes and
    pads: the built dataset's items at ``indices`` and, for everything else it reads, the dataset itself."""

    def __init__(self, dataset: Any, indices: np.ndarray) -> None:
        self._dataset = dataset
        self._indices = indices

    def __len__(self) -> int:
        return int(self._indices.size)

    def __getitem__(self, index: int) -> Any:
        return self._dataset[int(self._indices[index])]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_dataset", "_indices"):  # unpickling looks these up first
            raise AttributeError(name)
        return getattr(self._dataset, name)


def assemble(dataset: Any, batch: Batch, *, max_seq_length: int, pad_seq_to_mult: int) -> ChunkAssembly:
    """Every example of the chunk that ``_process_example`` would not truncate nor ``tokenize_dataset`` cut, in
    arrays (``assembly_refusal`` must have said None). ``max_seq_length`` and ``pad_seq_to_mult`` are what
    ``tokenize_dataset`` was given; the dataset holds the stored length it was built with."""
    tokenizer = dataset.tokenizer
    virtual, add_bos, add_sep, add_eos = dataset.virtual_tokens, dataset.add_bos, dataset.add_sep, dataset.add_eos
    head = np.asarray([tokenizer.eos_id] * virtual + ([tokenizer.bos_id] if add_bos else []), dtype=np.int64)
    sep = np.asarray([dataset.sep_id] if add_sep else [], dtype=np.int64)
    tail = np.asarray([tokenizer.eos_id] if add_eos else [], dtype=np.int64)
    fixed = head.size + sep.size + tail.size
    answer_offset = head.size + sep.size
    limit, least_answer = dataset.max_seq_length, dataset.tokens_to_generate
    # tokenize_dataset's padding (pad_seq_to_mult > 1): runtime length (tokens - 1) up to a multiple, capped
    multiple = max(1, pad_seq_to_mult)
    cap = (max_seq_length // multiple) * multiple if multiple > 1 else None
    pad_id = tokenizer.eod
    encoded = tokenizer._ids
    parts: list[np.ndarray | None] = []
    sizes = np.full(len(batch.pieces), -1, dtype=np.int64)
    mask_from = np.zeros(len(batch.pieces), dtype=np.int64)
    remaining: list[int] = []
    for index, texts in enumerate(batch.pieces):
        arrays = [encoded.get(text) for text in texts]
        if not arrays or any(ids is None for ids in arrays):
            remaining.append(index)  # a missing or non-text field: Megatron-Bridge's code says what it does
            parts.append(None)
            continue
        answer = arrays[-1].size
        context = sum(ids.size for ids in arrays[:-1])
        if fixed + context + max(answer, least_answer) > limit:
            remaining.append(index)  # _multiple_truncation cuts it
            parts.append(None)
            continue
        length = fixed + context + answer
        padded = length
        if cap is not None:
            padded = min(cap, -(-max(length - 1, 0) // multiple) * multiple) + 1
            if padded < length:
                remaining.append(index)  # _pre_pad_data_point cuts it to the cap
                parts.append(None)
                continue
        parts.append(head)
        parts.extend(arrays[:-1])
        parts.append(sep)
        parts.append(arrays[-1])
        parts.append(tail)
        if padded > length:
            parts.append(np.full(padded - length, pad_id, dtype=np.int64))
        sizes[index] = padded
        mask_from[index] = max(answer_offset + context - 1, 0)
    return ChunkAssembly(parts, sizes, mask_from, np.asarray(remaining, dtype=np.int64))
