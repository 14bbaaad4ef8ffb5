"""The phases of ``pack``, named where each begins, so that a test can kill a pack at exactly that point.

``staging`` (the staging directory exists, empty), ``tokenizing`` (Ray: the first shard is back, the others in
flight), ``writing`` (the first row group or part of a split is written), ``sealing`` (a split file is complete,
being hashed), ``renaming`` (everything is sealed and fsync'ed; the staging directory is about to replace the
output) and ``swapping`` (with ``--overwrite``: the old output has been moved aside, the new one not yet in place).

With ``MBRIDGE_SEQPACK_STOP_AT=<phase>`` in the environment the process stops itself (``SIGSTOP``) when it
reaches that phase, so the kill tests (``tests/artifact/test_pack_kills.py``) send ``SIGKILL`` to a process known to be
there, not wherever a poll happened to find it. Unset, :func:`reached` is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["PHASES", "STOP_ENV", "reached"]

PHASES = ("staging", "tokenizing", "writing", "sealing", "renaming", "swapping")
STOP_ENV = "MBRIDGE_SEQPACK_STOP_AT"


def reached(phase: str) -> None:
    """Mark the start of ``phase``; stop here (``SIGSTOP``) when the environment asks for it."""
    if os.environ.get(STOP_ENV) == phase:
        os.kill(os.getpid(), signal.SIGSTOP)
