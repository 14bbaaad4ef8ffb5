"""Static-shape THD for CUDA-graph paths, and packed-vs-unpacked parity of an artifact.

Fixed-capacity ``cu_seqlens`` and ``PackedSeqParams`` (``layout``), the
step and iterator wrappers (``step``), the zero-code injection for full-iteration graphs (``inject``), the
unpacked reference computations (``reference``) and the packed-vs-unpacked parity checks of an artifact
(``verify``).

Names are imported lazily: ``import mbridge_seqpack.thd`` imports neither torch nor Megatron.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "StaticTHDLayout": "layout",
    "StaticShapeOverflowError": "layout",
    "validate_cu_seqlens": "layout",
    "pad_cu_seqlens": "layout",
    "static_cu_seqlens": "layout",
    "static_packed_seq_params": "layout",
    "static_thd_batch": "layout",
    "StaticTHDBatches": "step",
    "static_thd_forward_step": "step",
    "layout_from_config": "step",
    "static_forward_step": "step",
    "StaticShapeMismatchError": "inject",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mbridge_seqpack.thd' has no attribute {name!r}")
    return getattr(importlib.import_module(f"mbridge_seqpack.thd.{module}"), name)
