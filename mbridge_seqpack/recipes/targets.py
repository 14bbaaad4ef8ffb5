"""Recipe targets as the command line, the planner and the NeMo-Run plugin name them: build one the way
Megatron-Bridge's recipe runner does (recipe function, YAML file, Hydra-style overrides) and find its world size."""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from mbridge_seqpack.errors import UsageError

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["quiet_megatron_import", "build_target", "build_launch", "Launch", "resolve_world"]


def quiet_megatron_import() -> None:
    """Import Megatron-Bridge once with its import-time warnings (Apex, Triton, experimental APIs) muted, for callers
    outside the command line (which filters the known ones itself: ``cli/startup.py``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.bridge.training.config  # noqa: F401


def _is_recipe_name(target: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", target) is not None


def _nearest_recipe(name: str) -> str:
    """`` (did you mean 'llama3_8b_sft_config'?)`` among the packaged names and ``megatron.bridge.recipes``'."""
    import difflib

    import megatron.bridge.recipes as megatron_recipes

    from mbridge_seqpack.recipes import list_recipes

    names = [n for n in dir(megatron_recipes) if n.endswith("_config") and not n.startswith("_")] + list_recipes()
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def build_target(target: str, overrides: Sequence[str], config_file: str | None = None) -> tuple[Any, Any]:
    """Build a recipe and apply a YAML file and Hydra-style overrides exactly as Megatron-Bridge's runner does
    (``process_config_with_overrides``); override syntax is checked before the Megatron import."""
    launch = build_launch(target, overrides, config_file, runner=False)
    return launch.cfg, launch.info


@dataclass
class Launch:
    """A config as it will be launched: the recipe, the overrides and, under Megatron-Bridge's runner, its fixes."""

    cfg: ConfigContainer
    info: Any  # the packaged recipe's RecipeInfo, else None
    world_size: int | None = None  # declared by the recipe (packaged, or ``_<N>gpu`` in a Megatron-Bridge name)
    runner_changes: list[Any] = field(default_factory=list)
    runner: bool = False

    def notes(self) -> list[str]:
        if not self.runner:
            return []
        if not self.runner_changes:
            return ["modelled as Megatron-Bridge's run_recipe.py launches it: its pre-launch fixes change nothing"]
        return [c.describe() for c in self.runner_changes]


def build_launch(
    target: str, overrides: Sequence[str], config_file: str | None = None, *, runner: bool | None = None
) -> Launch:
    """Build ``target``: a packaged recipe, ``file.py[:function]``, or any Megatron-Bridge recipe name as
    ``run_recipe.py --recipe NAME`` resolves it. ``runner`` (default: on for Megatron-Bridge names) applies the
    runner's pre-launch fixes after the overrides, as it does, and records them."""
    from mbridge_seqpack.overrides import apply_overrides, check_override_syntax
    from mbridge_seqpack.recipes import list_recipes, load_recipe_target
    from mbridge_seqpack.recipes.runner import build_megatron_recipe, runner_fixes

    if overrides:  # Hydra's parser is a second's import without cached bytecode: not for nothing
        check_override_syntax(overrides)
    megatron_name = not target.partition(":")[0].endswith(".py") and target not in list_recipes()
    if megatron_name and not _is_recipe_name(target):
        load_recipe_target(target)  # its error names the packaged recipes
    mode = "finetune"
    if megatron_name:
        import megatron.bridge.training.config  # noqa: F401  (the ~40 s import; the CLI filters its noise)

        try:
            fn, mode = build_megatron_recipe(target)
        except ValueError as exc:
            raise UsageError(
                f"{exc}{_nearest_recipe(target)}; packaged recipes: {', '.join(list_recipes())}"
            ) from None
        info = None
        gpus = re.search(r"_(\d+)gpu", target)
        declared = int(gpus.group(1)) if gpus else None
    else:
        fn, info = load_recipe_target(target)
        declared = info.world_size if info is not None else None
        import megatron.bridge.training.config  # noqa: F401
    cfg = apply_overrides(fn(), overrides, config_file)
    use_runner = megatron_name if runner is None else runner
    changes = runner_fixes(cfg, mode) if use_runner else []
    return Launch(cfg, info, declared, changes, use_runner)


def resolve_world(explicit: int | None, info: Any) -> int:
    """The explicit world size, else the recipe's declared one (a packaged recipe's, or the GPU count in a
    Megatron-Bridge recipe name), else ``$WORLD_SIZE`` (default 1)."""
    if explicit is not None:
        return explicit
    if isinstance(info, Launch):
        if info.world_size is not None:
            return info.world_size
        info = info.info
    if info is not None:
        return info.world_size
    return int(os.environ.get("WORLD_SIZE", "1"))
