"""Fixes rendered as Megatron-Bridge's Hydra-style overrides (pure text; ``overrides.py`` applies overrides).

A fix path into a dict (``dataset.dataset_kwargs.pad_to_max_length``) renders with ``++`` (add or override), since
Megatron-Bridge's parser runs in struct mode; dataclass fields render plainly.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DICT_FIELDS", "render_value", "render_override"]

DICT_FIELDS = ("dataset.dataset_kwargs.", "env_vars.")


def render_value(value: Any) -> str:
    """A value in Hydra's override grammar: true/false/null, numbers, [lists], {dicts}, quoted strings."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(render_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{render_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if text and all(c.isalnum() or c in "_-./" for c in text) and text.lower() not in ("true", "false", "null"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def render_override(path: str, value: Any) -> str:
    """``path=value`` as Megatron-Bridge's Hydra-style overrides take it (``++`` for keys inside dicts)."""
    prefix = "++" if path.startswith(DICT_FIELDS) else ""
    return f"{prefix}{path}={render_value(value)}"
