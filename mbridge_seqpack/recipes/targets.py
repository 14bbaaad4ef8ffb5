"""Recipe targets as the command line, the planner and the NeMo-Run plugin name them: build one the way
Megatron-Bridge's recipe runner does (recipe function, YAML file, Hydra-style overrides) and find its world size."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from mbridge_seqpack.errors import UsageError

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "quiet_megatron_import",
    "build_target",
    "build_launch",
    "Launch",
    "resolve_world",
    "world_and_source",
    "import_megatron",
]


def quiet_megatron_import() -> None:
    """Import Megatron-Bridge once with its import-time warnings (Apex, Triton, experimental APIs) muted, for callers
    outside the command line (which filters the known ones itself: ``cli/startup.py``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.bridge.training.config  # noqa: F401


def _is_recipe_name(target: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", target) is not None


def _nearest_recipe(name: str) -> str:
    """`` (did you mean 'llama3_8b_sft_config'?)`` among Megatron-Bridge's recipe names (read from its source) and
    the packaged ones."""
    from mbridge_seqpack.recipes import list_recipes
    from mbridge_seqpack.recipes.names import nearest_name

    return nearest_name(name, list_recipes())


def _not_found(name: str) -> UsageError:
    from mbridge_seqpack.recipes import list_recipes

    return UsageError(
        f"recipe {name!r} not found in megatron.bridge.recipes (nor its <family>.h100 modules) or "
        f"megatron.bridge.perf_recipes{_nearest_recipe(name)}; packaged recipes: {', '.join(list_recipes())}"
    )


def import_megatron() -> None:
    """Megatron-Bridge's config module (the 40-90 s import); an installation that cannot import it is the user's
    environment, said in a line (a failure inside the plugin's own modules stays a bug)."""
    try:
        import megatron.bridge.training.config  # noqa: F401
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001
        import traceback

        frames = traceback.extract_tb(exc.__traceback__)
        if frames and f"{os.sep}mbridge_seqpack{os.sep}" in frames[-1].filename:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UsageError(
            f"Megatron-Bridge cannot be imported here ({type(exc).__name__}: {first}); repair the installation "
            "until `python -c 'import megatron.bridge'` works"
        ) from None


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
    modelled: str = ""  # which runner implementation (``runner.implementation()``)
    benchmark: bool = False  # a megatron.bridge.perf_recipes recipe, whose benchmark defaults are not modelled
    source_note: str | None = None  # the user's dataset_root replaced the recipe's source (``data_source``)
    overrides: list[str] = field(default_factory=list)  # what was applied: the source drops, then the user's

    def notes(self) -> list[str]:
        if not self.runner:
            return []
        modelled = f"modelled: {self.modelled}"
        if self.benchmark:
            modelled += (
                "; not modelled: a benchmark recipe's flat-runner defaults (mock dataset for text SFT, "
                "precision-aware optimizer, global batch weak-scaled to the DP size)"
            )
        if not self.runner_changes:
            return [modelled, "its pre-launch steps change nothing in this config"]
        return [modelled, *(c.describe() for c in self.runner_changes)]


def build_launch(
    target: str,
    overrides: Sequence[str],
    config_file: str | None = None,
    *,
    runner: bool | None = None,
    runner_args: Any = None,
    own_data: bool = False,
) -> Launch:
    """Build ``target``: a packaged recipe, ``file.py[:function]``, or any Megatron-Bridge recipe name as
    ``run_recipe.py --recipe NAME`` resolves it. ``runner`` (default: on for Megatron-Bridge names) applies the
    runner's pre-launch steps, in run_recipe.main()'s order, and records them: ``runner_args``
    (``runner.RunnerArgs``: ``--mode``, ``--dataset``, ``--deterministic``) before the overrides, the pipeline
    layout and the three repairs after; given runner options turn the runner on.

    What the user gave is checked before the Megatron import (override syntax, the config file's YAML, the recipe
    name or file); what the recipe's code raises, or a value that is not a ConfigContainer, is the user's error
    (``user_code``), and the Hugging Face hub out of reach fails at once (``hub``). ``own_data``: a
    ``dataset.dataset_root`` override replaces the recipe's Hugging Face source (``data_source``; ``pack``)."""
    from mbridge_seqpack.overrides import apply_overrides, check_override_sections, check_override_syntax
    from mbridge_seqpack.recipes import list_recipes, load_recipe_target
    from mbridge_seqpack.recipes.config_file import check_config_keys, read_config_file
    from mbridge_seqpack.recipes.data_source import source_overrides
    from mbridge_seqpack.recipes.hub import fail_fast, no_retries_offline
    from mbridge_seqpack.recipes.names import is_written
    from mbridge_seqpack.recipes.runner import (
        RunnerArgs,
        before_overrides,
        build_megatron_recipe,
        find_benchmark_recipe,
        implementation,
        runner_fixes,
        sync_model_pipeline_layout,
        train_mode,
    )
    from mbridge_seqpack.recipes.user_code import call_builder, not_a_config

    if overrides:  # Hydra's parser is a second's import without cached bytecode: not for nothing
        check_override_syntax(overrides)
        check_override_sections(overrides)
    yaml_keys = read_config_file(config_file) if config_file else []
    file_part = target.partition(":")[0]
    megatron_name = not file_part.endswith(".py") and target not in list_recipes()
    if megatron_name and not _is_recipe_name(target):
        load_recipe_target(target)  # its error names the packaged recipes
    if megatron_name and not is_written(target):
        raise _not_found(target)
    args = runner_args or RunnerArgs()
    mode = train_mode(args.mode) if args.mode is not None else "finetune"
    # a packaged recipe builds offline; a recipe file or a Megatron-Bridge recipe may ask the hub
    with fail_fast() if megatron_name or file_part.endswith(".py") else contextlib.nullcontext():
        if megatron_name:
            import_megatron()
            try:
                fn, mode = build_megatron_recipe(target, args.mode)
            except UsageError as exc:
                if "not found in" not in str(exc):
                    raise
                raise _not_found(target) from None
            info, label, path, user = None, f"Megatron-Bridge recipe {target}", None, True
            gpus = re.search(r"_(\d+)gpu", target)
            declared = int(gpus.group(1)) if gpus else None
        else:
            fn, info = load_recipe_target(target)
            declared = info.world_size if info is not None else None
            user = file_part.endswith(".py")
            path = Path(file_part) if user else None
            label = f"recipe {target}" if user else f"packaged recipe {target}"
            if not user:  # its function imports torch first: the status line names Megatron-Bridge, the longer wait
                import_megatron()
        with no_retries_offline() if "megatron.bridge" in sys.modules else contextlib.nullcontext():
            built = call_builder(fn, label, path=path, user=user)
    wrong = not_a_config(label, built)
    if wrong is not None:
        raise wrong
    import_megatron()
    use_runner = (megatron_name or args != RunnerArgs()) if runner is None else runner
    changes = before_overrides(built, args, mode) if use_runner else []
    if yaml_keys:
        check_config_keys(built, config_file, yaml_keys)
    drops, source_note = source_overrides(built, overrides) if own_data else ([], None)
    overrides = [*drops, *overrides]
    cfg = apply_overrides(built, overrides, config_file)
    if use_runner:
        changes += sync_model_pipeline_layout(cfg, list(overrides))
        changes += runner_fixes(cfg, mode)
    benchmark = megatron_name and find_benchmark_recipe(target) is not None
    modelled = implementation() if use_runner else ""
    return Launch(cfg, info, declared, changes, use_runner, modelled, benchmark, source_note, list(overrides))


def _environment_world() -> tuple[int, str] | None:
    """``run_recipe._current_world_size``: ``$WORLD_SIZE`` (torchrun), else ``$SLURM_NTASKS``."""
    for name in ("WORLD_SIZE", "SLURM_NTASKS"):
        value = os.environ.get(name)
        if value is None:
            continue
        if not value.strip().isdigit() or int(value) < 1:
            raise UsageError(f"${name}={value!r}: expected a positive GPU count")
        return int(value), f"${name}"
    return None


def world_and_source(explicit: int | None, info: Any, launcher: tuple[int, str] | None = None) -> tuple[int, str]:
    """The world size and where it came from: ``--world-size``; else a pasted launch line's ``--nproc-per-node`` x
    ``--nnodes``; else, for a launch under the runner, ``$WORLD_SIZE``/``$SLURM_NTASKS`` (what torchrun or Slurm
    gives it); else the recipe's declared one (a packaged recipe's, or the GPU count in a Megatron-Bridge recipe
    name); else the environment's; else 1."""
    if explicit is not None:
        return explicit, "--world-size"
    if launcher is not None:
        return launcher
    environment = _environment_world()
    if isinstance(info, Launch):
        if info.runner and environment is not None:
            return environment
        if info.world_size is not None:
            return info.world_size, "the GPU count in the recipe name" if info.info is None else "the recipe"
        info = info.info
    if info is not None:
        return info.world_size, "the recipe"
    return environment if environment is not None else (1, "the default")


def resolve_world(explicit: int | None, info: Any, launcher: tuple[int, str] | None = None) -> int:
    """:func:`world_and_source`'s world size."""
    return world_and_source(explicit, info, launcher)[0]
