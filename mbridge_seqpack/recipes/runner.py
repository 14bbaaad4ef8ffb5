"""Megatron-Bridge's recipe runner: how it finds a recipe by name, and what it changes before launch.

``scripts/training/run_recipe.py`` (with ``recipe_runner.py`` and ``recipe_metadata.py`` beside it; release
branch r0.6.0, commit 6124fbe) resolves ``--recipe NAME`` in ``megatron.bridge.perf_recipes`` (flat benchmark names)
or ``megatron.bridge.recipes`` and its ``<family>.h100`` modules, applies the overrides, and then repairs three
things ``check`` would otherwise report:
``sync_finetuning_cp_invariants`` (per-token loss and no in-collective averaging for SFT at CP > 1),
``sync_offline_packing_alignment`` (``packed_sequence_size = dataset.seq_length`` and ``pad_seq_to_mult`` the lcm
of 2*CP and CP*TP under sequence parallelism) and ``sync_model_dataset_sequence_length``.

The runner is not in the wheel. When its directory is known (``$MBRIDGE_SEQPACK_RUNNER_DIR``, or the
``scripts/training`` of an NGC container's ``/opt/Megatron-Bridge``), its own functions are used; otherwise they are
restated here, function by function, and ``tests/recipes/runner_fixes.json`` (recorded from the script itself by
``scripts/record_runner_fixes.py``) holds the two to the same results.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import pkgutil
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from mbridge_seqpack.errors import UsageError

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "RUNNER_DIR_ENV",
    "MODELLED",
    "RunnerArgs",
    "implementation",
    "public_mode",
    "before_overrides",
    "sync_model_pipeline_layout",
    "RunnerChange",
    "infer_recipe_mode",
    "find_benchmark_recipe",
    "find_megatron_recipe",
    "build_megatron_recipe",
    "runner_fixes",
    "runner_module",
]

RUNNER_DIR_ENV = "MBRIDGE_SEQPACK_RUNNER_DIR"
#: the runner implementation restated here (``check`` names it, or the directory of the runner it used)
MODELLED = "Megatron-Bridge scripts/training/run_recipe.py r0.6.0 (commit 6124fbe)"


@dataclass(frozen=True)
class RunnerArgs:
    """What of a run_recipe.py command line changes the config beyond its overrides (``cli/launch_line.py``)."""

    mode: str | None = None  # the public mode (pretrain, sft, lora, dora); None: inferred from the recipe name
    dataset: str | None = None  # a ``DATASET_PRESETS`` name
    deterministic: bool = False


_CONTAINER_RUNNER = Path("/opt/Megatron-Bridge/scripts/training")


@dataclass(frozen=True)
class RunnerChange:
    """One field the runner sets before launch: ``field`` from ``before`` to ``after``, by the runner's ``by``."""

    field: str
    before: Any
    after: Any
    by: str

    def describe(self) -> str:
        return f"the runner will set {self.field}={self.after} (was {self.before}; {self.by})"


def runner_module() -> ModuleType | None:
    """The runner's ``recipe_runner`` module when its directory is known, else None (the restatement is used)."""
    directory = os.environ.get(RUNNER_DIR_ENV) or (str(_CONTAINER_RUNNER) if _CONTAINER_RUNNER.is_dir() else "")
    if not directory or not (Path(directory) / "recipe_runner.py").is_file():
        return None
    if directory not in sys.path:
        sys.path.insert(0, directory)  # it imports recipe_metadata from its own directory
    try:
        return importlib.import_module("recipe_runner")
    except Exception:  # noqa: BLE001  (another runner version that cannot import here: use the restatement)
        return None


def infer_recipe_mode(name: str) -> str | None:
    """``recipe_metadata.infer_recipe_mode``: the training mode a conventional recipe name encodes."""
    normalized = f"_{name.lower().strip('_')}_"
    if "_pretrain_" in normalized:
        return "pretrain"
    if "_sft_" in normalized or "_finetune_" in normalized:
        return "sft"
    if "_dora_" in normalized:
        return "dora"
    if "_peft_" in normalized or "_lora_" in normalized:
        return "lora"
    return None


def train_mode(mode: str | None) -> str:
    """``run_recipe._train_mode``: every mode but pretraining runs ``finetune()``."""
    return "pretrain" if mode == "pretrain" else "finetune"


def _h100_modules(package: ModuleType) -> list[str]:
    names = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg and not info.name.startswith("_") and info.name != "utils":
            names.append(f"{package.__name__}.{info.name}.h100")
    return sorted(names)


