"""mbridge_seqpack: sequence packing and long-context safety for Megatron-Bridge.

Public API (imported lazily: ``import mbridge_seqpack`` does not import Megatron-Bridge)::

    mbridge_seqpack.install(mode="error")     # rules run inside ConfigContainer.validate()
    mbridge_seqpack.uninstall()
    mbridge_seqpack.check(cfg, world_size=8)  # -> CheckReport (iterating it gives the violations)
    mbridge_seqpack.apply(cfg, *mixins)       # recipe mixins
    mbridge_seqpack.PackingConfigError        # ValueError with .violations
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "install": "mbridge_seqpack.hook",
    "uninstall": "mbridge_seqpack.hook",
    "is_installed": "mbridge_seqpack.hook",
    "PackingConfigWarning": "mbridge_seqpack.hook",
    "check": "mbridge_seqpack.report",
    "CheckReport": "mbridge_seqpack.report",
    "PackingConfigError": "mbridge_seqpack.errors",
    "Violation": "mbridge_seqpack.errors",
    "apply": "mbridge_seqpack.compose.mixins",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mbridge_seqpack' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
