"""Data subcommands (``pack``, ``inspect``, ``verify``); registered lazily, never import Megatron-Bridge."""

from __future__ import annotations

import argparse


def add_data_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register the data subcommands on the main parser."""
    return None
