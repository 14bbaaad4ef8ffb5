"""``mbridge-seqpack``: check configs, list recipes, plan pack length vs batch, pack and inspect data.

Commands that do not need Megatron-Bridge (``pack``, ``inspect``, ``--help``) never import it: that
import takes ~40 s on a CPU machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Any, Sequence

from mbridge_seqpack.cli_data import add_data_commands, positive_int

DEFAULT_RECIPE = "llama3_8b_sft_packed_8k"


class UsageError(ValueError):
    """Bad command-line input; exit code 2."""


# ---- check ------------------------------------------------------------------------------------------


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
    if explicit is not None:
        return explicit
    if info is not None:
        return info.world_size
    return int(os.environ.get("WORLD_SIZE", "1"))


def run_megatron_validation(cfg: Any, world_size: int) -> str | None:
    """Megatron-Bridge's own ``runtime_config_update`` (as ``pretrain()`` runs it); the error text or None."""
    from megatron.bridge.training.config import runtime_config_update

    from mbridge_seqpack import hook

    saved_env = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(world_size)
    try:
        with hook.suspended(), warnings.catch_warnings():
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


def check_target(target: str, overrides: Sequence[str], world_size: int | None, *, megatron: bool = True,
                 config_file: str | None = None) -> Any:
    """Build ``target``, run the rule catalog and (optionally) Megatron-Bridge's validation."""
    from mbridge_seqpack.report import CheckReport, derived_values
    from mbridge_seqpack.rules import RuleContext, evaluate

    cfg, info = build_target(target, overrides, config_file)
    world = resolve_world(world_size, info)
    ctx = RuleContext.build(cfg, world)
    results = evaluate(ctx)
    report = CheckReport(target=f"{target} (world size {world})", derived=derived_values(ctx), results=results,
                         megatron_ran=megatron)
    if megatron:
        report.megatron_error = run_megatron_validation(cfg, world)
    return report


def _split_target(args: argparse.Namespace) -> None:
    """``check key=value`` (no target) means the default recipe with that override."""
    if "=" in args.target and not args.target.split(":", 1)[0].endswith(".py"):
        args.overrides = [args.target, *args.overrides]
        args.target = DEFAULT_RECIPE


def cmd_fix(args: argparse.Namespace) -> int:
    """``check --fix``: one converged override set that clears every violation, to paste after the others."""
    from mbridge_seqpack.overrides import converged_fix
    from mbridge_seqpack.rules import check

    cfg, info = build_target(args.target, args.overrides, args.config_file)
    world = resolve_world(args.world_size, info)
    fixes, remaining = converged_fix(cfg, lambda c: check(c, world_size=world))
    print(" ".join([*args.overrides, *fixes]) if fixes else "# nothing to fix")
    for v in remaining:
        print(f"# not fixable by an override: [{v.rule_id}] {v.fix}", file=sys.stderr)
    return 1 if remaining else 0


def cmd_check(args: argparse.Namespace) -> int:
    _split_target(args)
    if args.fix:
        return cmd_fix(args)
    report = check_target(args.target, args.overrides, args.world_size, megatron=not args.rules_only,
                          config_file=args.config_file)
    print(report.to_json() if args.json else report.to_text())
    return 0 if report.ok else 1


# ---- recipes ----------------------------------------------------------------------------------------


def recipe_rows() -> list[dict[str, Any]]:
    """One row per packaged recipe, built at its declared world size."""
    from mbridge_seqpack.recipes import build_recipe, list_recipes, recipe_info
    from mbridge_seqpack.report import derived_values
    from mbridge_seqpack.rules import RuleContext

    quiet_megatron_import()
    rows = []
    for name in list_recipes():
        info = recipe_info(name)
        derived = derived_values(RuleContext.build(build_recipe(name), info.world_size))
        rows.append({"name": name, "model": info.model, "description": info.description, **derived,
                     "mode": info.mode})
    return rows


