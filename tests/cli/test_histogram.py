"""``inspect --png`` without matplotlib (the ``plot`` extra, not a requirement of the plugin): exit 2 with the command
that installs it, before the artifact is read; with it, the plot is drawn (tests/artifact/test_artifacts.py). The
wheel's metadata lists it under the extra only (tests/project/test_packaging.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


def test_png_without_matplotlib_names_the_extra_before_reading_the_artifact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from mbridge_seqpack.cli.main import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` meets where it is not installed
    missing = tmp_path / "no_such_pack"  # never read: the refusal comes first
    assert main(["inspect", str(missing), "--png", str(tmp_path / "plot.png")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "inspect --png draws with matplotlib, which cannot be imported here (import of matplotlib halted; None in "
        "sys.modules); install it with `pip install 'mbridge-seqpack[plot]'` (or `pip install matplotlib`), or leave "
        "out --png"
    ) in err, err
    assert str(missing) not in err and not (tmp_path / "plot.png").exists()
