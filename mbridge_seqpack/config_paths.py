"""Dotted-path access into configs, for fixes and mixin facts.

Paths such as ``dataset.offline_packing_specs.pad_seq_to_mult`` or ``dataset.dataset_kwargs['pad_to_max_length']``;
command-line overrides go through Megatron-Bridge's own parser (``mbridge_seqpack.overrides``)."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

from mbridge_seqpack.errors import UsageError

__all__ = ["split_path", "get_path", "set_path"]

_TOKEN = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_]*)|\[('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|-?\d+)\]")


def split_path(path: str) -> list[tuple[str, Any]]:
    """``a.b['k']`` -> ``[("attr", "a"), ("attr", "b"), ("key", "k")]``; raises ValueError on bad syntax."""
    parts: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(path):
        match = _TOKEN.match(path, pos)
        if match is None or (pos == 0 and path.startswith(".")):
            raise UsageError(
                f"bad config path {path!r} at character {pos}; use e.g. model.seq_length or "
                "dataset.dataset_kwargs['pad_to_max_length']"
            )
        if match.group(1) is not None:
            parts.append(("attr", match.group(1)))
        else:
            parts.append(("key", ast.literal_eval(match.group(2))))
        pos = match.end()
    if not parts:
        raise UsageError("empty config path; use e.g. model.seq_length")
    return parts


def _step(obj: Any, kind: str, name: Any, path: str) -> Any:
    if kind == "key" or isinstance(obj, Mapping):
        if not isinstance(obj, Mapping) or name not in obj:
            raise UsageError(f"config path {path!r}: no key {name!r}")
        return obj[name]
    if not hasattr(obj, name):
        raise UsageError(f"config path {path!r}: {type(obj).__name__} has no field {name!r}")
    return getattr(obj, name)


def get_path(root: Any, path: str) -> Any:
    """Read the value at ``path`` under ``root``."""
    obj = root
    for kind, name in split_path(path):
        obj = _step(obj, kind, name, path)
    return obj


def set_path(root: Any, path: str, value: Any) -> None:
    """Write ``value`` at ``path``; attributes must exist (typos fail), dict keys may be new."""
    parts = split_path(path)
    obj = root
    for kind, name in parts[:-1]:
        obj = _step(obj, kind, name, path)
    kind, name = parts[-1]
    if kind == "key" or isinstance(obj, dict):
        if not isinstance(obj, dict):
            raise UsageError(f"config path {path!r}: {type(obj).__name__} is not a dict")
        obj[name] = value
        return
    if not hasattr(obj, name):
        raise UsageError(f"config path {path!r}: {type(obj).__name__} has no field {name!r}")
    setattr(obj, name, value)
