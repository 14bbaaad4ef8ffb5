"""Megatron-Bridge's override syntax, both ways: fixes out as overrides, overrides in with its own parser.

Fixes rendered as Hydra overrides its runner accepts, and
command-line overrides applied with its own ``process_config_with_overrides`` (syntax checked first, with
Hydra's parser, before the ~40 s Megatron import).

A fix path into a dict (``dataset.dataset_kwargs.pad_to_max_length``) renders with ``++`` (add or
override), since Megatron-Bridge's parser runs in struct mode; dataclass fields render plainly.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from mbridge_seqpack.errors import UsageError
from mbridge_seqpack.override_text import render_override, render_value

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "render_value",
    "render_override",
    "check_override_syntax",
    "config_sections",
    "check_override_sections",
    "apply_overrides",
    "converged_fix",
]


def check_override_syntax(overrides: Sequence[str]) -> None:
    """Parse with Hydra's override grammar (no Megatron import); a bad one raises ValueError naming it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for text in overrides:
        try:
            parser.parse_overrides([text])
        except Exception as exc:  # noqa: BLE001  (hydra raises its own OverrideParseException)
            raise UsageError(
                f"override {text!r} is not valid Hydra override syntax ({str(exc).splitlines()[0]}); "
                f"write it as Megatron-Bridge's recipe runner takes it, e.g. model.seq_length=8192, "
                f"++dataset.dataset_kwargs.pad_to_max_length=true"
            ) from None


def config_sections() -> tuple[str, ...] | None:
    """The sections of Megatron-Bridge's ``ConfigContainer`` (``model``, ``train``, ``dataset`` ...), read from the
    installed ``megatron/bridge/training/config.py`` without importing it (an override typo should not wait for that
    import: ``cli/startup.py`` MEASURED_IMPORT_S); None where the file is not found or the class not recognised."""
    import ast
    import importlib.machinery
    import os

    spec = importlib.machinery.PathFinder.find_spec("megatron")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        source = os.path.join(location, "bridge", "training", "config.py")
        if not os.path.isfile(source):
            continue
        try:
            with open(source, encoding="utf-8") as handle:
                tree = ast.parse(handle.read())
        except (OSError, SyntaxError, ValueError):
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "ConfigContainer":
                names = tuple(
                    item.target.id
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                )
                return names or None
    return None


def check_override_sections(overrides: Sequence[str], sections: Sequence[str] | None = None) -> None:
    """An override of a section ``ConfigContainer`` does not have (``modle.seq_length=...``) is refused with the
    nearest section, before the Megatron import; with ``+``/``++`` Megatron-Bridge would skip it with a log line."""
    import difflib

    known = config_sections() if sections is None else tuple(sections)
    if not known:
        return
    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~").strip()
        section = key.split(".", 1)[0]
        if not section or section in known:
            continue
        public = [name for name in known if not name.startswith("_")]
        near = difflib.get_close_matches(section, public, n=1)
        rest = key[len(section) :]
        hint = f"did you mean {near[0] + rest!r}?" if near else f"the sections are {', '.join(public)}"
        raise UsageError(
            f"override {text!r}: {section!r} is not a section of Megatron-Bridge's ConfigContainer ({hint})"
        )


def apply_overrides(cfg: ConfigContainer, overrides: Sequence[str], config_file: str | None = None) -> ConfigContainer:
    """Apply a YAML file and Hydra-style overrides with Megatron-Bridge's own ``process_config_with_overrides``."""
    if not overrides and not config_file:
        return cfg
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    try:
        return process_config_with_overrides(cfg, config_filepath=config_file, cli_overrides=list(overrides))
    except FileNotFoundError as exc:
        raise UsageError(f"--config-file: {exc}") from None
    except Exception as exc:  # noqa: BLE001  (OverridesError, omegaconf errors)
        first = str(exc).splitlines()[0]
        raise UsageError(f"Megatron-Bridge rejected the overrides: {first}{_did_you_mean(cfg, first)}") from None


def _did_you_mean(cfg: Any, message: str) -> str:
    """`` (did you mean 'model.context_parallel_size'?)`` for a misspelt field Megatron-Bridge could not override."""
    import dataclasses
    import difflib
    import re

    found = re.search(r"override '([\w.]+)'", message)
    if not found:
        return ""
    *parents, leaf = found.group(1).lstrip("+~").split(".")
    node = cfg
    for name in parents:
        node = node.get(name) if isinstance(node, dict) else getattr(node, name, None)
        if node is None:
            return ""
    if isinstance(node, dict):  # a free-form mapping (dataset_kwargs): Hydra adds a new key only with "+"
        if leaf in node:
            return ""
        return f" ({'.'.join(parents)} is a mapping without the key {leaf!r}: add it with ++{found.group(1)}=...)"
    if dataclasses.is_dataclass(node):
        names = [f.name for f in dataclasses.fields(node)]
    else:
        names = list(getattr(node, "__dict__", {}))
    held = getattr(node, leaf, None) if leaf in names else None
    if dataclasses.is_dataclass(held):  # a mapping merged into a config object: its parser keeps the object's class
        path = found.group(1).lstrip("+~")
        return (
            f" ({path} holds a {type(held).__name__}: a mapping is merged into it, so set {path}=null first, "
            f"then {path}={{_target_:...}})"
        )
    if leaf in names:
        return ""
    near = difflib.get_close_matches(leaf, names, n=1)
    return f" (did you mean {'.'.join([*parents, near[0]])!r}?)" if near else ""


def _merge(assignments: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Several fixes writing one field: keep the value that satisfies all (lcm of multiples, the larger size)."""
    merged: dict[str, Any] = {}
    for path, value in assignments:
        old = merged.get(path)
        if old is None or old == value:
            merged[path] = value
        elif (
            path.endswith(("pad_seq_to_mult", "pad_seq_length_to_mult"))
            and isinstance(old, int)
            and isinstance(value, int)
        ):
            merged[path] = math.lcm(old, value)
        elif isinstance(old, int) and isinstance(value, int) and not isinstance(old, bool):
            merged[path] = max(old, value)
        else:
            merged[path] = value
    return merged


def converged_fix(cfg: ConfigContainer, check: Any, rounds: int = 5) -> tuple[list[str], list[Any]]:
    """One set of overrides that clears every violation: apply all fixes together (conflicts merged), re-check,
    repeat. Returns the overrides and whatever violations remain (empty when it converged)."""
    import copy

    chosen: dict[str, Any] = {}
    work = copy.deepcopy(cfg)
    remaining = check(work)
    for _ in range(rounds):
        fixable = [v for v in remaining if v.assignments]
        if not fixable:
            break
        step = _merge((p, val) for v in fixable for p, val in v.assignments.items())
        chosen.update(step)
        work = apply_overrides(copy.deepcopy(cfg), [render_override(p, val) for p, val in chosen.items()])
        remaining = check(work)
    return [render_override(p, val) for p, val in chosen.items()], remaining