def _layout(derived: dict[str, Any]) -> str:
    """``TP2 CP8 DP2`` (PP and EP only where > 1)."""
    parts = [("TP", derived["tp"]), ("PP", derived["pp"]), ("CP", derived["cp"]), ("EP", derived["ep"]),
             ("DP", derived["dp"])]
    return " ".join(f"{name}{size}" for name, size in parts if name in ("TP", "DP") or (size or 1) > 1)


def cmd_recipes(args: argparse.Namespace) -> int:
    import json

    rows = recipe_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from mbridge_seqpack.textout import table

    columns = [("recipe / model, mode", "left"), ("seq", "right"), ("layout", "left"), ("GPUs", "right"),
               ("MBS", "right"), ("GBS", "right"), ("tokens/step", "right")]
    print(table(columns, [
        (f"{r['name']}\n  {r['model']}, {r['mode']}", r["row_length"], _layout(r), r["world_size"],
         r["micro_batch_size"], r["global_batch_size"], f"{r['token_slots_per_step']:,}")
        for r in rows
    ], keep_whole=(0, 2)))
    return 0


# ---- plan -------------------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from mbridge_seqpack.planner import plan

    _split_target(args)
    rows = plan(args.target, slots=args.slots, world_size=args.world_size, lengths=args.lengths,
                overrides=args.overrides, context_window=args.context_window)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        from mbridge_seqpack.textout import table, wrap

        window = rows[0].context_window if rows else None
        known = f"context window {window:,} tokens" if window else "context window unknown (--context-window N)"
        print("\n".join(wrap(f"plan for {args.target}: {args.slots:,} token slots per optimizer step; {known}",
                             hang="  ")))
        columns = [("pack length", "right"), ("GBS", "right"), ("DP", "right"), ("verdict", "left")]
        print(table(columns, [(r.pack_length, r.global_batch_size or "-", "-" if r.dp is None else r.dp, r.verdict())
                              for r in rows], keep_whole=()))
    return 0 if any(r.ok for r in rows) else 1


# ---- parser -----------------------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    return [positive_int(part) for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    from mbridge_seqpack import __version__

    parser = argparse.ArgumentParser(prog="mbridge-seqpack", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"mbridge-seqpack {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="run the packing/CP rules and Megatron-Bridge's validation on a recipe")
    p.add_argument("target", nargs="?", default=DEFAULT_RECIPE,
                   help=f"packaged recipe name or path/to/file.py[:function] (default: {DEFAULT_RECIPE})")
    p.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. model.context_parallel_size=2")
    p.add_argument("--world-size", type=positive_int, default=None,
                   help="GPUs the job runs on (default: the recipe's declared world size, else $WORLD_SIZE)")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--rules-only", action="store_true", help="skip Megatron-Bridge's own validate()")
    p.add_argument("--config-file", default=None, help="YAML merged before the overrides (as the recipe runner does)")
    p.add_argument("--fix", action="store_true",
                   help="print one override set (yours plus the fixes) that clears every violation")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("recipes", help="list the packaged recipes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_recipes)

    p = sub.add_parser("plan", help="pack length vs global batch at equal token slots per step")
    p.add_argument("target", nargs="?", default=DEFAULT_RECIPE)
    p.add_argument("overrides", nargs="*")
    p.add_argument("--slots", type=positive_int, default=65536, help="token slots per optimizer step")
    p.add_argument("--world-size", type=positive_int, default=None)
    p.add_argument("--lengths", type=_int_list, default=None,
                   help="comma-separated pack lengths (default: powers of two from 1024 up to --slots)")
    p.add_argument("--context-window", type=positive_int, default=None,
                   help="the model's context window in tokens (default: the packaged recipe's)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    add_data_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `check NAME --world-size 8 key=value`: overrides may follow the options too
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `mbridge-seqpack inspect --json | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UsageError as exc:
        print(f"mbridge-seqpack: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        from mbridge_seqpack.errors import PackingConfigError

        if isinstance(exc, PackingConfigError):
            print(str(exc), file=sys.stderr)
            return 1
        print(f"mbridge-seqpack: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
