"""``check`` takes what Megatron-Bridge's ``scripts/training/run_recipe.py`` (r0.6.0) takes, and a pasted launch line.

``check torchrun --nproc-per-node 8 --nnodes 2 scripts/training/run_recipe.py --recipe NAME -cp 2 key=value``: the
launcher and the script's path are dropped (the world size kept: ``--nproc-per-node`` x ``--nnodes``), and the
runner's options are ``check``'s own (:func:`add_runner_options`): ``--recipe``/``--model``, ``--mode``,
``--dataset``, ``--deterministic``, ``--step-func``, ``--dry-run``, ``--dump-env`` and the convenience flags, which
become the overrides the runner makes of them (``run_recipe._common_config_overrides``), before the trailing
``key=value`` ones. No Megatron import here.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Sequence

from mbridge_seqpack.errors import UsageError
from mbridge_seqpack.recipes.runner import RunnerArgs

__all__ = [
    "COMMON_OVERRIDE_FIELDS",
    "RunnerArgs",
    "runner_args",
    "strip_launcher",
    "add_runner_options",
    "runner_overrides",
    "runner_target",
    "launcher_world",
    "pack_launch_line",
]

#: ``run_recipe.COMMON_OVERRIDE_FIELDS``: (option dest, its flags, the config field it sets, its type)
COMMON_OVERRIDE_FIELDS: tuple[tuple[str, tuple[str, ...], str, type], ...] = (
    ("max_steps", ("-ms", "--max_steps"), "train.train_iters", int),
    ("global_batch_size", ("-gb", "--global_batch_size"), "train.global_batch_size", int),
    ("micro_batch_size", ("-mb", "--micro_batch_size"), "train.micro_batch_size", int),
    ("seq_length", ("-sl", "--seq_length"), "dataset.seq_length", int),
    ("tensor_model_parallel_size", ("-tp", "--tensor_model_parallel_size"), "model.tensor_model_parallel_size", int),
    (
        "pipeline_model_parallel_size",
        ("-pp", "--pipeline_model_parallel_size"),
        "model.pipeline_model_parallel_size",
        int,
    ),
    ("context_parallel_size", ("-cp", "--context_parallel_size"), "model.context_parallel_size", int),
    (
        "virtual_pipeline_model_parallel_size",
        ("-vp", "--virtual_pipeline_model_parallel_size"),
        "model.virtual_pipeline_model_parallel_size",
        int,
    ),
    ("expert_model_parallel_size", ("-ep", "--expert_model_parallel_size"), "model.expert_model_parallel_size", int),
    (
        "expert_tensor_parallel_size",
        ("-etp", "--expert_tensor_parallel_size"),
        "model.expert_tensor_parallel_size",
        int,
    ),
    ("lr", ("--lr",), "optimizer.lr", float),
    ("min_lr", ("--min_lr",), "optimizer.min_lr", float),
    ("warmup_iters", ("--warmup_iters",), "scheduler.lr_warmup_iters", int),
    ("pretrained_checkpoint", ("--pretrained_checkpoint",), "checkpoint.pretrained_checkpoint", str),
    ("save_dir", ("--save_dir",), "checkpoint.save", str),
    ("load_dir", ("--load_dir",), "checkpoint.load", str),
    ("save_interval", ("--save_interval",), "checkpoint.save_interval", int),
)
#: ``run_recipe._build_parser``'s ``--mode`` choices and ``recipe_metadata.recipe_task``
MODES = ("pretrain", "sft", "lora", "dora")
#: ``DATASET_PRESETS`` of Megatron-Bridge 0.6.2 (``recipes/utils/dataset_utils.py``); checked again there
DATASETS = (
    "cord-v2",
    "gsm8k",
    "llava-video-178k",
    "local-jsonl",
    "local-vlm",
    "medpix",
    "megatron-indexed",
    "mock",
    "openmathinstruct2",
    "openmathinstruct2-thinking",
    "raven",
    "rdr",
    "squad",
    "tulu3",
)
_LAUNCHER_OPTIONS = {"--nproc-per-node": "nproc_per_node", "--nproc_per_node": "nproc_per_node", "--nnodes": "nnodes"}


def strip_launcher(argv: Sequence[str]) -> list[str]:
    """``check``'s arguments (after the command name) with a pasted ``[torchrun|python ...] .../run_recipe.py``
    prefix made plain: everything up to the script is dropped but ``--nproc-per-node``/``--nnodes``, kept as
    ``check`` options."""
    argv = list(argv)
    script = next((i for i, a in enumerate(argv) if a.endswith("run_recipe.py")), None)
    if script is None:
        return argv
    kept: list[str] = []
    prefix = argv[:script]
    i = 0
    while i < len(prefix):
        name, eq, value = prefix[i].partition("=")
        if name in _LAUNCHER_OPTIONS:
            if not eq:
                i += 1
                value = prefix[i] if i < len(prefix) else ""
            kept += [f"--{_LAUNCHER_OPTIONS[name].replace('_', '-')}", value]
        i += 1
    return [*kept, *argv[script + 1 :]]


def _nodes(text: str) -> int:
    """torchrun's ``--nnodes``: ``N`` or ``MIN:MAX`` (elastic; the largest is what the check assumes)."""
    found = re.fullmatch(r"(\d+)(?::(\d+))?", text.strip())
    if not found or int(found.group(found.lastindex or 1)) < 1:
        raise UsageError(f"--nnodes {text!r}: expected N or MIN:MAX (torchrun's form)")
    return int(found.group(2) or found.group(1))


