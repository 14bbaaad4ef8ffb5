"""Argument types and defaults shared by the subcommands."""

from __future__ import annotations

import argparse
from typing import Callable

__all__ = [
    "DEFAULT_RECIPE",
    "INT64_MAX",
    "SEED_MAX",
    "positive_int",
    "positive_count",
    "positive_float",
    "bounded_float",
    "seed_value",
    "text_value",
    "json_object_text",
    "int_list",
    "add_runner_flag",
]

DEFAULT_RECIPE = "llama3_8b_sft_packed_8k"
#: the largest integer Arrow, numpy and torch take as one value: a larger one is refused, not overflowed later
INT64_MAX = (1 << 63) - 1
#: numpy's ``np.random.seed`` takes 0..2**32-1, and Megatron-Bridge's prep seeds it with ``dataset.seed``
#: (data/packing/offline.py tokenize_dataset)
SEED_MAX = (1 << 32) - 1


def positive_count(high: int) -> Callable[[str], int]:
    """argparse type: an integer in 1..``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
        if value > high:
            raise argparse.ArgumentTypeError(f"expected a positive integer up to {high}, got {value}")
        return value

    parse.__name__ = "positive_int"
    return parse


#: argparse type: an integer in 1..2**63-1
positive_int = positive_count(INT64_MAX)


def seed_value(text: str) -> int:
    """argparse type: a seed, 0..2**32-1 (what numpy's and Megatron-Bridge's seeding take)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a seed (an integer in 0..{SEED_MAX}), got {text!r}") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(
            f"expected a seed in 0..{SEED_MAX} (numpy's np.random.seed, which Megatron-Bridge's prep calls with "
            f"it, takes no other), got {value}"
        )
    return value


def bounded_float(high: float) -> Callable[[str], float]:
    """argparse type: a number in (0, ``high``]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
        if value > high:
            raise argparse.ArgumentTypeError(f"expected a positive number up to {high:g}, got {text}")
        return value

    parse.__name__ = "positive_float"
    return parse


#: argparse type: a number > 0 (finite)
positive_float = bounded_float(float("inf"))


def text_value(text: str) -> str:
    """argparse type: a non-empty string. An empty one is most often an unset shell variable: refused, never read
    as "not given" (a default tokenizer, output folder or recipe instead of the one meant)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a value, got {text!r} (an unset shell variable?)")
    return text


def json_object_text(text: str) -> str:
    """argparse type: the text of a JSON object (kept as typed: the command reads it)."""
    import json

    text_value(text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f'expected a JSON object ({exc.msg}), e.g. \'{{"prompt_template": "{{input}} {{output}}"}}\''
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"expected a JSON object, got a JSON {type(value).__name__}, e.g. '{{\"add_eos\": true}}'"
        )
    return text


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
