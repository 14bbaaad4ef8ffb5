"""One split's entry of ``<N>_metadata.jsonl``, typed: what Megatron-Bridge's prep writes and reads, what this
plugin adds and seals.

Megatron-Bridge's prep (data/packing/algorithms.py ``create_packing_strategy``) writes six keys per split and
appends its entry to the list already in the file (data/packing/offline.py ``prepare_gpt_sft_packed_data``); its
packed dataset reads ``max_samples_per_bin`` (data/packing/gpt_sft.py ``GPTSFTPackedDataset``). This plugin's
pack adds the fingerprint, the checksums and the seals.

:meth:`PackEntry.from_json` keeps the entry as read, so :meth:`PackEntry.to_json` gives it back unchanged, key
order included (a file Megatron-Bridge wrote re-serializes to its own bytes): keys neither writes stay in
``extra``, in their place, and a key present with ``null`` stays present. Refusing or dropping unknown keys would
be wrong twice over: the entry's seal (``entry_sha256``) covers every key, so a dropped one would read as an
edit; and another tool may add keys to a file Megatron-Bridge itself appends to. Values are kept as read, not
coerced: each reader says in its own words what a mistyped value means for it (the seal reports an edit).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Mapping

from mbridge_seqpack.artifact.row_tokens import loss_counts
from mbridge_seqpack.errors import ArtifactError

if TYPE_CHECKING:
    from mbridge_seqpack.placement.rows import PlacedRows
    from mbridge_seqpack.tokenization.sequences import TokenizedSequences

__all__ = ["PackEntry", "MEGATRON_BRIDGE_KEYS", "split_entry"]

#: the keys Megatron-Bridge's ``create_packing_strategy`` writes, in its order
MEGATRON_BRIDGE_KEYS = (
    "dataset_max_seqlen",
    "max_samples_per_bin",
    "packing_factor",
    "packing_efficiency",
    "pack_size",
    "min_packed_seqlen",
)


@dataclass(frozen=True)
class PackEntry:
    """A metadata entry; a key the entry does not hold reads None."""

    # Megatron-Bridge's (its packed dataset sizes static cu_seqlens from the first three with pad_cu_seqlens)
    dataset_max_seqlen: int | None = None
    max_samples_per_bin: int | None = None
    packing_factor: float | None = None
    packing_efficiency: float | None = None
    pack_size: int | None = None
    min_packed_seqlen: int | None = None
    # this plugin's: what the rows hold and how they were made
    split: str | None = None
    num_rows: int | None = None
    stats: dict[str, Any] | None = None  # placement/stats.py PackingStats.to_dict
    fingerprint: dict[str, Any] | None = None  # artifact/store.py Fingerprint.to_dict
    dropped_sequences: int | None = None
    overflow: str | None = None
    truncated_sequences: int | None = None
    truncated_tokens: int | None = None
    tokenization: str | None = None
    loss_tokens: int | None = None
    zero_loss_sequences: int | None = None
    balance: dict[str, Any] | None = None  # placement/record.py BalanceRecord.to_dict
    input_path: str | None = None
    checksums: dict[str, Any] | None = None  # artifact/store.py sealed_checksums
    # the seals (artifact/store.py write_metadata, artifact/seal_key.py)
    seal_keyed: str | None = None
    entry_sha256: str | None = None
    entry_hmac_sha256: str | None = None
    # keys neither Megatron-Bridge nor this plugin writes, and the order of the keys as read
    extra: Mapping[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> "PackEntry":
        """The entry as ``json.load`` reads it."""
        if not isinstance(data, Mapping):
            raise ArtifactError(f"a metadata entry must be a JSON object, got {type(data).__name__}")
        known = _json_fields()
        return cls(
            **{key: value for key, value in data.items() if key in known},
            extra={key: value for key, value in data.items() if key not in known},
            keys=tuple(data),
        )

    def to_json(self) -> dict[str, Any]:
        """The entry for ``json.dump``: the keys read, in their order, then every field set since, in field order."""
        out: dict[str, Any] = {}
        for key in self.keys:
            out[key] = self.extra[key] if key in self.extra else getattr(self, key)
        for key in _json_fields():
            if key not in out and getattr(self, key) is not None:
                out[key] = getattr(self, key)
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    @property
    def sealed(self) -> bool:
        """Written by this plugin's pack (it carries its file's checksums); Megatron-Bridge's prep writes none."""
        return bool(self.checksums)


def _json_fields() -> tuple[str, ...]:
    return tuple(f.name for f in fields(PackEntry) if f.name not in ("extra", "keys"))


def split_entry(
    split: str, seqs: TokenizedSequences, placed: PlacedRows, fingerprint: dict[str, Any], overflow: str
) -> dict[str, Any]:
    """A split's metadata entry before its rows are written (the file's schema; checksums and the input path are
    added once the rows are on disk)."""
    entry = {"split": split, **placed.rows, "fingerprint": fingerprint}
    entry["dropped_sequences"] = int((placed.bins < 0).sum())
    entry["overflow"] = overflow  # what a sequence longer than max_seq_length met
    entry["truncated_sequences"] = seqs.truncated_sequences  # shortened by Megatron-Bridge's prep
    entry["truncated_tokens"] = seqs.truncated_tokens
    entry["tokenization"] = seqs.tokenization
    entry.update(loss_counts(seqs, placed.bins))  # read as the writer reads the rows
    if placed.balance_entry is not None:
        entry["balance"] = placed.balance_entry
    return entry
