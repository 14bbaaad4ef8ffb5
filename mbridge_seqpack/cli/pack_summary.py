"""What ``pack`` prints after packing: every override the launch needs, and the recipe's own row-count rules run on
the pack it just made (a split too small for one batch fails the launch hours later, after the model is built)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from mbridge_seqpack.rules.context import SPECS

__all__ = ["launch_overrides", "row_warnings"]


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
