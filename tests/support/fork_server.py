"""The fork server the pack-kill tests run ``pack`` in: its children start with Megatron-Bridge imported, from a
process that never ran a thread."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

from mbridge_seqpack.artifact.pack_phases import STOP_ENV


def pack_child(argv: list[str], phase: str | None) -> None:
    """``main(argv)`` in a child of the fork server, output silenced, stopping itself where ``phase`` begins."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from mbridge_seqpack.cli.main import main

    if phase:
        os.environ[STOP_ENV] = phase
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        os._exit(main(argv))


#: modules the fork server imports once, before it forks a pack: children start with Megatron-Bridge imported, from
#: a process that never ran a thread (forking this test process, whose tokenizers and torch ran threads, deadlocks)
PRELOAD = [
    "megatron.bridge.training.config",
    "megatron.bridge.data.builders.gpt_sft",
    "mbridge_seqpack.cli.main",
    "mbridge_seqpack.pipeline.pack",
    "mbridge_seqpack.recipes.targets",
    "tests.support.fork_server",
]


def fork_context() -> Any:
    """The fork server, with ``PRELOAD`` imported."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context
