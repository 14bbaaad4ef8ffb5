"""``check``: the rule catalog and Megatron-Bridge's own validation on a recipe, and ``check --fix``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Sequence

from mbridge_seqpack.cli.args import DEFAULT_RECIPE, add_runner_flag, positive_int
from mbridge_seqpack.cli.launch_line import (
    add_runner_options,
    launcher_world,
    runner_args,
    runner_overrides,
    runner_target,
)
from mbridge_seqpack.recipes.targets import build_launch, world_and_source

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["run_megatron_validation", "check_target", "cmd_check", "add_check_command", "gpu_arch_arg"]


def gpu_arch_arg(text: str) -> str:
    """``--gpu-arch``: checked (no Megatron import) and passed on as written."""
    from mbridge_seqpack.analysis.te_attention import parse_arch
    from mbridge_seqpack.errors import UsageError

    try:
        parse_arch(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def run_megatron_validation(cfg: ConfigContainer, world_size: int) -> str | None:
    """Megatron-Bridge's own ``runtime_config_update`` (as ``pretrain()`` runs it); the error text or None."""
    from megatron.bridge.training.config import runtime_config_update

    from mbridge_seqpack import hook

    saved_env = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(world_size)
    try:
        # what Megatron-Bridge prints goes to stderr: stdout is the report (--json parses it)
        with hook.suspended(), warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.filterwarnings("ignore", message="Could not determine rank")  # no process group here
            runtime_config_update(cfg)
    except (AssertionError, ValueError, TypeError, RuntimeError, KeyError) as exc:
        text = str(exc).strip() or repr(exc)
        return f"{type(exc).__name__}: {text}"
    finally:
        if saved_env is None:
            os.environ.pop("WORLD_SIZE", None)
        else:
            os.environ["WORLD_SIZE"] = saved_env
    return None


def check_target(
    target: str,
    overrides: Sequence[str],
    world_size: int | None,
    *,
    megatron: bool = True,
    config_file: str | None = None,
    runner: bool | None = None,
    gpu_arch: str | None = None,
    runner_options: Any = None,
    launcher: tuple[int, str] | None = None,
) -> Any:
    """Build ``target`` (under Megatron-Bridge's runner: with its pre-launch fixes), check it (the library's
    ``check()``: its report, with the launch line's own notes) and (optionally) run Megatron-Bridge's validation.
    Attention backends are judged for ``gpu_arch``, else the GPU the target's name says."""
    from mbridge_seqpack.report import check

    launch = build_launch(target, overrides, config_file, runner=runner, runner_args=runner_options)
    world, source = world_and_source(world_size, launch, launcher)
    cfg = launch.cfg
    notes = launch.notes() + ([f"world size {world} from {source}"] if launch.runner else [])
    report = check(cfg, world, target=target, gpu_arch=gpu_arch, notes=notes + pack_notes(cfg, target, overrides))
    if megatron:
        report.megatron_ran, report.megatron_error = True, run_megatron_validation(cfg, world)
        if report.megatron_error is not None:
            report.megatron_errors = megatron_failures(cfg, world, report.megatron_error)
    return report


def megatron_failures(cfg: ConfigContainer, world_size: int, first: str) -> list[str]:
    """Every check of Megatron-Bridge's validate() that fails on ``cfg`` (as runtime_config_update left it), where
    ``first``, the failure its own run stopped at, is validate()'s first; else ``first`` alone (it failed before
    validate(), or the collected run disagrees)."""
    from mbridge_seqpack.analysis.megatron_validate import collected_validation

    with warnings.catch_warnings():  # the method is unwrapped of the plugin's hook there: no need to suspend it
        warnings.filterwarnings("ignore", message="Could not determine rank")
        failures = collected_validation(cfg, world_size=world_size).failures
    texts = [f"{f.kind}: {f.message}" for f in failures if f.check]
    return texts if texts and texts[0] == first else [first]


def split_target(args: argparse.Namespace) -> None:
    """``check key=value`` (no target) means the default recipe with that override."""
    if "=" in args.target and not args.target.split(":", 1)[0].endswith(".py"):
        args.overrides = [args.target, *args.overrides]
        args.target = DEFAULT_RECIPE


