"""Whether the pack a config will train on is there, and the ``pack`` command that makes it when it is not.

Megatron-Bridge's builder reads an offline pack from a folder named after the settings that change its rows
(``<dataset_root>/packed/<tokenizer>_pad_seq_to_mult<M>_sft_<fingerprint>``, ``default_pack_path``). A fix that
changes one of them (``--fix`` raising ``pad_seq_to_mult`` for CP) moves the folder: the pack made before is then not
the one the launch reads, and Megatron-Bridge would prepare an unsealed one of its own at launch. ``check`` and
``--fix`` say so, with the command that makes the right one (issue #53).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Sequence

__all__ = ["pack_command", "missing_pack_note", "moved_pack_note"]


def pack_command(target: str, overrides: Sequence[str]) -> str:
    """The ``pack`` command for ``target`` with ``overrides`` (each key once, the last value), shell-quoted."""
    last: dict[str, str] = {}
    for item in overrides:  # a fix replaces the user's value of its key (as check --fix prints them)
        key = item.split("=", 1)[0].lstrip("+~")
        last.pop(key, None)
        last[key] = item
    return " ".join(["mbridge-seqpack", "pack", "--recipe", target, *map(shlex.quote, last.values())])


def _location(cfg: Any) -> Any:
    """Where Megatron-Bridge's builder reads the pack of ``cfg`` from the user's ``dataset_root`` (None: explicit
    paths, a Hugging Face source, the package's embedded sample, or no offline packing)."""
    from mbridge_seqpack.artifact.builder_location import builder_location
    from mbridge_seqpack.recipes.building_blocks import embedded_data_dir

    if getattr(getattr(cfg, "dataset", None), "dataset_root", None) is None:
        return None  # a Hugging Face source: Megatron-Bridge's builder materializes and prepares it at launch
    location = builder_location(cfg)
    if location is None or location.directory.parent.parent.resolve() == embedded_data_dir().resolve():
        return None
    return location


def _sealed(directory: Path, pack_size: int) -> bool:
    from mbridge_seqpack.artifact.store import split_paths

    return split_paths(directory, pack_size)["training"].is_file()


def _others(directory: Path) -> list[Path]:
    """Packs beside ``directory`` (made for other settings of the same data)."""
    parent = directory.parent
    if not parent.is_dir():
        return []
    return sorted(path for path in parent.iterdir() if path.is_dir() and path != directory)


def missing_pack_note(cfg: Any, target: str, overrides: Sequence[str]) -> str | None:
    """One line when the config packs offline from a dataset root and no pack is where the builder reads it."""
    location = _location(cfg)
    if location is None or _sealed(location.directory, location.pack_size):
        return None
    others = _others(location.directory)
    made = (
        f" (the pack(s) beside it, {', '.join(path.name for path in others)}, were made for other settings)"
        if others
        else ""
    )
    return (
        f"no pack where Megatron-Bridge's builder reads it for this config ({location.directory}){made}; make it "
        f"before the launch: {pack_command(target, overrides)}"
    )


def moved_pack_note(before: Any, after: Any, target: str, overrides: Sequence[str]) -> str | None:
    """One line when the fixed config (``after``) reads its pack from another folder than ``before`` did and a
    pack was there: that pack no longer matches the config."""
    old, new = _location(before), _location(after)
    if old is None or new is None or old.directory == new.directory:
        return None
    if not _sealed(old.directory, old.pack_size) or _sealed(new.directory, new.pack_size):
        return None
    return (
        f"the fixes move the pack Megatron-Bridge reads from {old.directory.name} to {new.directory.name} (the pack "
        f"made before no longer matches the config); make the new one: {pack_command(target, overrides)}"
    )
