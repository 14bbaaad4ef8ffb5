"""A wrapper the plugin installs into Megatron (the ``data_read`` injection, a correction), on or off for a block."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

__all__ = ["switched"]


@contextlib.contextmanager
def switched(
    on: bool, is_installed: Callable[[], bool], install: Callable[[], object], uninstall: Callable[[], object]
) -> Iterator[None]:
    """The wrapper installed (``on``) or Megatron's own function, for the duration; the state before it, after
    (a test or a check may switch it without undoing what the user installed)."""
    was = is_installed()
    if on and not was:
        install()
    elif not on and was:
        uninstall()
    try:
        yield
    finally:
        if on and not was:
            uninstall()
        elif not on and was:
            install()
