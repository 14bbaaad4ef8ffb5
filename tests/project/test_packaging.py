"""The wheel ships the recipes, the embedded corpus and tokenizer, and finds its recipes when installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.expected_recipes import EXPECTED_RECIPES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [uv, "build", "--wheel", "--out-dir", str(out), str(ROOT)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.glob("mbridge_seqpack-*.whl")
    return path


def _run_installed(wheel: Path, site: Path, code: str) -> str:
    """Run ``code`` in a fresh interpreter that sees only the unpacked wheel; its stdout."""
    zipfile.ZipFile(wheel).extractall(site)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=site,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "mbridge_seqpack/data/tokenizer/tokenizer.json",
        "mbridge_seqpack/data/sft_sample/training.jsonl",
        "mbridge_seqpack/rules/catalog.py",
    ):
        assert required in names, required
    # the checkout's top-level recipes/ are what the wheel ships, file for file
    top_level = {f"mbridge_seqpack/recipes/packaged/{p.name}" for p in (ROOT / "recipes").glob("*.py")}
    assert top_level and {n for n in names if n.startswith("mbridge_seqpack/recipes/packaged/")} == top_level
    assert not any(name.startswith(("tests/", "recipes/", "devtools/", "scripts/")) for name in names)
    assert not any(name.startswith(("mbridge_seqpack/census/", "mbridge_seqpack/packing/")) for name in names)
    assert "mbridge_seqpack_autoload.pth" in names  # the zero-code startup hook lands in site-packages
    assert "mbridge_seqpack/placement/_bfd.so" in names  # the packer's C kernel, built by hatch_build.py
    assert "mbridge_seqpack/placement/bfd.c" in names
    assert "-py3-none-any" not in wheel.name  # a platform wheel, since it carries a compiled library


def test_the_wheel_is_manylinux_tagged_and_needs_no_newer_glibc(wheel: Path) -> None:
    """A package index refuses ``linux_x86_64``; the kernel is loaded with ctypes (any CPython 3), and the glibc
    symbol versions it needs (what ``auditwheel show`` reads: GLIBC_2.2.5 here) are within the tag's."""
    import platform
    import re

    arch = platform.machine()
    assert wheel.name == f"mbridge_seqpack-0.1.0-py3-none-manylinux_2_17_{arch}.whl"
    tags = [
        line
        for line in zipfile.ZipFile(wheel).read("mbridge_seqpack-0.1.0.dist-info/WHEEL").decode().splitlines()
        if line.startswith("Tag:")
    ]
    assert tags == [f"Tag: py3-none-manylinux_2_17_{arch}"]
    library = zipfile.ZipFile(wheel).read("mbridge_seqpack/placement/_bfd.so")
    needed = {int(m) for m in re.findall(rb"GLIBC_2\.(\d+)", library)}
    assert needed and max(needed) <= 17


def test_installed_wheel_packs_with_its_c_kernel(wheel: Path, tmp_path: Path) -> None:
    out = _run_installed(
        wheel,
        tmp_path,
        "from mbridge_seqpack.placement.packer import native_kernel, pack_lengths; "
        "assert native_kernel() is not None; print(pack_lengths([5, 3, 2, 6], 8).tolist())",
    )
    assert sorted(out.split("[")[1].split("]")[0].replace(" ", "").split(",")) == ["0", "0", "1", "1"]


def test_installed_wheel_lists_the_packaged_recipes(wheel: Path, tmp_path: Path) -> None:
    code = "import mbridge_seqpack.recipes as r; print(r.recipes_dir()); print(','.join(r.list_recipes()))"
    out = _run_installed(wheel, tmp_path, code)
    where, names = out.splitlines()
    assert where == str(tmp_path / "mbridge_seqpack" / "recipes" / "packaged")
    assert names.split(",") == EXPECTED_RECIPES


def test_runtime_requirements_are_ranges(wheel: Path) -> None:
    """No torch / Transformer Engine / Megatron-Core pins in the wheel: it goes into an NGC container as is."""
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    requires = [
        line.split(":", 1)[1].strip()
        for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert "megatron-bridge<0.7,>=0.6.2" in requires
    assert not [
        r
        for r in requires
        if r.split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip()
        in ("torch", "transformer-engine", "megatron-core")
    ]
    assert not any("==" in r.split(";")[0] for r in requires)
    assert "nemo-run>=0.5; extra == 'nemo-run'" in requires  # the NeMo-Run plugin's optional dependency
    assert [r for r in requires if r.startswith("matplotlib")] == ["matplotlib; extra == 'plot'"]  # inspect --png


def test_installing_into_an_existing_megatron_bridge_environment_changes_nothing_else(wheel: Path) -> None:
    """A dry run into this environment (Megatron-Bridge, torch and TE already there) plans only the plugin."""
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    done = subprocess.run(
        [uv, "pip", "install", "--dry-run", "--offline", "--python", sys.executable, str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    planned = [line for line in done.stderr.splitlines() if line.strip().startswith(("+", "-"))]
    assert planned and all("mbridge-seqpack" in line for line in planned), done.stderr
