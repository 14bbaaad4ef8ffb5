"""Megatron-Bridge's prompt-template tokenization, every example of a chunk in one tokenizer call.

Megatron-Bridge's ``GPTSFTDataset._process_example`` tokenizes each piece of each example's prompt template with
its own call (``_tokenize`` -> ``HuggingFaceTokenizer.text_to_ids`` -> ``transformers``' ``__call__``), and that
per-call overhead is most of its prep time (about 70% on the embedded corpus). Here, once the dataset is built,
its own ``_separate_template`` cuts every example into those same pieces and one call of the same ``transformers``
tokenizer on the list encodes them all (its Rust backend, on every core). A single string goes through that very
path as a batch of one (``TokenizersBackend._encode_plus``: ``encode_batch`` either way), so the ids are the same
by construction. Joining the pieces with BOS/SEP/EOS, masks and padding is then done for the chunk in arrays
(tokenization/assembly.py), truncation by Megatron-Bridge's code on those ids. Tested byte for byte against
Megatron-Bridge's prep. The ids are held as int32 arrays for the chunk being tokenized (4 bytes a token).

Where the shortcut does not apply, the dataset runs exactly as Megatron-Bridge's and :func:`batching_refusal`
says why: chat datasets (a chat template per conversation), ``dataset.preprocessing`` (prompt/completion
tokenization in one function), a tokenizer other than a fast Hugging Face one with its special tokens, or a
sample mapping (``max_num_samples``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Batch", "BatchedTokenizer", "TemplatePieces", "batching_refusal", "batch_tokenize", "expected_refusal"]

#: why a dataset is tokenized example by example
CHAT = "a chat dataset (one chat template per conversation)"
PREPROCESSING = "dataset.preprocessing (prompt/completion tokenization)"
NOT_FAST = "not a fast Hugging Face tokenizer with its special tokens"
SAMPLE_MAPPING = "a sample mapping (max_num_samples)"


def _hf_tokenizer(tokenizer: Any) -> Any | None:
    """The ``transformers`` fast tokenizer behind Megatron-Bridge's tokenizer, when ``tokenize(text)`` is exactly
    ``hf(text).input_ids`` (``HuggingFaceTokenizer.text_to_ids`` with its special tokens); else None."""
    from megatron.core.tokenizers.text.libraries import HuggingFaceTokenizer

    library = getattr(tokenizer, "_tokenizer", None)
    if getattr(tokenizer, "legacy", False) or not isinstance(library, HuggingFaceTokenizer):
        return None
    hf = getattr(library, "tokenizer", None)
    if not getattr(library, "include_special_tokens", False) or not getattr(hf, "is_fast", False):
        return None
    return hf


class BatchedTokenizer:
    """Megatron-Bridge's tokenizer, whose ``tokenize(text)`` answers from the ids encoded for the chunk when the text
    is one of its template pieces (and asks the tokenizer itself otherwise). Everything else is the tokenizer's."""

    def __init__(self, tokenizer: Any, hf: Any) -> None:
        self._inner = tokenizer
        self._hf = hf
        self._ids: dict[str, np.ndarray] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_inner", "_hf", "_ids", "_missing"):  # unpickling looks these up first
            raise AttributeError(name)
        missing = self.__dict__.setdefault("_missing", set())
        if name in missing:
            raise AttributeError(name)
        try:
            value = getattr(self._inner, name)
        except AttributeError:
            missing.add(name)  # the dataset asks for space_sensitive once per example; this tokenizer has none
            raise
        self.__dict__[name] = value  # and for eos_id, bos_id, ... once per example
        return value

    def tokenize(self, text: str) -> list[int]:
        ids = self._ids.get(text)
        return ids.tolist() if ids is not None else self._inner.tokenize(text)

    def encode(self, texts: list[str]) -> None:
        """Encode ``texts`` (each distinct text once) in one call of the Hugging Face tokenizer."""
        unique = [text for text in dict.fromkeys(texts) if text not in self._ids]
        if unique:
            self._ids.update(zip(unique, (np.asarray(ids, dtype=np.int32) for ids in _encode_batch(self._hf, unique))))


def _encode_batch(hf: Any, texts: list[str]) -> list[list[int]]:
    """``hf(texts).input_ids``. ``transformers`` turns truncation and padding off on its Rust tokenizer, sets its
    special-token splitting and calls ``encode_batch``, then copies every encoding into Python lists
    (``_convert_encoding``). After one such call on the first text, when the Rust tokenizer is left in that state,
    the rest is encoded with its ``encode_batch_fast`` (the same ids, without the character offsets nobody reads
    here)."""
    first = hf(texts[:1]).input_ids
    backend = getattr(hf, "_tokenizer", None)
    fast = getattr(backend, "encode_batch_fast", None)
    if (
        len(texts) == 1
        or fast is None
        or backend.truncation is not None
        or backend.padding is not None
        or backend.encode_special_tokens != bool(getattr(hf, "split_special_tokens", False))
    ):
        return first + (hf(texts[1:]).input_ids if len(texts) > 1 else [])
    return first + [encoding.ids for encoding in fast(texts[1:], add_special_tokens=True)]