#: ``recipe_metadata.BENCHMARK_RECIPE_FAMILY_PREFIXES`` and ``BENCHMARK_RECIPE_PATTERN``: a flat benchmark name
#: and the ``megatron.bridge.perf_recipes`` family package that exports it
_BENCHMARK_FAMILIES = (
    ("qwen3_vl_", "qwen_vl"),
    ("qwen35_vl_", "qwen_vl"),
    ("deepseek_", "deepseek"),
    ("gpt_oss_", "gpt_oss"),
    ("nemotron", "nemotronh"),
    ("llama", "llama"),
    ("qwen", "qwen"),
    ("kimi_", "kimi"),
    ("glm5", "glm_moe_dsa"),
    ("wan_", "wan"),
)
_BENCHMARK_NAME = re.compile(
    r"_(?P<task>pretrain|sft|peft)_(?P<num_gpus>[1-9][0-9]*)gpu_(?P<hardware>[a-z0-9]+)_"
    r"(?P<precision>bf16|fp8cs|fp8mx|fp8sc|nvfp4)(?:_[a-z0-9_]+)?_config$"
)


def find_benchmark_recipe(name: str) -> Callable[..., Any] | None:
    """``recipe_runner.find_benchmark_recipe`` for a name ``recipe_metadata.resolved_benchmark_recipe_metadata``
    accepts: ``..._<N>gpu_<hardware>_<precision>[_...]_config`` exported by its family's package (the runner
    indexes those exports from the packages' ``__init__.py`` source; the attribute is the same name)."""
    if not _BENCHMARK_NAME.search(name):
        return None
    family = next((family for prefix, family in _BENCHMARK_FAMILIES if name.startswith(prefix)), None)
    if family is None:
        return None
    try:
        module = importlib.import_module(f"megatron.bridge.perf_recipes.{family}")
    except ModuleNotFoundError:
        return None
    found = getattr(module, name, None)
    return found if callable(found) else None


def find_megatron_recipe(name: str) -> Callable[..., Any] | None:
    """``recipe_runner.load_recipe``'s lookup: a benchmark recipe of ``megatron.bridge.perf_recipes`` first (it wins
    a name both packages export, e.g. ``llama3_70b_sft_32gpu_h100_bf16_config``), else
    ``recipe_runner.find_library_recipe``: an attribute of ``megatron.bridge.recipes`` or of one of its
    ``<family>.h100`` modules."""
    benchmark = find_benchmark_recipe(name)
    if benchmark is not None:
        return benchmark
    import megatron.bridge.recipes as recipes

    found = getattr(recipes, name, None)
    if callable(found):
        return found
    for module_name in _h100_modules(recipes):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        found = getattr(module, name, None)
        if callable(found):
            return found
    return None


def _recipe_kwargs(builder: Callable[..., Any], peft_scheme: str | None) -> dict[str, Any]:
    """``recipe_runner._recipe_kwargs_for_signature`` for the PEFT scheme (the runner passes no seq_length)."""
    if peft_scheme is None:
        return {}
    try:
        params = inspect.signature(builder).parameters
    except (ValueError, TypeError):
        return {"peft": peft_scheme}
    if "peft_scheme" in params:
        return {"peft_scheme": peft_scheme}
    if "peft" in params or any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return {"peft": peft_scheme}
    return {}


def public_mode(name: str, mode: str | None) -> str:
    """``run_recipe._infer_mode`` and ``_validate_recipe_mode``: the public mode of a launch of recipe ``name``."""
    inferred = infer_recipe_mode(name)
    if mode is None:
        if inferred is None:
            raise UsageError(
                f"Unable to infer training mode of {name!r}; pass --mode (pretrain, sft, lora or dora), as "
                "run_recipe.py asks"
            )
        return inferred
    task = {"lora": "peft", "dora": "peft"}
    if inferred is not None and task.get(inferred, inferred) != task.get(mode, mode):
        raise UsageError(f"Mode '{mode}' is incompatible with recipe '{name}' (run_recipe.py refuses it too)")
    return mode


