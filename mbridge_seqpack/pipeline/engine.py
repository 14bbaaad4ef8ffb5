"""The engine of a pack: what checks the records, loads the tokenizer, tokenizes and writes the rows.

``pack_jsonl`` (pipeline/pack.py) decides everything else (options, fingerprint, placement, the sealed directory)
and calls one :class:`PackEngine` without asking which it is: :class:`LocalEngine` (this machine) or ``RayEngine``
(pipeline/ray_engine.py: a Ray cluster's workers). The files are the same bytes whichever runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np

from mbridge_seqpack.artifact.store import write_split
from mbridge_seqpack.tokenization.local import LocalTokenization
from mbridge_seqpack.tokenization.sequences import SequenceOffsets

__all__ = ["PackEngine", "LocalEngine"]


@runtime_checkable
class PackEngine(Protocol):
    """What ``pack_jsonl`` asks of an engine, in this order."""

    def check_inputs(self, inputs: Mapping[str, str | Path], dataset_kwargs: dict[str, Any]) -> None:
        """Refuse a bad record before the Megatron import (an engine whose workers check their own share of the
        input does nothing here)."""

    def tokenizer_facts(self, tokenizer: str | Path, config: Any = None) -> tuple[int, int, str]:
        """(EOS id, vocabulary size, sealed settings) of Megatron-Bridge's tokenizer, loaded where it tokenizes;
        called once the output is staged (a tokenizer that cannot load removes the staging directory)."""

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
    ) -> SequenceOffsets:
        """One split tokenized as Megatron-Bridge's prep does, in file order; its tokens spilled under ``spill``
        (inside the staging directory, removed with it), read back by the writer (artifact/row_tokens.py)."""

    def write_split(self, path: Path, seqs: Any, bins: np.ndarray, info: dict[str, Any]) -> dict[str, Any]:
        """Write the placed rows of one split to ``path`` (``info``, the entry, in its schema metadata); return
        its checksums (artifact/store.py ``sealed_checksums``)."""


class LocalEngine(LocalTokenization):
    """This machine: Megatron-Bridge's tokenization in worker processes (tokenization/local.py) and the store's row
    writer. Its methods are those modules' own, so the data does not come back up to pipeline/ in between."""

    write_split = staticmethod(write_split)