def launcher_world(args: argparse.Namespace) -> tuple[int, str] | None:
    """The world size a pasted launch line gives, and where it came from; None without ``--nproc-per-node``."""
    nproc, nnodes = getattr(args, "nproc_per_node", None), getattr(args, "nnodes", None)
    if nproc is None:
        if nnodes is not None:
            raise UsageError("--nnodes without --nproc-per-node: pass both (torchrun's) or --world-size")
        return None
    if not re.fullmatch(r"\d+", nproc) or int(nproc) < 1:
        raise UsageError(f"--nproc-per-node {nproc!r}: expected a GPU count (gpu/auto are not known here)")
    nodes = _nodes(nnodes) if nnodes is not None else 1
    return int(nproc) * nodes, f"--nproc-per-node {nproc} x --nnodes {nodes}"


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    """run_recipe.py's own options (r0.6.0), and torchrun's two that make the world size."""
    group = parser.add_argument_group("Megatron-Bridge run_recipe.py options (paste its command line after check)")
    group.add_argument("--recipe", default=None, help="recipe function name, as run_recipe.py --recipe takes it")
    group.add_argument("--model", default=None, help="model recipe stem: the recipe is <model>_<task>_config")
    group.add_argument("--mode", choices=MODES, default=None, help="training mode (default: from the recipe name)")
    group.add_argument(
        "--dataset",
        choices=DATASETS,
        default=None,
        metavar="PRESET",  # the choices in the usage line would run past 100 columns
        help=f"the runner's dataset preset: {', '.join(DATASETS)}",
    )
    group.add_argument("--deterministic", action="store_true", help="the runner's determinism overrides")
    group.add_argument("--step-func", "--step_func", dest="step_func", default=None, help=argparse.SUPPRESS)
    group.add_argument("--dry-run", "--dry_run", dest="dryrun", action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--dump-env", "--dump_env", dest="dump_env", action="store_true", help=argparse.SUPPRESS)
    for dest, flags, field, kind in COMMON_OVERRIDE_FIELDS:
        group.add_argument(*flags, dest=dest, type=kind, default=None, help=f"sets {field}")
    group.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", default=None, help="torchrun's")
    group.add_argument("--nnodes", default=None, help="torchrun's (N or MIN:MAX)")


def runner_overrides(args: argparse.Namespace) -> list[str]:
    """``run_recipe._common_config_overrides``: the convenience options as overrides (strings JSON-quoted)."""
    found = []
    for dest, _, field, _ in COMMON_OVERRIDE_FIELDS:
        value = getattr(args, dest, None)
        if value is not None:
            found.append(f"{field}={json.dumps(value) if isinstance(value, str) else value}")
    return found


def runner_target(args: argparse.Namespace, default: str) -> str | None:
    """The recipe ``--recipe``/``--model`` name (``run_recipe._selected_recipe_name``), or None without either; a
    positional target besides them, or both, is refused."""
    recipe, model = getattr(args, "recipe", None), getattr(args, "model", None)
    if recipe is None and model is None:
        return None
    if recipe is not None and model is not None:
        raise UsageError("--recipe and --model are exclusive (as in run_recipe.py): pass one")
    if args.target != default:
        raise UsageError(f"a recipe named twice: {args.target!r} and --recipe/--model; pass one")
    if recipe is not None:
        return recipe
    if args.mode is None:
        raise UsageError("--model needs --mode (run_recipe.py: the recipe is <model>_<task>_config)")
    task = "peft" if args.mode in ("lora", "dora") else args.mode
    return f"{model}_{task}_config"


def runner_args(args: argparse.Namespace) -> RunnerArgs:
    """The options that change the config beyond overrides (``--mode``, ``--dataset``, ``--deterministic``)."""
    return RunnerArgs(
        mode=getattr(args, "mode", None),
        dataset=getattr(args, "dataset", None),
        deterministic=bool(getattr(args, "deterministic", False)),
    )


def pack_launch_line(argv: Sequence[str], default: str) -> tuple[list[str], tuple[int, str] | None]:
    """``pack``'s arguments (after the command name) with a pasted ``torchrun ... run_recipe.py --recipe NAME ...``
    made into its own (issue #53): ``--recipe NAME``, the convenience flags as the overrides the runner makes of them,
    then the rest as typed; and the world size ``--nproc-per-node`` x ``--nnodes`` gives (None without them). The
    runner options that change more than overrides (``--mode``, ``--dataset``, ``--deterministic``) are refused:
    ``pack`` packs the recipe's own dataset."""
    stripped = strip_launcher(argv)
    if stripped == list(argv):
        return list(argv), None
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_runner_options(parser)
    known, rest = parser.parse_known_args(stripped)
    for dest, flag in (("mode", "--mode"), ("dataset", "--dataset"), ("deterministic", "--deterministic")):
        if getattr(known, dest):
            raise UsageError(
                f"pack takes a pasted run_recipe.py line's recipe, convenience flags and overrides; {flag} changes "
                f"more than overrides: drop it (pack packs the recipe's own dataset settings)"
            )
    known.target = default
    target = runner_target(known, default)
    named = ["--recipe", target] if target is not None else []
    return [*named, *runner_overrides(known), *rest], launcher_world(known)