def build_megatron_recipe(name: str, mode: str | None = None) -> tuple[Callable[[], Any], str]:
    """A builder for Megatron-Bridge recipe ``name`` as ``run_recipe.py --recipe NAME [--mode MODE]`` loads it, and
    the training loop it runs (``pretrain`` or ``finetune``); UsageError when the runner would not find it either."""
    builder = find_megatron_recipe(name)
    if builder is None:
        raise UsageError(
            f"recipe {name!r} not found in megatron.bridge.recipes (nor its <family>.h100 modules) or "
            "megatron.bridge.perf_recipes"
        )
    mode = public_mode(name, mode) if mode is not None or infer_recipe_mode(name) is not None else None
    kwargs = _recipe_kwargs(builder, mode if mode in ("lora", "dora") else None)
    return (lambda: builder(**kwargs)), train_mode(mode)


def implementation() -> str:
    """Which runner ``check`` modelled: the runner's own module (its directory), else the restatement of
    :data:`MODELLED`."""
    module = runner_module()
    if module is not None:
        return f"Megatron-Bridge's own recipe_runner.py ({Path(module.__file__).parent})"
    return f"{MODELLED}, restated in mbridge_seqpack/recipes/runner.py"


def _apply_determinism(config: ConfigContainer) -> None:
    """``recipe_runner.apply_determinism(deterministic=True)``: Megatron-Bridge's own
    ``apply_determinism_overrides`` (deterministic_mode on, cross-entropy fusion off, TP comm overlap off, the
    cuBLAS/NCCL environment variables)."""
    from megatron.bridge.recipes.utils.determinism_utils import apply_determinism_overrides

    apply_determinism_overrides(config)


def _apply_dataset(config: ConfigContainer, dataset: str, mode: str) -> None:
    """``run_recipe._apply_dataset``: the dataset preset replaces the recipe's dataset; its training loop must be
    the mode's."""
    from megatron.bridge.recipes.utils.dataset_utils import build_dataset_config, dataset_train_mode

    try:
        config.dataset = build_dataset_config(config, dataset)
    except ValueError as exc:
        raise UsageError(f"--dataset {dataset}: {exc}") from None
    if dataset_train_mode(config.dataset) != mode:
        raise UsageError(f"--dataset {dataset} is for {dataset_train_mode(config.dataset)}, not this {mode} launch")


#: (field, the runner function that may set it) before the overrides, in run_recipe.main()'s order
BEFORE_OVERRIDES = (
    ("dataset", "_apply_dataset, --dataset"),
    ("model.deterministic_mode", "apply_determinism, --deterministic"),
    ("model.cross_entropy_loss_fusion", "apply_determinism, --deterministic"),
    ("comm_overlap.tp_comm_overlap", "apply_determinism, --deterministic"),
)


def before_overrides(config: ConfigContainer, args: RunnerArgs, mode: str) -> list[RunnerChange]:
    """What run_recipe.main() does between loading the recipe and applying the overrides (``--dataset``,
    ``--deterministic``), applied to ``config`` in place, and what it changed."""
    before = {field: _read(config, field) for field, _ in BEFORE_OVERRIDES}
    if args.dataset is not None:
        _apply_dataset(config, args.dataset, mode)
    if args.deterministic:
        module = runner_module()
        if module is not None:
            module.apply_determinism(config, deterministic=True)
        else:
            _apply_determinism(config)
    changes = []
    for field, by in BEFORE_OVERRIDES:
        after = _read(config, field)
        if field == "dataset":
            if args.dataset is not None:
                preset = f"the {args.dataset} preset, a {type(after).__name__}"
                changes.append(RunnerChange(field, type(before[field]).__name__, preset, by))
        elif after != before[field]:
            changes.append(RunnerChange(field, before[field], after, by))
    return changes


def _sync_model_pipeline_layout(config: ConfigContainer, overrides: list[str]) -> None:
    """``recipe_runner.sync_model_pipeline_layout``: a PP or VP override rebuilds a recipe-owned pipeline layout
    (``model._pipeline_model_parallel_layout_builder``) unless the layout is overridden too."""
    fields = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    if not fields & {"model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"}:
        return
    if "model.pipeline_model_parallel_layout" in fields:
        return
    model = getattr(config, "model", None)
    builder = getattr(model, "_pipeline_model_parallel_layout_builder", None)
    if builder is None:
        return
    model.pipeline_model_parallel_layout = builder(
        model.pipeline_model_parallel_size, model.virtual_pipeline_model_parallel_size
    )


def sync_model_pipeline_layout(config: ConfigContainer, overrides: list[str]) -> list[RunnerChange]:
    """The runner's first step after the overrides, applied in place (its own function when available)."""
    field = "model.pipeline_model_parallel_layout"
    before = _read(config, field)
    module = runner_module()
    if module is not None:
        module.sync_model_pipeline_layout(config, cli_overrides=list(overrides))
    else:
        _sync_model_pipeline_layout(config, list(overrides))
    after = _read(config, field)
    return [] if after == before else [RunnerChange(field, before, after, "sync_model_pipeline_layout")]


