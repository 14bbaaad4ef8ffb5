"""Where in Megatron or Transformer Engine code something happened: the innermost library frame of a traceback.

A refusal quotes the library's own site (``megatron/core/x.py:12 fn``), and a failure raised inside the library is
told apart from one raised by the call that reached it. Imports nothing of the plugin, so any layer may use it.
"""

from __future__ import annotations

import os
import sys

__all__ = ["LIBRARY_ROOTS", "library_path", "site_of", "traceback_site"]

#: the code whose frames name a site: frames under these package roots
LIBRARY_ROOTS = ("megatron/", "transformer_engine/")


def _imported_parents(roots: tuple[str, ...]) -> list[str]:
    """The folder (with a trailing ``/``) that holds each of ``roots`` imported now, wherever it was imported from (an
    installed package, or a checkout's source put on the path: ``contract --src``)."""
    found = []
    for root in roots:
        module = sys.modules.get(root.rstrip("/"))
        for entry in getattr(module, "__path__", None) or ():
            found.append(os.path.dirname(os.path.abspath(entry)).replace("\\", "/") + "/")
    return found


def library_path(filename: str, roots: tuple[str, ...] = LIBRARY_ROOTS) -> str | None:
    """``megatron/core/x.py`` for a file of one of the library packages ``roots`` (None for other code)."""
    path = filename.replace("\\", "/")
    for root in roots:
        at = path.rfind("/site-packages/" + root)
        if at >= 0:
            return path[at + len("/site-packages/") :]
    for parent in _imported_parents(roots):
        if path.startswith(parent) and path[len(parent) :].startswith(roots):
            return path[len(parent) :]
    return None


def site_of(frames: list[tuple[str, int, str]]) -> tuple[str, tuple[str, ...]]:
    """(innermost library frame, all library frames outermost first) as ``path:line function``."""
    named = [f"{path}:{line} {fn}" for path, line, fn in frames]
    return (named[-1] if named else "<outside Megatron>"), tuple(named)


def traceback_site(exc: BaseException, roots: tuple[str, ...] = LIBRARY_ROOTS) -> str | None:
    """The innermost frame of ``exc``'s traceback in the library packages ``roots``, as ``path:line function``
    (None: it passed through none)."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        path = library_path(tb.tb_frame.f_code.co_filename, roots)
        if path is not None:
            frames.append((path, tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    return site_of(frames)[0] if frames else None
