"""The public surface, pinned: what users import from ``mbridge_seqpack``, ``mbridge_seqpack.thd`` and
``mbridge_seqpack.compose.mixins``. A name added, dropped or moved fails here, so a change to it is a decision."""

from __future__ import annotations

import pytest

import mbridge_seqpack
import mbridge_seqpack.compose.mixins as mixins
import mbridge_seqpack.thd as thd

TOP_LEVEL = {
    "CheckReport": "mbridge_seqpack.report",
    "PackingConfigError": "mbridge_seqpack.errors",
    "PackingConfigWarning": "mbridge_seqpack.hook",
    "Violation": "mbridge_seqpack.errors",
    "apply": "mbridge_seqpack.compose.mixins",
    "check": "mbridge_seqpack.report",
    "install": "mbridge_seqpack.hook",
    "is_installed": "mbridge_seqpack.hook",
    "uninstall": "mbridge_seqpack.hook",
}
THD = {
    "StaticShapeMismatchError": "mbridge_seqpack.thd.inject",
    "StaticShapeOverflowError": "mbridge_seqpack.thd.layout",
    "StaticTHDBatches": "mbridge_seqpack.thd.step",
    "StaticTHDLayout": "mbridge_seqpack.thd.layout",
    "layout_from_config": "mbridge_seqpack.thd.step",
    "pad_cu_seqlens": "mbridge_seqpack.thd.layout",
    "static_cu_seqlens": "mbridge_seqpack.thd.layout",
    "static_forward_step": "mbridge_seqpack.thd.step",
    "static_packed_seq_params": "mbridge_seqpack.thd.layout",
    "static_thd_batch": "mbridge_seqpack.thd.layout",
    "static_thd_forward_step": "mbridge_seqpack.thd.step",
    "validate_cu_seqlens": "mbridge_seqpack.thd.layout",
}
MIXINS = [
    "Mixin",
    "OfflinePacking",
    "InBatchPacking",
    "ContextParallel",
    "Parallelism",
    "LongContext",
    "PackedCudaGraphs",
    "apply",
    "collect_facts",
    "derive",
]


def test_top_level_names() -> None:
    assert mbridge_seqpack.__all__ == [*sorted(TOP_LEVEL), "__version__"]
    assert mbridge_seqpack.__version__ == "0.1.0"


def test_thd_names() -> None:
    assert thd.__all__ == sorted(THD)


def test_mixin_names() -> None:
    assert mixins.__all__ == MIXINS
    assert all(callable(getattr(mixins, name)) for name in MIXINS)


@pytest.mark.parametrize(
    ("package", "owners"), [(mbridge_seqpack, TOP_LEVEL), (thd, THD)], ids=["mbridge_seqpack", "thd"]
)
def test_each_lazy_name_is_its_owners_object(package: object, owners: dict[str, str]) -> None:
    import importlib

    for name, owner in owners.items():
        assert getattr(package, name) is getattr(importlib.import_module(owner), name), name
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        getattr(package, "nothing")
