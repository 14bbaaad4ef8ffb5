"""``--config-file``: as strict as an override. The file is read and its YAML checked before the Megatron import (a
YAML error names ``file:line:column``); once the recipe is built, every key is looked up in the config, and one that
is not a field gets the same "did you mean" an override gets (Megatron-Bridge's ``OmegaConf.merge`` adds an unknown
key, and its ``apply_overrides`` then drops it without a word: a misspelt key would pass silently).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mbridge_seqpack.errors import UsageError

__all__ = ["YamlKey", "read_config_file", "check_config_keys"]


@dataclass(frozen=True)
class YamlKey:
    """One key of the file: its dotted path and the line (1-based) it is written on."""

    path: str
    line: int


def read_config_file(name: str) -> list[YamlKey]:
    """Every key of the YAML file ``name`` (nested mappings walked), or the error naming file:line."""
    import yaml

    path = Path(name)
    if not path.is_file():
        raise UsageError(f"--config-file {name}: no such file" + ("" if not path.exists() else " (a directory)"))
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"--config-file {name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        raise UsageError(f"--config-file {where}: YAML error: {what}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--config-file {name}: YAML error: {exc}") from None
    if root is None:
        return []
    if not isinstance(root, yaml.MappingNode):
        raise UsageError(
            f"--config-file {name}:{root.start_mark.line + 1}: the file must be a mapping of config sections "
            "(model:, train:, dataset: ...), not a YAML "
            + ("list" if isinstance(root, yaml.SequenceNode) else "value")
        )
    keys: list[YamlKey] = []

    def walk(node: Any, prefix: str) -> None:
        for key, value in node.value:
            dotted = f"{prefix}{key.value}"
            keys.append(YamlKey(dotted, key.start_mark.line + 1))
            if isinstance(value, yaml.MappingNode):
                walk(value, f"{dotted}.")

    walk(root, "")
    return keys


def _field_names(node: Any) -> list[str] | None:
    """The keys a config node takes (its dataclass fields); None for a free-form node (a dict, a value, None)."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return [f.name for f in dataclasses.fields(node)]
    return None


def check_config_keys(cfg: Any, name: str, keys: list[YamlKey]) -> None:
    """Each key of the file is a field of ``cfg`` (below a free-form mapping, anything goes); the first that is not
    raises, with its line and the nearest field."""
    for key in keys:
        parts = key.path.split(".")
        node = cfg
        for depth, part in enumerate(parts):
            names = _field_names(node)
            if names is None:
                break
            if part not in names:
                near = difflib.get_close_matches(part, names, n=1)
                hint = f" (did you mean {'.'.join([*parts[:depth], near[0]])!r}?)" if near else ""
                raise UsageError(f"--config-file {name}:{key.line}: {key.path!r} is not a config field{hint}")
            node = getattr(node, part, None)
