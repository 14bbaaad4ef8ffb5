"""The innermost library frame of a traceback (``mbridge_seqpack/frames.py``): named the same for an installed
library and for a checkout's source on the import path, and nothing for code outside the library."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from mbridge_seqpack.frames import library_path, site_of, traceback_site


def _raiser(filename: str) -> object:
    """A function whose frames carry ``filename`` (as if it were defined there), raising at its line 3."""
    namespace: dict[str, object] = {}
    exec(compile("def inner():\n    x = 1\n    raise ValueError(x)\n", filename, "exec"), namespace)
    return namespace["inner"]


def test_an_installed_library_file_is_named_from_its_package_root() -> None:
    site = "/opt/venv/lib/python3.12/site-packages"
    assert library_path(f"{site}/megatron/core/timers.py") == "megatron/core/timers.py"
    assert library_path(f"{site}/transformer_engine/pytorch/graph.py") == "transformer_engine/pytorch/graph.py"
    assert library_path(f"{site}/transformer_engine/pytorch/graph.py", ("megatron/",)) is None
    assert library_path(f"{site}/torch/nn/modules/module.py") is None
    assert library_path("/work/mbridge_seqpack/hook.py") is None


def test_a_checkout_on_the_import_path_is_named_like_an_installed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``contract --src`` imports a checkout's source: once imported from there, its files are the library's."""
    package = tmp_path / "src" / "frames_probe_lib"
    roots = ("frames_probe_lib/",)
    assert library_path(str(package / "mod.py"), roots) is None  # not imported: no folder known
    module = types.ModuleType("frames_probe_lib")
    module.__path__ = [str(package)]  # as a package imported from the checkout has it
    monkeypatch.setitem(sys.modules, "frames_probe_lib", module)
    assert library_path(str(package / "sub" / "mod.py"), roots) == "frames_probe_lib/sub/mod.py"
    assert library_path(str(tmp_path / "src" / "other" / "mod.py"), roots) is None
    assert library_path(str(tmp_path / "elsewhere" / "frames_probe_lib" / "mod.py"), roots) is None


def test_the_innermost_library_frame_of_a_traceback() -> None:
    inner = _raiser("/v/site-packages/megatron/core/probe.py")
    with pytest.raises(ValueError) as raised:
        inner()
    assert traceback_site(raised.value) == "megatron/core/probe.py:3 inner"
    assert traceback_site(raised.value, ("transformer_engine/",)) is None
    with pytest.raises(ValueError) as outside:
        raise ValueError("raised here")
    assert traceback_site(outside.value) is None


def test_frames_are_named_path_line_function_outermost_first() -> None:
    frames = [("megatron/a.py", 3, "f"), ("megatron/b.py", 9, "g")]
    assert site_of(frames) == ("megatron/b.py:9 g", ("megatron/a.py:3 f", "megatron/b.py:9 g"))
    assert site_of([]) == ("<outside Megatron>", ())
