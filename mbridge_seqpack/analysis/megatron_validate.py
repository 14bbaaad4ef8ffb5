"""Megatron-Bridge's own ``ConfigContainer.validate()``, run with every failure collected instead of the first.

``validate()`` (training/config.py) is a straight list of checks, Megatron-Core's ``TransformerConfig.__post_init__``
among them (through ``model.finalize()``), each raising on its own: a config with two problems shows one, then the
other after the first is fixed. Here the installed function's own source is compiled again with each statement,
at every depth, inside ``try`` / ``except`` that notes what it raised and goes on: the checks, their order and their
messages are Megatron's, unchanged; a nested call (``model.finalize()``) still stops at its first failure. It runs
on a deep copy, with ``os.environ`` put back after, so the config and the process are as before.

A statement that runs after an earlier failure may fail only because of it (a value the failed statement never set):
after the first failure, only ``AssertionError`` and ``ValueError`` (what Megatron's checks raise) are kept; the rest
are counted as follow-ons, not reported.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import inspect
import io
import os
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Iterator

__all__ = ["MegatronFailure", "CollectedValidation", "collected_validation"]

#: what Megatron's own checks raise: kept after an earlier failure (anything else then is a follow-on)
CHECK_ERRORS = (AssertionError, ValueError)
_COLLECT = "__mbridge_seqpack_collect__"


@dataclass(frozen=True)
class MegatronFailure:
    """One check of ``validate()`` that failed: the exception's type and text, and where (the innermost Megatron
    frame)."""

    kind: str
    message: str
    site: str
    check: bool = True  # an AssertionError or ValueError (a check's refusal), not a crash of the code itself


@dataclass(frozen=True)
class CollectedValidation:
    """Every failure of one run of ``validate()``, in order, and how many follow-on raises were left out."""

    failures: tuple[MegatronFailure, ...]
    follow_ons: int = 0


_COMPOUND_BODIES = ("body", "orelse", "finalbody")
_EXC = "__mbridge_seqpack_exc__"


def _guarded(stmt: ast.stmt) -> ast.stmt:
    """``try: stmt except Exception as e: collect(e)``."""
    call = ast.Call(ast.Name(_COLLECT, ast.Load()), [ast.Name(_EXC, ast.Load())], [])
    handler = ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), name=_EXC, body=[ast.Expr(call)])
    return ast.copy_location(ast.Try(body=[stmt], handlers=[handler], orelse=[], finalbody=[]), stmt)


def _collecting_body(body: list[ast.stmt]) -> list[ast.stmt]:
    """Each statement guarded, and the statements of its own blocks too (an ``if``'s checks one by one); nested
    definitions run as written."""
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Pass)):
            out.append(stmt)
            continue
        for name in _COMPOUND_BODIES:
            inner = getattr(stmt, name, None)
            if isinstance(inner, list) and inner and all(isinstance(s, ast.stmt) for s in inner):
                setattr(stmt, name, _collecting_body(inner))
        out.append(_guarded(stmt))
    return out


@functools.cache
def _collecting_function(function: Callable[..., Any]) -> tuple[Callable[..., Any], list[BaseException]]:
    """``function`` recompiled with every statement's raise collected, and the list it collects into."""
    lines, start = inspect.getsourcelines(function)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    ast.increment_lineno(tree, start - 1)
    (definition,) = tree.body
    if not isinstance(definition, ast.FunctionDef):
        raise TypeError(f"{function!r} is not a plain function")
    definition.decorator_list = []
    definition.body = _collecting_body(definition.body)
    tree = ast.fix_missing_locations(tree)
    collected: list[BaseException] = []
    namespace = dict(function.__globals__)
    namespace[_COLLECT] = collected.append
    exec(compile(tree, inspect.getsourcefile(function) or "<validate>", "exec"), namespace)  # noqa: S102
    return namespace[function.__name__], collected


def _site(exc: BaseException) -> str:
    from mbridge_seqpack.frames import traceback_site

    return traceback_site(exc) or "<outside Megatron>"


def _message(exc: BaseException) -> str:
    """The exception's text; for a bare ``assert`` (no message) the asserting line itself, as Python shows it."""
    text = str(exc).strip()
    if text or exc.__traceback__ is None:
        return text
    import linecache

    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip()
    return f"failed: {line}" if line else ""


def collected_validation(
    cfg: Any, validate: Callable[..., Any] | None = None, world_size: int | None = None
) -> CollectedValidation:
    """Run Megatron-Bridge's ``ConfigContainer.validate`` (``validate``: the unwrapped method; default the class's,
    unwrapped of the plugin's hook) on a deep copy of ``cfg``, collecting every failure; ``world_size``: the world
    it computes its data-parallel size from (``WORLD_SIZE`` for the run, as the plugin's checks take it), else the
    process's."""
    if validate is None:
        from megatron.bridge.training.config import ConfigContainer

        validate = inspect.unwrap(ConfigContainer.validate)
    first = _first_failure(validate, cfg, world_size)
    if first is None:
        return CollectedValidation(())  # the method as written passes: nothing to collect
    run, collected = _collecting_function(validate)
    collected.clear()
    with _environment_kept(world_size):
        run(copy.deepcopy(cfg))
    raised, follow_ons = list(collected), 0
    collected.clear()
    failures: list[MegatronFailure] = []
    for exc in raised:
        if failures and not isinstance(exc, CHECK_ERRORS):
            follow_ons += 1
            continue
        failure = MegatronFailure(type(exc).__name__, _message(exc), _site(exc), isinstance(exc, CHECK_ERRORS))
        if all((f.kind, f.message) != (failure.kind, failure.message) for f in failures):  # one check, two sites
            failures.append(failure)
    if not failures or (failures[0].kind, failures[0].message) != (first.kind, first.message):
        return CollectedValidation((first,))  # the recompiled run disagrees with the method: only what it raised
    return CollectedValidation(tuple(failures), follow_ons)


@contextlib.contextmanager
def _environment_kept(world_size: int | None = None) -> Iterator[None]:
    """``os.environ`` put back after the block (``validate()`` exports settings), with ``WORLD_SIZE`` set in it; what
    ``validate()`` prints (``print``: "use_distributed_optimizer=True is required ... Activating...") is left out: the
    runs here are on copies, and the launch's own ``validate()`` says it once."""
    saved = dict(os.environ)
    if world_size is not None:
        os.environ["WORLD_SIZE"] = str(world_size)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _first_failure(validate: Callable[..., Any], cfg: Any, world_size: int | None) -> MegatronFailure | None:
    """What the method as written raises on a copy of ``cfg`` (None: it passes)."""
    with _environment_kept(world_size):
        try:
            validate(copy.deepcopy(cfg))
        except Exception as exc:  # noqa: BLE001  (any raise of validate() stops the launch: it is the finding)
            return MegatronFailure(type(exc).__name__, _message(exc), _site(exc), isinstance(exc, CHECK_ERRORS))
    return None
