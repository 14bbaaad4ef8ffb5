"""Recipe targets as the command line, the planner and the NeMo-Run plugin name them: build one the way
Megatron-Bridge's recipe runner does (recipe function, YAML file, Hydra-style overrides) and find its world size."""

from __future__ import annotations

import os
import warnings
from typing import Any, Sequence

__all__ = ["quiet_megatron_import", "build_target", "resolve_world"]


def quiet_megatron_import() -> None:
    """Import Megatron-Bridge once with its import-time warnings (Apex, Triton, experimental APIs) muted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.bridge.training.config  # noqa: F401


def build_target(target: str, overrides: Sequence[str], config_file: str | None = None) -> tuple[Any, Any]:
    """Build a recipe and apply a YAML file and Hydra-style overrides exactly as Megatron-Bridge's runner does
    (``process_config_with_overrides``); override syntax is checked before the Megatron import."""
    from mbridge_seqpack.overrides import apply_overrides, check_override_syntax
    from mbridge_seqpack.recipes import load_recipe_target

    check_override_syntax(overrides)
    fn, info = load_recipe_target(target)
    quiet_megatron_import()
    return apply_overrides(fn(), overrides, config_file), info


def resolve_world(explicit: int | None, info: Any) -> int:
    """The explicit world size, else the packaged recipe's declared one, else ``$WORLD_SIZE`` (default 1)."""
    if explicit is not None:
        return explicit
    if info is not None:
        return info.world_size
    return int(os.environ.get("WORLD_SIZE", "1"))
