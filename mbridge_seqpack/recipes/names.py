"""Megatron-Bridge recipe names read from its source, so a misspelt ``--recipe`` is told before the 40-90 s import.

``run_recipe.py`` finds a recipe as an attribute of ``megatron.bridge.recipes``, of its ``<family>.h100`` modules or
of a ``megatron.bridge.perf_recipes`` family package (``runner.find_megatron_recipe``). Every such name is written
in those packages' source (a ``def``, an import or an ``__all__`` entry), so a name written nowhere there cannot be
found by the import either: reading 2-3 MB of text answers in a fraction of a second. A name that is written there
is still looked up by the real import (the text is a filter, never the answer).
"""

from __future__ import annotations

import difflib
import functools
import importlib.machinery
import re
from pathlib import Path

__all__ = ["bridge_recipe_dirs", "written_names", "is_written", "nearest_name"]

_CONFIG_NAME = re.compile(r"\b([a-z][a-z0-9_]*_config)\b")


def bridge_recipe_dirs() -> list[Path]:
    """The installed ``megatron/bridge/recipes`` and ``perf_recipes`` directories (found without importing)."""
    spec = importlib.machinery.PathFinder.find_spec("megatron")
    found = []
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        for name in ("recipes", "perf_recipes"):
            directory = Path(location) / "bridge" / name
            if directory.is_dir():
                found.append(directory)
    return found


@functools.lru_cache(maxsize=1)
def _source() -> str:
    parts = []
    for directory in bridge_recipe_dirs():
        for path in sorted(directory.rglob("*.py")):
            try:
                parts.append(path.read_text(encoding="utf-8", errors="replace"))
            except OSError:
                continue
    return "\n".join(parts)


@functools.lru_cache(maxsize=1)
def written_names() -> frozenset[str]:
    """Every ``..._config`` identifier in the recipe packages' source."""
    return frozenset(_CONFIG_NAME.findall(_source()))


def is_written(name: str) -> bool:
    """Whether ``name`` appears as a word in the recipe packages' source (True when the source is not found: then
    only the import can tell)."""
    source = _source()
    return not source or re.search(rf"\b{re.escape(name)}\b", source) is not None


def nearest_name(name: str, packaged: list[str]) -> str:
    """`` (did you mean 'llama3_8b_sft_config'?)`` among Megatron-Bridge's recipe names and the packaged ones."""
    close = difflib.get_close_matches(name, sorted(written_names()) + packaged, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""