def expected_refusal(tokenizer: Any, dataset_kwargs: dict[str, Any]) -> str | None:
    """What :func:`batching_refusal` will say of the dataset Megatron-Bridge builds from these, known before it is
    built (``tokenize_split`` then runs one process: the encoding is multi-threaded already, and Megatron-Bridge's
    pool pickles every example back through a pipe, which costs more than the pool gains once the tokenizer calls
    are gone)."""
    if dataset_kwargs.get("chat"):
        return CHAT
    if dataset_kwargs.get("prompt_completion_config") is not None:
        return PREPROCESSING
    return NOT_FAST if _hf_tokenizer(tokenizer) is None else None


def batching_refusal(dataset: Any) -> str | None:
    """Why ``dataset`` is tokenized example by example, as Megatron-Bridge does (None: it is batched)."""
    from megatron.bridge.data.datasets.gpt_sft import GPTSFTChatDataset, GPTSFTDataset

    if isinstance(dataset, GPTSFTChatDataset) or not isinstance(dataset, GPTSFTDataset):
        return CHAT
    if getattr(dataset, "prompt_completion_config", None) is not None:
        return PREPROCESSING
    if getattr(dataset, "samples_mapping", None) is not None:
        return SAMPLE_MAPPING
    tokenizer = dataset.tokenizer
    inner = tokenizer._inner if isinstance(tokenizer, BatchedTokenizer) else tokenizer
    return NOT_FAST if _hf_tokenizer(inner) is None else None


class TemplatePieces:
    """The strings ``_process_example`` tokenizes for an example: its template values stripped of spaces as it strips
    them, placed in the pieces the dataset's own ``_separate_template`` cuts. The template does not change between
    examples, so it is cut once, with markers for the values, and each example only fills them in. (A piece that
    came out otherwise than the dataset's would only be missing from the batch and asked of the tokenizer itself.)"""

    def __init__(self, dataset: Any) -> None:
        self.keys = list(dataset.prompt_template_keys)
        markers = [f"\x00{index}\x00" for index in range(len(self.keys))]
        self.layout: list[tuple[str, int | None]] = []  # (literal text or left spaces, value index or None)
        for piece in dataset._separate_template(markers)[0]:
            found = [index for index, marker in enumerate(markers) if piece.endswith(marker)]
            if found and piece[: -len(markers[found[0]])].strip(" ") == "":
                self.layout.append((piece[: -len(markers[found[0]])], found[0]))
            else:
                self.layout.append((piece, None))

    def of(self, example: Any) -> list[str]:
        """The pieces of one example (none when a key is missing: the dataset raises there)."""
        try:
            values = [example[key].strip(" ") for key in self.keys]
        except (KeyError, AttributeError, TypeError):
            return []
        return [text if index is None else text + values[index] for text, index in self.layout]


def _records(dataset: Any) -> list[Any] | None:
    """The records of ``dataset``'s JSONL file, parsed once here as its memory-mapped reader parses each line (the
    line without its newline, decoded as UTF-8, ``json.loads``); None when the file cannot be read so (the dataset's
    own reader then runs, and raises where Megatron-Bridge would)."""
    import json

    path = getattr(dataset, "file_path", None)
    if getattr(dataset, "hf_dataset", False) or not (isinstance(path, str) and path.endswith(".jsonl")):
        return None
    try:
        with open(path, "rb") as handle:
            return [json.loads(line.rstrip(b"\n").decode("utf-8")) for line in handle if line.strip()]
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Batch:
    """What :func:`batch_tokenize` did with a dataset: why it left it alone, or the records it read (None: through
    the dataset's reader) and each record's template pieces (none for a record the dataset rejects)."""

    refusal: str | None
    records: list[Any] | None = None
    pieces: list[list[str]] = field(default_factory=list)


def batch_tokenize(dataset: Any) -> Batch:
    """Give ``dataset`` a :class:`BatchedTokenizer` holding the ids of every template piece of its examples (the
    dataset is left as Megatron-Bridge built it when the shortcut does not apply, and ``refusal`` says why)."""
    refusal = batching_refusal(dataset)
    if refusal is not None:
        return Batch(refusal)
    if not isinstance(dataset.tokenizer, BatchedTokenizer):
        dataset.tokenizer = BatchedTokenizer(dataset.tokenizer, _hf_tokenizer(dataset.tokenizer))
    template = TemplatePieces(dataset)
    records = _records(dataset)
    examples = records if records is not None else (dataset.indexed_dataset[j] for j in range(len(dataset)))
    pieces = [template.of(example) for example in examples]
    dataset.tokenizer.encode([piece for texts in pieces for piece in texts])
    return Batch(None, records, pieces)
