"""Prompt/answer JSONL -> token sequences with a per-token loss mask, using Hugging Face ``tokenizers``.

Matches Megatron-Bridge's prompt-completion SFT layout: ``prompt + separator + answer + EOS``, loss on
the answer tokens and the EOS only. Sequences are padded with EOS (loss 0) so that their runtime
length (tokens - 1, labels are shifted) is a multiple of ``pad_seq_to_mult``, as Megatron-Bridge's
offline packer does for THD context parallelism.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

__all__ = ["TokenizedSequences", "load_tokenizer", "tokenizer_identity", "read_jsonl", "tokenize_jsonl",
           "file_sha256"]


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """Content hash of a file (what the artifact fingerprint records for inputs and tokenizers)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _tokenizer_json(path: str | Path) -> Path:
    p = Path(path)
    candidate = p / "tokenizer.json" if p.is_dir() else p
    if not candidate.is_file():
        raise ValueError(f"tokenizer {path}: no tokenizer.json there; pass a Hugging Face tokenizer directory or "
                         f"its tokenizer.json")
    return candidate


def tokenizer_identity(path: str | Path) -> str:
    """sha256 of the tokenizer's ``tokenizer.json``: two tokenizers with one identity tokenize alike."""
    return file_sha256(_tokenizer_json(path))


def load_tokenizer(path: str | Path, eos_token: str | None = None) -> tuple[object, int]:
    """A ``tokenizers.Tokenizer`` and its EOS id (from ``eos_token`` or ``tokenizer_config.json``)."""
    from tokenizers import Tokenizer

    tok_json = _tokenizer_json(path)
    tokenizer = Tokenizer.from_file(str(tok_json))
    if eos_token is None:
        config = tok_json.parent / "tokenizer_config.json"
        if config.is_file():
            value = json.loads(config.read_text()).get("eos_token")
            eos_token = value.get("content") if isinstance(value, dict) else value
    if eos_token is None:
        raise ValueError(f"tokenizer {path}: no eos_token in tokenizer_config.json; pass --eos-token")
    eos_id = tokenizer.token_to_id(eos_token)
    if eos_id is None:
        raise ValueError(f"tokenizer {path}: eos_token {eos_token!r} is not in its vocabulary")
    return tokenizer, int(eos_id)


def read_jsonl(path: str | Path, prompt_key: str, answer_key: str) -> Iterator[tuple[str, str]]:
    """(prompt, answer) per line; a bad line raises ValueError with its line number."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict) or prompt_key not in record or answer_key not in record:
                raise ValueError(f"{path}:{number}: needs string fields {prompt_key!r} and {answer_key!r}")
            yield str(record[prompt_key]), str(record[answer_key])


@dataclass
class TokenizedSequences:
    """Concatenated tokens of all sequences with offsets; ``lengths`` are runtime lengths (tokens - 1)."""

    tokens: np.ndarray  # int32, all sequences back to back (after alignment padding)
    loss_mask: np.ndarray  # int8, same length: 1 where the token is a trained label target
    offsets: np.ndarray  # int64, len n+1
    original_tokens: np.ndarray  # int64, tokens per sequence before alignment padding

    @property
    def count(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def lengths(self) -> np.ndarray:
        """Runtime length of each sequence: stored tokens minus one (labels are shifted)."""
        return np.diff(self.offsets) - 1


def tokenize_jsonl(path: str | Path, tokenizer: object, eos_id: int, *, prompt_key: str = "input",
                   answer_key: str = "output", separator: str = " ", pad_seq_to_mult: int = 1,
                   batch_size: int = 4096, progress: bool = False) -> TokenizedSequences:
    """Tokenize every record; pad each to ``pad_seq_to_mult`` (runtime length) with EOS at loss 0."""
    if not isinstance(pad_seq_to_mult, int) or pad_seq_to_mult < 1:
        raise ValueError(f"pad_seq_to_mult must be a positive integer, got {pad_seq_to_mult!r}")
    pairs = list(read_jsonl(path, prompt_key, answer_key))
    if not pairs:
        raise ValueError(f"{path}: no records")
    iterator = range(0, len(pairs), batch_size)
    if progress:
        from tqdm import tqdm

        iterator = tqdm(iterator, desc="tokenize", unit="batch")
    token_chunks: list[np.ndarray] = []
    mask_chunks: list[np.ndarray] = []
    lengths: list[int] = []
    originals: list[int] = []
    for start in iterator:
        batch = pairs[start:start + batch_size]
        prompts = tokenizer.encode_batch([p + separator for p, _ in batch], add_special_tokens=False)
        answers = tokenizer.encode_batch([a for _, a in batch], add_special_tokens=False)
        for p_enc, a_enc in zip(prompts, answers):
            ids = p_enc.ids + a_enc.ids + [eos_id]
            mask = [0] * len(p_enc.ids) + [1] * (len(a_enc.ids) + 1)
            originals.append(len(ids))
            runtime = len(ids) - 1
            pad = (-runtime) % pad_seq_to_mult
            ids += [eos_id] * pad
            mask += [0] * pad
            token_chunks.append(np.asarray(ids, dtype=np.int32))
            mask_chunks.append(np.asarray(mask, dtype=np.int8))
            lengths.append(len(ids))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return TokenizedSequences(np.concatenate(token_chunks), np.concatenate(mask_chunks), offsets,
                              np.asarray(originals, dtype=np.int64))
