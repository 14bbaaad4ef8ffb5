"""The gloo threads of this process: what a one-rank CPU world's process groups leave running until they are freed
(``threading`` does not see them: they are C++ threads)."""

from __future__ import annotations

import os

import pytest

#: the tests that count threads read Linux's /proc
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")


def gloo_threads() -> int:
    """ProcessGroupGloo's ``pt_gloo_runloop`` workers and its ``gloo_tcp_loop`` threads, counted now."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                count += "gloo" in comm.read()
        except FileNotFoundError:  # the thread ended while it was listed
            continue
    return count
