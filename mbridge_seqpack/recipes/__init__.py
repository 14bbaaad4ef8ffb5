"""Recipes: the packaged long-context recipes, the loader of user recipe files and the runner model.

The registry of packaged recipes and the loader for user recipe files (this module), the building
blocks recipes are written with (``building_blocks``: providers built offline, SFT bases, the ``@recipe``
marker), building a target as Megatron-Bridge's runner does (``targets``) and its pre-launch fixes (``runner``);
the recipe files themselves are the checkout's top-level ``recipes/`` (shipped in the wheel as ``packaged/``).

Packaged recipes are plain Python files whose functions are marked with
:func:`mbridge_seqpack.recipes.building_blocks.recipe`. They import Megatron-Bridge inside their function bodies,
so listing recipes stays fast.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from mbridge_seqpack.errors import UsageError
from mbridge_seqpack.recipes.building_blocks import RecipeInfo

__all__ = ["recipes_dir", "list_recipes", "recipe_info", "build_recipe", "load_recipe_target"]


def recipes_dir() -> Path:
    """The recipe files: ``recipes/`` at the top of a checkout, their one source, which the wheel ships as
    ``mbridge_seqpack/recipes/packaged`` (``force-include`` in pyproject.toml)."""
    shipped = Path(__file__).resolve().parent / "packaged"
    return shipped if shipped.is_dir() else Path(__file__).resolve().parents[2] / "recipes"


def _load_module(path: Path, *, user: bool = False) -> ModuleType:
    """Import a recipe file; what a ``user`` file raises is the user's error, with its file:line (``user_code``)."""
    name = f"mbridge_seqpack_recipe_{path.stem}"
    if user:  # two users' files of one name (my_recipe.py in two directories) are two modules
        name = f"mbridge_seqpack_user_recipe_{path.stem}_{abs(hash(str(path))):x}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"recipe file {path} cannot be imported; it must be a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[name]
        if user and isinstance(exc, Exception):
            from mbridge_seqpack.recipes.user_code import load_failure

            raise load_failure(path, exc) from None
        raise
    return module


def _packaged() -> dict[str, Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {}
    for path in sorted(recipes_dir().glob("*.py")):
        if path.name.startswith("_"):
            continue
        for value in vars(_load_module(path)).values():
            info = getattr(value, "seqpack_recipe", None)
            if isinstance(info, RecipeInfo):
                if info.name in found:
                    raise RuntimeError(f"two packaged recipes are named {info.name!r}")
                found[info.name] = value
    return found


def list_recipes() -> list[str]:
    """Names of the packaged recipes, sorted."""
    return sorted(_packaged())


def recipe_info(name: str) -> RecipeInfo:
    """Metadata of one packaged recipe."""
    return _lookup(name).seqpack_recipe  # type: ignore[attr-defined]


def _lookup(name: str) -> Callable[..., Any]:
    table = _packaged()
    if name not in table:
        raise UsageError(f"unknown recipe {name!r}; packaged recipes: {', '.join(sorted(table))}")
    return table[name]


def build_recipe(name: str, **kwargs: Any) -> Any:
    """Build the ConfigContainer of a packaged recipe (offline; no Hugging Face hub)."""
    return _lookup(name)(**kwargs)


def load_recipe_target(target: str) -> tuple[Callable[..., Any], RecipeInfo | None]:
    """Resolve ``NAME`` (packaged) or ``path/to/file.py[:function]`` to a builder function.

    A file without ``:function`` must define exactly one marked recipe, or one function named
    ``recipe`` / ``config``.
    """
    path_part, _, fn_name = target.partition(":")
    if not path_part.endswith(".py"):
        fn = _lookup(target)
        return fn, fn.seqpack_recipe  # type: ignore[attr-defined]
    path = Path(path_part)
    if not path.is_file():
        raise UsageError(f"recipe file {path} does not exist")
    module = _load_module(path.resolve(), user=True)
    if fn_name:
        fn = getattr(module, fn_name, None)
        if not callable(fn):
            raise UsageError(f"{path} has no function {fn_name!r}")
        return fn, getattr(fn, "seqpack_recipe", None)
    marked = [v for v in vars(module).values() if isinstance(getattr(v, "seqpack_recipe", None), RecipeInfo)]
    if len(marked) == 1:
        return marked[0], marked[0].seqpack_recipe
    for default in ("recipe", "config"):
        if callable(getattr(module, default, None)):
            return getattr(module, default), None
    raise UsageError(
        f"{path} defines {len(marked)} marked recipes and no recipe()/config() function; name one as {path}:FUNCTION"
    )