def _cp_sizes(config: ConfigContainer) -> set[int]:
    sizes = {getattr(config.model, "context_parallel_size", 1)}
    eval_cp = getattr(getattr(config, "dist", None), "eval_context_parallel_size", None)
    if eval_cp is not None:
        sizes.add(eval_cp)
    return sizes


def _sync_finetuning_cp_invariants(config: ConfigContainer, mode: str) -> None:
    """``recipe_runner.sync_finetuning_cp_invariants``."""
    dataset = getattr(config, "dataset", None)
    finetuning = hasattr(dataset, "enable_offline_packing") or hasattr(dataset, "enable_in_batch_packing")
    if mode != "finetune" or not finetuning:
        return
    if any(size > 1 for size in _cp_sizes(config)):
        if hasattr(config.model, "calculate_per_token_loss"):
            config.model.calculate_per_token_loss = True
        ddp = getattr(config, "ddp", None)
        if ddp is not None and hasattr(ddp, "average_in_collective"):
            ddp.average_in_collective = False


def _sync_offline_packing_alignment(config: ConfigContainer) -> None:
    """``recipe_runner.sync_offline_packing_alignment``."""
    dataset = getattr(config, "dataset", None)
    if not getattr(dataset, "enable_offline_packing", False):
        return
    from megatron.bridge.data.packing import PackedSequenceSpecs

    specs = getattr(dataset, "offline_packing_specs", None)
    if specs is None:
        specs = dataset.offline_packing_specs = PackedSequenceSpecs()
    elif isinstance(specs, dict):
        specs = dataset.offline_packing_specs = PackedSequenceSpecs(**specs)
    if getattr(dataset, "seq_length", None) is not None:
        specs.packed_sequence_size = dataset.seq_length
    from mbridge_seqpack.analysis.topology import alignment_multiple  # the runner's lcm(2*CP, CP*TP if SP) formula

    tp = getattr(config.model, "tensor_model_parallel_size", 1)
    sp = bool(getattr(config.model, "sequence_parallel", False))
    need = alignment_multiple(tp, tuple(sorted(_cp_sizes(config))), sp)
    specs.pad_seq_to_mult = math.lcm(specs.pad_seq_to_mult or 1, need)


def _sync_model_dataset_sequence_length(config: ConfigContainer) -> None:
    """``recipe_runner.sync_model_dataset_sequence_length``."""
    model, dataset = getattr(config, "model", None), getattr(config, "dataset", None)
    if model is None or dataset is None or not hasattr(model, "seq_length"):
        return
    length = getattr(dataset, "seq_length", None)
    if length is None:
        length = getattr(dataset, "sequence_length", None)
    if length is not None and model.seq_length != length:
        model.seq_length = length


#: (field, the runner function that may set it), in the order run_recipe.main() calls them
WATCHED = (
    ("model.calculate_per_token_loss", "sync_finetuning_cp_invariants"),
    ("ddp.average_in_collective", "sync_finetuning_cp_invariants"),
    ("dataset.offline_packing_specs.packed_sequence_size", "sync_offline_packing_alignment"),
    ("dataset.offline_packing_specs.pad_seq_to_mult", "sync_offline_packing_alignment"),
    ("model.seq_length", "sync_model_dataset_sequence_length"),
)


def _read(config: Any, dotted: str) -> Any:
    value = config
    for part in dotted.split("."):
        value = getattr(value, part, None)
    return value


def runner_fixes(config: ConfigContainer, mode: str) -> list[RunnerChange]:
    """Apply the runner's pre-launch repairs to ``config`` in place (its own functions when available) and say
    what changed. ``mode`` is the training loop: ``"finetune"`` or ``"pretrain"``."""
    before = {field: _read(config, field) for field, _ in WATCHED}
    module = runner_module()
    if module is not None:
        module.sync_finetuning_cp_invariants(config, mode=mode)
        module.sync_offline_packing_alignment(config)
        module.sync_model_dataset_sequence_length(config)
    else:
        _sync_finetuning_cp_invariants(config, mode)
        _sync_offline_packing_alignment(config)
        _sync_model_dataset_sequence_length(config)
    return [
        RunnerChange(field, before[field], _read(config, field), by)
        for field, by in WATCHED
        if _read(config, field) != before[field]
    ]
