"""What ``pack`` prints after packing: every override the launch needs, and the recipe's own row-count rules run on
the pack it just made (a split too small for one batch fails the launch hours later, after the model is built)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mbridge_seqpack.rules.context import SPECS

if TYPE_CHECKING:
    from mbridge_seqpack.artifact.pack_entry import PackEntry

__all__ = ["PackReport", "launch_overrides", "row_warnings"]


@dataclass(frozen=True)
class PackReport:
    """Everything ``mbridge-seqpack pack`` prints about the pack it made."""

    result: Any  # pipeline/pack.py PackResult
    pack_size: int
    found_by_builder: bool  # written where Megatron-Bridge's dataset builder looks: no path override needed
    launched: tuple[Any, int | None] | None = None  # with --recipe: its config and world size

    def to_json(self) -> str:
        return json.dumps(
            {
                "directory": str(self.result.directory),
                "metadata": str(self.result.metadata),
                "found_by_megatron_bridge": self.found_by_builder,
                "splits": {name: entry.to_json() for name, entry in self.result.splits.items()},
                "warnings": self.warnings(),  # what check will refuse of this pack, as the text says it
            },
            indent=2,
        )

    def to_text(self) -> str:
        from mbridge_seqpack.placement.record import BalanceRecord
        from mbridge_seqpack.textout import labelled, wrap

        result = self.result
        lines = labelled("packed into ", str(result.directory))
        for name, entry in result.splits.items():
            lines += wrap(_split_line(name, entry, self.launched), "  ", hang="    ")
            balance = BalanceRecord.of_value(entry.balance)
            if balance is not None:
                lines += wrap(balance.to_text(), "    ", hang="      ")
        lines += labelled("  metadata: ", str(result.metadata), hang="    ")
        lines += self._use_lines()
        for warning in self.warnings():
            lines += wrap(warning, "", hang="  ")
        return "\n".join(lines)

    def warnings(self) -> list[str]:
        """The recipe's row-count rules on the pack just made (with --recipe), one line each."""
        if self.launched is None:
            return []
        return row_warnings(*self.launched, self.result.directory, self.pack_size, list(self.result.splits))

    def _use_lines(self) -> list[str]:
        """How a launch finds the pack: where it is, or the overrides to paste."""
        from mbridge_seqpack.textout import wrap

        if self.found_by_builder:
            return wrap(
                "Megatron-Bridge's dataset builder reads it from there (its default_pack_path): no packed path "
                "override needed",
                "  ",
                hang="    ",
            )
        # the recipe says whether its launch reads the metadata (pad_cu_seqlens); without one, say when it does
        launched = self.launched
        read = bool(launched[0].dataset.offline_packing_specs.pad_cu_seqlens) if launched is not None else None
        lines = ["  use (paste after the recipe's overrides):"]
        splits = list(self.result.splits)
        for override in launch_overrides(self.result.directory, self.pack_size, splits, metadata_read=bool(read)):
            lines.append(f"    {override}")  # whole, never wrapped: people copy it
        if read is None:  # the path whole on its own line: people copy it
            lines.append("  and where the recipe sets pad_cu_seqlens=true (static cu_seqlens are sized from it):")
            lines.append(f"    {SPECS}.packed_metadata_path={self.result.metadata}")
        return lines


def _split_line(name: str, entry: PackEntry, launched: tuple | None) -> str:
    """One split: sequences, rows, efficiency, what was dropped or cut, the loss share and the epoch's steps."""
    stats = entry.stats or {}
    return (
        f"{name}: {stats['num_sequences']} sequences -> {stats['num_bins']} rows of {entry.pack_size} "
        f"(lower bound {stats['lower_bound']}), efficiency {stats['efficiency']:.2%}, "
        f"max {entry.max_samples_per_bin} per row"
        + (f", {entry.dropped_sequences} dropped (longer than the pack)" if entry.dropped_sequences else "")
        + f", tokenized {entry.tokenization or 'per example'}"
        + (
            f", {entry.truncated_sequences} truncated by Megatron-Bridge's prep "
            f"({entry.truncated_tokens} tokens cut; longer than --max-seq-length)"
            if entry.truncated_sequences
            else ""
        )
        + _loss_text(entry)
        + _steps_text(name, stats["num_bins"], launched)
    )


def _loss_text(entry: PackEntry) -> str:
    """The share of the rows' token slots that carry loss, and the sequences that carry none."""
    if entry.loss_tokens is None:
        return ""
    slots = (entry.stats or {})["num_bins"] * entry.pack_size
    text = f"; loss on {entry.loss_tokens:,} tokens ({entry.loss_tokens / max(slots, 1):.1%} of the slots)"
    if entry.zero_loss_sequences:
        text += f", {entry.zero_loss_sequences} sequence(s) train on no token (empty answer or no assistant turn)"
    return text


def _steps_text(split: str, rows: int, launched: tuple | None) -> str:
    """Optimizer steps one epoch of the training split gives at the recipe's global batch."""
    if launched is None or split != "training":
        return ""
    gbs = getattr(launched[0].train, "global_batch_size", None)
    if not isinstance(gbs, int) or gbs < 1:
        return ""
    return f"; {rows // gbs} step(s) per epoch at the recipe's global batch {gbs}"


def launch_overrides(directory: Path, pack_size: int, splits: list[str], *, metadata_read: bool) -> list[str]:
    """The overrides that point a launch at the pack: each packed split, and the metadata file where the launch
    reads it (``pad_cu_seqlens``: Megatron-Bridge's packed dataset sizes its static cu_seqlens from it)."""
    from mbridge_seqpack.artifact.store import metadata_path, split_paths

    paths = split_paths(directory, pack_size)
    names = {"training": "packed_train_data_path", "validation": "packed_val_data_path"}
    lines = [f"{SPECS}.{names[split]}={paths[split]}" for split in ("training", "validation") if split in splits]
    if metadata_read:
        lines.append(f"{SPECS}.packed_metadata_path={metadata_path(directory, pack_size)}")
    return lines


def row_warnings(cfg: Any, world_size: int | None, directory: Path, pack_size: int, splits: list[str]) -> list[str]:
    """``offline.train_split_rows`` and ``eval.packed_split_rows`` on the recipe pointed at the new pack: one
    line each that fails, with its fix as an override."""
    from mbridge_seqpack.artifact.store import split_paths
    from mbridge_seqpack.rules.context import RuleContext
    from mbridge_seqpack.rules.eval import packed_split_rows
    from mbridge_seqpack.rules.offline import train_split_rows

    pointed = copy.deepcopy(cfg)
    specs = pointed.dataset.offline_packing_specs
    paths = split_paths(directory, pack_size)
    specs.packed_train_data_path = str(paths["training"])
    if "validation" in splits:
        specs.packed_val_data_path = str(paths["validation"])
    ctx = RuleContext(cfg=pointed, world_size=world_size)
    lines = []
    for check in (train_split_rows, packed_split_rows):
        for v in check(ctx) or []:
            override = " ".join(v.overrides)
            lines.append(f"warning: {v.rule}" + (f"; add {override}" if override else f"; {v.fix}"))
    return lines