def collapsed(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with one entry per key, the last one (a fix replaces the user's value of that key), in the order
    the keys first appear; ``+key``/``++key`` and ``key`` are one key."""
    last: dict[str, str] = {}
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        last.pop(key, None)
        last[key] = item
    firsts = list(dict.fromkeys(item.split("=", 1)[0].lstrip("+~") for item in overrides))
    return [last[key] for key in firsts]


def cmd_fix(args: argparse.Namespace) -> int:
    """``check --fix``: one converged override set that clears every violation, to paste after the others."""
    from mbridge_seqpack.analysis.te_attention import declared
    from mbridge_seqpack.overrides import converged_fix
    from mbridge_seqpack.report import check

    launch = build_launch(
        args.target, args.overrides, args.config_file, runner=args.runner, runner_args=runner_args(args)
    )
    cfg, (world, _) = launch.cfg, world_and_source(args.world_size, launch, launcher_world(args))
    with declared(gpu_arch=args.gpu_arch, recipe=args.target):
        fixes, remaining = converged_fix(cfg, lambda c: check(c, world_size=world))
        other_world = None
        if any(_needs_other_world(v) for v in remaining):
            other_world = _nearest_world(cfg, world, lambda c, w: check(c, world_size=w))
            if other_world is not None:
                world, fixes, remaining = other_world
    moved = moved_pack(cfg, fixes, args.target, [*args.overrides, *fixes])
    shown = fixes or (other_world is not None and args.overrides)
    print(" ".join(collapsed([*args.overrides, *fixes])) if shown else "# nothing to fix")
    if other_world is not None:
        print(
            f"# and run on {world} GPUs (check it with --world-size {world}): no override makes the world size "
            "asked work",
            file=sys.stderr,
        )
    for v in remaining:
        print(f"# not fixable by an override: [{v.rule_id}] {v.fix}", file=sys.stderr)
    if moved is not None:
        print(f"# {moved}", file=sys.stderr)
    return 1 if remaining else 0


# --- issue #53: the pack the (fixed) config reads, and the command that makes it (cli/pack_hint.py) ---


def pack_notes(cfg: Any, target: str, overrides: Sequence[str]) -> list[str]:
    from mbridge_seqpack.cli.pack_hint import missing_pack_note

    note = missing_pack_note(cfg, target, overrides)
    return [note] if note is not None else []


def moved_pack(cfg: Any, fixes: Sequence[str], target: str, overrides: Sequence[str]) -> str | None:
    """The line saying the fixes move the pack folder Megatron-Bridge reads, with the pack command (or None)."""
    import copy

    from mbridge_seqpack.cli.pack_hint import moved_pack_note
    from mbridge_seqpack.overrides import apply_overrides

    if not fixes:
        return None
    return moved_pack_note(cfg, apply_overrides(copy.deepcopy(cfg), fixes), target, overrides)


#: the GPU counts ``check --fix`` offers in place of one no override makes work: whole nodes of 8, or fewer
WORLD_SIZES = (1, 2, 4, *range(8, 4097, 8))


def _needs_other_world(violation: Any) -> bool:
    """A violation about the world size itself (batch.world_size_divisible names it as a field)."""
    return "world_size" in violation.fields and not violation.assignments


def _nearest_world(cfg: Any, world: int, check_at: Any, tries: int = 12) -> tuple[int, list[str], list] | None:
    """The GPU count nearest ``world`` (the larger first on a tie) at which the fixes converge to no violation,
    with those fixes; ``None`` when none of the nearest ``tries`` does."""
    from mbridge_seqpack.overrides import converged_fix

    for candidate in sorted((w for w in WORLD_SIZES if w != world), key=lambda w: (abs(w - world), -w))[:tries]:
        fixes, remaining = converged_fix(cfg, lambda c: check_at(c, candidate))
        if not remaining:
            return candidate, fixes, remaining
    return None


def take_runner_line(args: argparse.Namespace) -> None:
    """run_recipe.py's options: ``--recipe``/``--model`` name the target, the convenience flags become overrides
    before the trailing ones (as the runner orders them)."""
    named = runner_target(args, DEFAULT_RECIPE)
    if named is not None:
        args.target = named
    args.overrides = [*runner_overrides(args), *args.overrides]


def cmd_check(args: argparse.Namespace) -> int:
    split_target(args)
    take_runner_line(args)
    if args.fix:
        return cmd_fix(args)
    report = check_target(
        args.target,
        args.overrides,
        args.world_size,
        megatron=not args.rules_only,
        config_file=args.config_file,
        runner=args.runner,
        gpu_arch=args.gpu_arch,
        runner_options=runner_args(args),
        launcher=launcher_world(args),
    )
    print(report.to_json() if args.json else report.to_text(show_all=args.all))
    return 0 if report.ok else 1


def add_check_command(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("check", help="run the packing/CP rules and Megatron-Bridge's validation on a recipe")
    p.add_argument(
        "target",
        nargs="?",
        default=DEFAULT_RECIPE,
        help=f"packaged recipe, Megatron-Bridge recipe name (as run_recipe.py --recipe takes it) or "
        f"path/to/file.py[:function] (default: {DEFAULT_RECIPE})",
    )
    p.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. model.context_parallel_size=2")
    p.add_argument(
        "--world-size",
        type=positive_int,
        default=None,
        help="GPUs the job runs on (default: --nproc-per-node x --nnodes of a pasted launch line; under the runner "
        "$WORLD_SIZE or $SLURM_NTASKS; else the recipe's declared world size)",
    )
    add_runner_flag(p)
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--all", action="store_true", help="list every rule, not only those that found something")
    p.add_argument("--rules-only", action="store_true", help="skip Megatron-Bridge's own validate()")
    p.add_argument("--config-file", default=None, help="YAML merged before the overrides (as the recipe runner does)")
    p.add_argument(
        "--fix", action="store_true", help="print one override set (yours plus the fixes) that clears every violation"
    )
    p.add_argument(
        "--gpu-arch",
        type=gpu_arch_arg,
        default=None,
        metavar="ARCH",
        help="GPU the attention backends are judged for: sm80, sm90, sm100, sm103, sm120 or a name (h100, b200, "
        "gb200); default: $MBRIDGE_SEQPACK_GPU_ARCH, else the GPU in the recipe's name, else sm90 (H100)",
    )
    add_runner_options(p)
    p.set_defaults(func=cmd_check)
