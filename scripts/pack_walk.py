"""The walk of ``pack``'s input through the plugin's modules (issue #34): which rooms the data enters, how often.

``pack_jsonl`` runs on the embedded corpus under ``sys.setprofile``. Every *first* call of a plugin function (its
code object seen for the first time, so a loop or a repeated call adds nothing) is attributed to the module whose
file holds it; consecutive calls in one module are one stay. A room is a module, or (the second figures) a
top-level package, a core module counting as its own package; ``returns`` counts the
stays in a room the walk had already left (stays - rooms). What runs while a module is being imported (module and
class bodies, a lazy import inside a function) is not the data's path and is left out; so are code generated at run
time (dataclass ``__init__``) and the tokenizer's worker processes. The local path only (``pack --ray`` hands the
same calls to workers).

    PYTHONPATH=$PWD .venv/bin/python scripts/pack_walk.py [--pack-size 8192 2048] [--data-parallel 8] [--json]

prints the walk with both kinds of room.

It measures the layout it finds (``pipeline.pack`` since issue #34, ``packing.pipeline`` before it); the
architecture test holds the package walk to the pack path's order.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

PACKAGE = Path(__file__).resolve().parents[1] / "mbridge_seqpack"


@dataclass(frozen=True)
class Walk:
    """The rooms (modules) in the order the data first enters them, and every stay in order."""

    stays: tuple[str, ...]
    calls: tuple[str, ...] = ()  # ``room:function`` of every first call, in order

    def by_package(self) -> "Walk":
        """The walk with a top-level package (or core module) as the room: ``placement/balance`` -> ``placement``."""
        stays: list[str] = []
        for room in self.stays:
            package = room.split("/")[0]
            if not stays or stays[-1] != package:
                stays.append(package)
        return Walk(tuple(stays), self.calls)

    @property
    def rooms(self) -> list[str]:
        return list(dict.fromkeys(self.stays))

    @property
    def returns(self) -> int:
        return len(self.stays) - len(self.rooms)

    def entries(self) -> dict[str, int]:
        """How many times the walk enters each room."""
        return dict(Counter(self.stays))

    def to_dict(self) -> dict[str, Any]:
        return {
            "rooms": len(self.rooms),
            "stays": len(self.stays),
            "returns": self.returns,
            "entries": self.entries(),
            "walk": list(self.stays),
            "calls": list(self.calls),
        }

    def to_text(self) -> str:
        counts = ", ".join(f"{room} {n}" for room, n in sorted(self.entries().items(), key=lambda kv: -kv[1]))
        return (
            f"{len(self.rooms)} rooms, {len(self.stays)} stays, {self.returns} returns\n"
            f"entries: {counts}\nwalk: {' -> '.join(self.stays)}"
        )


def _room(filename: str) -> str | None:
    """``placement/balance`` for a plugin file, None for any other code and for ``textout`` (the progress bars and
    text for people: the data does not pass through them)."""
    try:
        relative = Path(filename).resolve().relative_to(PACKAGE)
    except ValueError:
        return None
    return None if relative.with_suffix("").as_posix() == "textout" else str(relative.with_suffix(""))


def trace_walk(run: Callable[[], Any]) -> Walk:
    """The walk of the plugin's code while ``run()`` runs (threads it starts included)."""
    seen: set[Any] = set()
    stays: list[str] = []
    calls: list[str] = []
    rooms: dict[str, str | None] = {}

    importing = threading.local()  # module bodies being run in this thread (an import in progress)

    def profile(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if code.co_name == "<module>":  # an import runs the module's body, class bodies in it: not the data's path
            if event in ("call", "return"):
                importing.depth = getattr(importing, "depth", 0) + (1 if event == "call" else -1)
            return
        if event != "call" or code in seen or getattr(importing, "depth", 0) > 0:
            return
        seen.add(code)
        name = code.co_filename
        room = rooms[name] if name in rooms else rooms.setdefault(name, _room(name))
        if room is None:
            return
        calls.append(f"{room}:{code.co_qualname}")
        if not stays or stays[-1] != room:
            stays.append(room)

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return Walk(tuple(stays), tuple(calls))


def pack_walk(pack_size: int = 8192, data_parallel: int = 8, micro_batches: int = 1) -> Walk:
    """The walk of ``pack_jsonl`` over the embedded corpus (both splits), into a temporary directory."""
    import warnings

    from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl

    data = PACKAGE / "data"
    inputs = {
        "training": data / "sft_sample" / "training.jsonl",
        "validation": data / "sft_sample" / "validation.jsonl",
    }
    options = PackOptions(pack_size=pack_size, data_parallel=data_parallel, micro_batches=micro_batches)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.bridge.data.packing.offline import tokenize_dataset  # noqa: F401  (imported outside the walk)

        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "packed"
            return trace_walk(
                lambda: pack_jsonl(inputs, tokenizer=data / "tokenizer", output_dir=out, options=options)
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pack-size", type=int, nargs="+", default=[8192], help="one walk per size, one process")
    parser.add_argument("--data-parallel", type=int, default=8)
    parser.add_argument("--micro-batches", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    found: dict[str, dict[str, Walk]] = {}
    for size in args.pack_size:
        walk = pack_walk(size, args.data_parallel, args.micro_batches)
        found[str(size)] = {"module": walk, "package": walk.by_package()}
    if args.json:
        print(json.dumps({size: {k: w.to_dict() for k, w in ws.items()} for size, ws in found.items()}, indent=1))
        return
    for size, walks in found.items():
        for rooms, walk in walks.items():
            print(f"pack size {size}, DP {args.data_parallel}, rooms: {rooms}s\n{walk.to_text()}\n")


if __name__ == "__main__":
    main()
