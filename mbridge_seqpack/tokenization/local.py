"""Tokenization on this machine: the tokenizing half of ``pack``'s local engine (pipeline/engine.py adds the writer).

Its methods are the local side of the pack engine protocol (``PackEngine``): the records checked before the
Megatron import, Megatron-Bridge's tokenizer loaded once, each split tokenized in ``workers`` processes. They live
here, beside the functions they call, so a local pack's data goes down the packages once (scripts/pack_walk.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from mbridge_seqpack.tokenization.sequences import (
    TokenizedSequences,
    check_jsonl,
    load_megatron_tokenizer,
    tokenize_split,
)

__all__ = ["LocalTokenization", "all_cores"]


def all_cores() -> int:
    """Cores this process may use. (Megatron-Bridge's ``num_tokenizer_workers=-1`` means one process: its
    ``_materialize_dataset_items`` runs serially for any value <= 1.)"""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class LocalTokenization:
    """Megatron-Bridge's tokenization in this process and ``workers`` worker processes (default: every core),
    ``lines_per_chunk`` records of the input in memory at a time."""

    def __init__(self, workers: int | None = None, lines_per_chunk: int = 50_000) -> None:
        self.workers, self.lines_per_chunk = workers, lines_per_chunk
        self._records: dict[str, int] = {}  # each checked input's record count: tokenization need not count again
        self._tokenizers: dict[tuple[str, str], Any] = {}

    def check_inputs(self, inputs: Mapping[str, str | Path], dataset_kwargs: dict[str, Any]) -> None:
        """Every record of every split, before the ~40 s Megatron import: a bad one is refused at once."""
        self._records = {str(source): check_jsonl(source, dataset_kwargs) for source in inputs.values()}

    def _tokenizer(self, tokenizer: str | Path, config: Any) -> Any:
        key = (str(tokenizer), repr(config))
        if key not in self._tokenizers:
            self._tokenizers[key] = load_megatron_tokenizer(tokenizer, config)
        return self._tokenizers[key]

    def tokenizer_facts(self, tokenizer: str | Path, config: Any = None) -> tuple[int, int, str]:
        """(EOS id, vocabulary size, sealed settings) of the Megatron-Bridge tokenizer, which stays loaded for
        :meth:`tokenize`."""
        from mbridge_seqpack.tokenization.tokenizer_settings import sealed_settings

        loaded = self._tokenizer(tokenizer, config)
        return int(loaded.eos_id), int(loaded.vocab_size), sealed_settings(tokenizer, config)

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
    ) -> TokenizedSequences:
        """``tokenize_split`` of ``source``, its tokens spilled under ``spill``."""
        return tokenize_split(
            source,
            self._tokenizer(tokenizer, tokenizer_config),
            max_seq_length=max_seq_length,
            pad_seq_to_mult=pad_seq_to_mult,
            dataset_kwargs=dataset_kwargs,
            seed=seed,
            workers=all_cores() if self.workers is None else self.workers,
            lines_per_chunk=self.lines_per_chunk,
            records=self._records.get(str(source)),
            spill_dir=spill,
            batched=batched,
        )
