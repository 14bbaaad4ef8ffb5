"""``recipes``: the packaged recipes as a table (100 columns) or JSON: names and what they train at once, from the
recipe files' markers (no Megatron-Bridge import); ``--layout`` builds each for its derived layout."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["recipe_rows", "recipe_listing", "cmd_recipes", "add_recipes_command"]


def recipe_listing() -> list[dict[str, Any]]:
    """One row per packaged recipe from its ``@recipe`` marker alone: nothing is built or imported."""
    from mbridge_seqpack.recipes import list_recipes, recipe_info

    rows = []
    for name in list_recipes():
        info = recipe_info(name)
        rows.append(
            {
                "name": name,
                "model": info.model,
                "mode": info.mode,
                "world_size": info.world_size,
                "description": info.description,
            }
        )
    return rows


def recipe_rows() -> list[dict[str, Any]]:
    """:func:`recipe_listing`'s rows, each recipe built at its declared world size for its derived layout (the
    recipe's own ``mode`` description kept over the packing mode the layout derives)."""
    from mbridge_seqpack.recipes import build_recipe
    from mbridge_seqpack.report import derived_values
    from mbridge_seqpack.rules import RuleContext

    rows = []
    for row in recipe_listing():
        derived = derived_values(RuleContext.build(build_recipe(row["name"]), row["world_size"]))
        rows.append({**row, **derived, "mode": row["mode"]})
    return rows


def _layout(derived: dict[str, Any]) -> str:
    """``TP2 CP8 DP2`` (PP and EP only where > 1)."""
    parts = [
        ("TP", derived["tp"]),
        ("PP", derived["pp"]),
        ("CP", derived["cp"]),
        ("EP", derived["ep"]),
        ("DP", derived["dp"]),
    ]
    return " ".join(f"{name}{size}" for name, size in parts if name in ("TP", "DP") or (size or 1) > 1)


def cmd_recipes(args: argparse.Namespace) -> int:
    import json

    from mbridge_seqpack.textout import table

    rows = recipe_rows() if args.layout else recipe_listing()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not args.layout:
        columns = [("recipe / model, mode", "left"), ("GPUs", "right"), ("what it trains", "left")]
        cells = [(f"{r['name']}\n  {r['model']}, {r['mode']}", r["world_size"], r["description"]) for r in rows]
        print(table(columns, cells, keep_whole=(0,)))
        print("(--layout builds each recipe for its row length, layout and batch; about 40 s for the import)")
        return 0

    columns = [
        ("recipe / model, mode", "left"),
        ("seq", "right"),
        ("layout", "left"),
        ("GPUs", "right"),
        ("MBS", "right"),
        ("GBS", "right"),
        ("tokens/step", "right"),
    ]
    print(
        table(
            columns,
            [
                (
                    f"{r['name']}\n  {r['model']}, {r['mode']}",
                    r["row_length"],
                    _layout(r),
                    r["world_size"],
                    r["micro_batch_size"],
                    r["global_batch_size"],
                    f"{r['token_slots_per_step']:,}",
                )
                for r in rows
            ],
            keep_whole=(0, 2),
        )
    )
    return 0


def add_recipes_command(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("recipes", help="list the packaged recipes")
    p.add_argument("--json", action="store_true")
    p.add_argument("--layout", action="store_true", help="build each recipe: row length, layout, batch sizes")
    p.set_defaults(func=cmd_recipes)
