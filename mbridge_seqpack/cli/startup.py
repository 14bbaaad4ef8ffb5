"""What the command line does around its slow imports: one status line on stderr as a slow library starts to load,
and known third-party noise kept out of the output (``--verbose`` shows everything).

Importing Megatron-Bridge took 20 s on an idle 2-core machine, 44 s where Python had no cached bytecode to load
(:data:`MEASURED_IMPORT_S`; its package ``__init__`` imports every model family, and with them Megatron-Core, torch
and Transformer Engine), minutes on a loaded one,
before a command can say anything; without a word first, a command looks hung. The status line is printed by an
import finder the moment the first slow package is asked for, so it comes before that import wherever it starts (a
recipe file, ``build_launch``, the tokenizer of ``pack``), and only once the cheap checks before it have passed.

The noise filters name each message, the module that emits it and its category: import-time notices about the
machine (no GPU, no Apex, no Triton), a docstring's escape sequence, a ``transformers`` attribute rename read by
Megatron-Bridge's bridges. A warning from Megatron-Bridge about the config being checked is never among them. They
hold for one :func:`command_line` block of the command-line process; the training process (``hook``,
``integrations.autoload``) is left as it is.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import re
import sys
import warnings
from typing import Any, Iterator, Sequence, TextIO

__all__ = [
    "MEASURED_IMPORT_S",
    "SLOW_IMPORTS",
    "WARNING_NOISE",
    "LOG_NOISE",
    "bytecode_state",
    "status_line",
    "command_line",
]

#: a bare ``import megatron.bridge``, medians of the seconds ``scripts/bench_startup.py`` measured on an idle 2-core
#: machine (docs/bench/bench_startup.json: "import megatron.bridge, bytecode cached" and "import megatron.bridge");
#: the status line quotes them as measured, never as a promise (tests/cli/test_startup.py holds them to the record)
MEASURED_IMPORT_S = {"cached": 20, "uncached": 44}
_MEASURED = f"measured {MEASURED_IMPORT_S['cached']} s on an idle 2-core machine, longer under load"
_MEGATRON = "Megatron-Bridge (with torch and Transformer Engine)"

#: top-level packages whose import a user waits for, and what the status line says of each
SLOW_IMPORTS = {
    "megatron": f"{_MEGATRON}; {_MEASURED}",
    "torch": "torch; this takes a few seconds",
    "transformers": "transformers (with torch); this takes a few seconds",
    "ray": "Ray; this takes a few seconds",
}
#: what each brings along (Megatron-Bridge's import pulls in the others, Ray included): said once, with it
_BROUGHT_ALONG = {"megatron": tuple(SLOW_IMPORTS), "transformers": ("torch",)}

#: Megatron-Bridge's import without cached bytecode: about half of its CPU time is compiling its Python source
#: (measured: 41-44 s of user time against 19 s)
_SLOW = f"measured {MEASURED_IMPORT_S['uncached']} s on an idle 2-core machine"
_UNCACHED = {
    "first": f"{_MEGATRON}; {_SLOW} the first time, while Python compiles and caches its bytecode, "
    f"{MEASURED_IMPORT_S['cached']} s after",
    "unset": f"{_MEGATRON}; {_SLOW}, half of it compiling Python source that PYTHONDONTWRITEBYTECODE keeps from being "
    "cached (unset it, or run `python -m compileall` on site-packages once)",
    "read-only": f"{_MEGATRON}; {_SLOW}, half of it compiling Python source that a read-only site-packages cannot "
    "cache (set PYTHONPYCACHEPREFIX to a writable directory)",
}

#: (category, message, emitting module, what it is): re.match patterns, as ``warnings.filterwarnings`` takes them
WARNING_NOISE: tuple[tuple[type[Warning], str, str, str], ...] = (
    (UserWarning, r"Apex is not installed", r"megatron\.core\.", "Megatron-Core's import on a machine without Apex"),
    (
        UserWarning,
        r"Triton is not supported on current platform",
        r"fla\.",
        "flash-linear-attention's import (a Megatron-Bridge model family) on a machine without a GPU",
    ),
    (
        UserWarning,
        r"MimoModelConfig is experimental",
        r"megatron\.core\.",
        "an experimental Megatron-Core class Megatron-Bridge imports",
    ),
    (
        SyntaxWarning,
        r"invalid escape sequence",
        r".*[\\/](megatron|transformer_engine)[\\/]",  # compile-time warnings name the file, not the module
        "a docstring in Megatron-Core, shown when its bytecode is first compiled",
    ),
)

#: (logger, message, what it is): records dropped at the logger that emits them
LOG_NOISE: tuple[tuple[str, str, str], ...] = (
    ("torch.utils.cpp_extension", r"No CUDA runtime is found", "torch's CUDA probe on a machine without a GPU"),
    (
        "transformers.configuration_utils",
        r"`torch_dtype` is deprecated",
        "Megatron-Bridge's bridges read the transformers config attribute renamed dtype",
    ),
)


def bytecode_state(package: str = "megatron", module: str = "bridge/__init__.py") -> str:
    """Whether ``package/module`` (Megatron-Bridge's ``__init__``) loads from cached bytecode: ``cached``, ``first``
    (Python compiles and caches it this run), ``unset`` (PYTHONDONTWRITEBYTECODE: compiled every run) or
    ``read-only`` (compiled every run, nowhere to cache it); ``cached`` when the package is not found."""
    spec = importlib.machinery.PathFinder.find_spec(package)
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        source = os.path.join(location, module)
        if not os.path.isfile(source):
            continue
        cached = importlib.util.cache_from_source(source)
        if os.path.isfile(cached):
            return "cached"
        if sys.dont_write_bytecode:
            return "unset"
        directory = os.path.dirname(cached)
        while not os.path.isdir(directory) and os.path.dirname(directory) != directory:
            directory = os.path.dirname(directory)
        return "first" if os.access(directory, os.W_OK) else "read-only"
    return "cached"


def status_line(package: str) -> str:
    """What the user reads while ``package`` (a key of :data:`SLOW_IMPORTS`) loads, in lines of 100 columns."""
    what = SLOW_IMPORTS[package]
    if package == "megatron":
        what = _UNCACHED.get(bytecode_state(), what)
    from mbridge_seqpack.textout import wrap

    whole = f"mbridge-seqpack: loading {what} ..."
    if len(whole) <= 100:
        return whole
    name, _, why = what.partition("; ")  # the package on the first line, why it is slow under it
    return "\n".join([f"mbridge-seqpack: loading {name} ...", *(wrap(why, "  ") if why else [])])


class _Announcer(importlib.abc.MetaPathFinder):
    """Prints the status line of a slow package when the import system first looks for it; finds nothing itself."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._said: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> None:
        if path is None and fullname in SLOW_IMPORTS and fullname not in self._said:
            self._said.update((fullname, *_BROUGHT_ALONG.get(fullname, ())))
            try:
                print(status_line(fullname), file=self._stream, flush=True)
            except (OSError, ValueError):  # stderr closed: the import goes on, untold
                pass
        return None


class _DropKnown(logging.Filter):
    def __init__(self, pattern: str) -> None:
        super().__init__()
        self._pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return self._pattern.match(str(record.msg)) is None


def _short_path(filename: str) -> str:
    return filename.rpartition("site-packages/")[2] or filename


def _one_line(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None):
    """A remaining warning as one line (Python's first line, without the echoed source line)."""
    stream = sys.stderr if file is None else file
    try:
        stream.write(f"{_short_path(filename)}:{lineno}: {category.__name__}: {message}\n")
    except OSError:  # stderr gone: nothing to tell
        pass


@contextlib.contextmanager
def command_line(verbose: bool = False, stream: TextIO | None = None) -> Iterator[None]:
    """Run a command with the status line armed and, unless ``verbose``, the known noise filtered, Megatron-Bridge's
    deprecations shown and every warning on one line; ``verbose`` shows every warning, as Python prints it."""
    announcer = _Announcer(sys.stderr if stream is None else stream)
    sys.meta_path.insert(0, announcer)
    dropped: list[tuple[logging.Logger, logging.Filter]] = []
    try:
        with warnings.catch_warnings():
            if verbose:
                warnings.simplefilter("default")
            else:
                # Megatron-Bridge's deprecations name config fields and formats (dataset_kwargs preprocessing, .npy
                # packs, hybrid_override_pattern): the user's concern, though Python hides them outside __main__
                warnings.filterwarnings("default", category=DeprecationWarning, module=r"megatron\.bridge\.")
                for category, message, module, _ in WARNING_NOISE:
                    warnings.filterwarnings("ignore", message=message, category=category, module=module)
                warnings.showwarning = _one_line
                for name, message, _ in LOG_NOISE:
                    logger, known = logging.getLogger(name), _DropKnown(message)
                    logger.addFilter(known)
                    dropped.append((logger, known))
            yield
    finally:
        sys.meta_path.remove(announcer)
        for logger, known in dropped:
            logger.removeFilter(known)
