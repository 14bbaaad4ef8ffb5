"""The pack path's former home, kept so that ``mbridge_seqpack.packing...`` imports keep working (issue #34).

``packing/`` held four concerns side by side; they now live in packages of their own (docs/architecture.md):

- ``mbridge_seqpack.tokenization``: Megatron-Bridge's own tokenization (``sequences``, ``batched_tokens``,
  ``assembly``, ``truncation``, ``dataset_kwargs``);
- ``mbridge_seqpack.placement``: rows and their balance (``packer``, ``balance``, ``level``, ``exchange``);
- ``mbridge_seqpack.artifact``: the sealed artifact, written and read back verified (``store``, the former
  ``packing.artifact``; ``seal``, ``row_group_seal``, ``parquet_stitch``, ``inspect_artifact``,
  ``builder_location``, ``collate``, ``phases``, ``content_check``, ``verified_parquet``, ``launch_guard``);
- ``mbridge_seqpack.pipeline``: what drives them, locally (``pack``, the former ``packing.pipeline``) or on Ray
  (``ray_engine``);
- ``mbridge_seqpack.digests``: remembered file digests, used by all of them.

An old name imports the module at its new place: the *same* module object, so ``monkeypatch`` and ``isinstance``
see one module, and a :class:`DeprecationWarning` names the new import. What stays here is the packer's C kernel
(``native/bfd.c``, compiled next to it by ``hatch_build.py``; ``placement/packer.py`` loads it from here).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "pack_lengths", "packing_stats", "PackingStats"]

#: old module (under ``mbridge_seqpack.packing``) -> its module now
MOVED = {
    "sequences": "mbridge_seqpack.tokenization.sequences",
    "batched_tokens": "mbridge_seqpack.tokenization.batched_tokens",
    "assembly": "mbridge_seqpack.tokenization.assembly",
    "truncation": "mbridge_seqpack.tokenization.truncation",
    "dataset_kwargs": "mbridge_seqpack.tokenization.dataset_kwargs",
    "packer": "mbridge_seqpack.placement.packer",
    "balance": "mbridge_seqpack.placement.balance",
    "level": "mbridge_seqpack.placement.level",
    "exchange": "mbridge_seqpack.placement.exchange",
    "artifact": "mbridge_seqpack.artifact.store",
    "seal": "mbridge_seqpack.artifact.seal",
    "row_group_seal": "mbridge_seqpack.artifact.row_group_seal",
    "parquet_stitch": "mbridge_seqpack.artifact.parquet_stitch",
    "inspect_artifact": "mbridge_seqpack.artifact.inspect_artifact",
    "builder_location": "mbridge_seqpack.artifact.builder_location",
    "collate": "mbridge_seqpack.artifact.collate",
    "phases": "mbridge_seqpack.artifact.phases",
    "content_check": "mbridge_seqpack.artifact.content_check",
    "verified_parquet": "mbridge_seqpack.artifact.verified_parquet",
    "launch_guard": "mbridge_seqpack.artifact.launch_guard",
    "pipeline": "mbridge_seqpack.pipeline.pack",
    "ray_engine": "mbridge_seqpack.pipeline.ray_engine",
    "digests": "mbridge_seqpack.digests",
}
#: names the package itself exported
_EXPORTS = {name: "mbridge_seqpack.placement.packer" for name in ("pack_lengths", "packing_stats", "PackingStats")}

# the warning points at the code that imported the old name, not at the import machinery or this file
_SKIP = (str(Path(__file__).parent), str(Path(importlib.__file__).parent), "<frozen importlib")


def _moved(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new} (issue #34); import it from there",
        DeprecationWarning,
        skip_file_prefixes=_SKIP,
    )


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``mbridge_seqpack.packing.<old>`` and loads it as the module at its new place."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        prefix, _, name = fullname.rpartition(".")
        if prefix != __name__ or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> ModuleType:
        new = MOVED[spec.name.rpartition(".")[2]]
        _moved(spec.name, new)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module at its new place has run already; the import system, which files it under the old name
        too, has just set its ``__spec__`` to the old name's: give it back its own."""
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)

    def __init__(self) -> None:
        self._specs: dict[str, Any] = {}


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        _moved(f"{__name__}.{name}", f"{_EXPORTS[name]}.{name}")
        value = globals()[name] = getattr(importlib.import_module(_EXPORTS[name]), name)  # warned once
        return value
    if name in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
