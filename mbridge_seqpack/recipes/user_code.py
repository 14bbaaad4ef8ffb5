"""A recipe's own code failing, told as the user's error: the file and line, what it raised, and the fix.

A recipe file (``check file.py:fn``) or a Megatron-Bridge recipe is code the plugin runs but did not write. What it
raises while it is imported or called (a syntax error, a missing module, its own exception, the Hugging Face hub out
of reach), or a value that is not a ``ConfigContainer``, is a :class:`~mbridge_seqpack.errors.UsageError` naming
``file:line``; the command line prints it in a line or two, exit 2, no traceback. Packaged recipes are the plugin's:
what they raise (the hub aside) stays a bug.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from mbridge_seqpack.errors import SeqpackError, UsageError
from mbridge_seqpack.recipes.hub import hub_failure, hub_message, hub_refused

__all__ = ["load_failure", "call_builder", "not_a_config"]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _where(exc: BaseException, path: Path | None, fn: Any = None) -> str:
    """``file:line`` of the deepest frame in ``path`` (the user's file); else of ``fn``'s ``def`` there (a call it
    refused: a missing argument); else of the deepest frame at all."""
    frames = traceback.extract_tb(exc.__traceback__)
    if path is not None:
        mine = [f for f in frames if os.path.realpath(f.filename) == os.path.realpath(path)]
        if mine:
            return f"{path}:{mine[-1].lineno}"
        code = getattr(fn, "__code__", None)
        if code is not None and os.path.realpath(code.co_filename) == os.path.realpath(path):
            return f"{path}:{code.co_firstlineno}"
    if not frames:
        return str(path or "?")
    return f"{frames[-1].filename.rpartition('site-packages/')[2]}:{frames[-1].lineno}"


def load_failure(path: Path, exc: BaseException) -> UsageError:
    """What importing recipe file ``path`` raised, as the user's error with ``file:line``."""
    if isinstance(exc, SyntaxError):
        return UsageError(f"recipe file {exc.filename or path}:{exc.lineno}: {type(exc).__name__}: {exc.msg}")
    repo = hub_failure(exc)
    if repo is not None:
        return UsageError(hub_message(f"recipe file {_where(exc, path)}", repo, hub_refused(exc)))
    if isinstance(exc, ImportError):
        missing = f"; install {exc.name!r} or fix the import" if exc.name else "; fix the import"
        return UsageError(f"recipe file {_where(exc, path)}: its import failed: {_first_line(exc)}{missing}")
    return UsageError(f"recipe file {_where(exc, path)}: importing it raised {_first_line(exc)}")


def not_a_config(label: str, value: Any) -> UsageError | None:
    """None when ``value`` is a Megatron-Bridge ``ConfigContainer``; else the error saying what came back. Without
    Megatron-Bridge imported nothing can be one, so the answer needs no import."""
    module = sys.modules.get("megatron.bridge.training.config")
    container = getattr(module, "ConfigContainer", None)
    if container is not None and isinstance(value, container):
        return None
    return UsageError(
        f"{label} returned {type(value).__name__} {_short(value)}, not a ConfigContainer; return the "
        "ConfigContainer itself (a dict or YAML goes in --config-file or key=value overrides)"
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def call_builder(fn: Callable[[], Any], label: str, *, path: Path | None, user: bool) -> Any:
    """Call a recipe builder. The hub out of reach is the user's environment, whoever's code met it; anything else
    a ``user`` builder (a recipe file, a Megatron-Bridge recipe) raises is the user's code; ``path`` is its file."""
    try:
        value = fn()
    except (KeyboardInterrupt, SystemExit, SeqpackError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001  (classified below; a packaged recipe's own error stays a bug)
        repo = hub_failure(exc)
        if repo is not None:
            raise UsageError(hub_message(label, repo, hub_refused(exc))) from None
        if not user:
            raise
        raise UsageError(f"{label} raised {_first_line(exc)} at {_where(exc, path, fn)}") from None
    return value
