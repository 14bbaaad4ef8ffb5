"""Argument types and defaults shared by the subcommands."""

from __future__ import annotations

import argparse

__all__ = ["DEFAULT_RECIPE", "positive_int", "positive_float", "int_list", "add_runner_flag"]

DEFAULT_RECIPE = "llama3_8b_sft_packed_8k"


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def int_list(text: str) -> list[int]:
    """argparse type: comma-separated positive integers."""
    return [positive_int(part) for part in text.split(",") if part.strip()]


def add_runner_flag(parser: argparse.ArgumentParser) -> None:
    """``--runner/--no-runner``: model Megatron-Bridge's run_recipe.py (its pre-launch fixes applied first)."""
    parser.add_argument(
        "--runner",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="apply Megatron-Bridge's run_recipe.py pre-launch fixes (CP loss settings, packing alignment, "
        "seq_length) before the rules, as that launch does (default: on for Megatron-Bridge recipe names)",
    )
