"""The wheel ships the recipes, the embedded corpus and tokenizer, and finds its recipes when installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([uv, "build", "--wheel", "--out-dir", str(out), str(ROOT)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.glob("mbridge_seqpack-*.whl")
    return path


def test_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ("mbridge_seqpack/_packaged_recipes/llama3_8b_sft.py",
                     "mbridge_seqpack/_packaged_recipes/qwen25_vl_in_batch.py",
                     "mbridge_seqpack/data/tokenizer/tokenizer.json",
                     "mbridge_seqpack/data/sft_sample/training.jsonl",
                     "mbridge_seqpack/rules/catalog.py"):
        assert required in names, required
    assert not any(name.startswith("tests/") for name in names)
    assert "mbridge_seqpack_autoload.pth" in names  # the zero-code startup hook lands in site-packages


def test_installed_wheel_lists_the_packaged_recipes(wheel: Path, tmp_path: Path) -> None:
    zipfile.ZipFile(wheel).extractall(tmp_path)
    code = ("import mbridge_seqpack.recipes as r; print(r.recipes_dir()); print(','.join(r.list_recipes()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    where, names = done.stdout.splitlines()
    assert where == str(tmp_path / "mbridge_seqpack" / "_packaged_recipes")
    assert names.split(",") == ["llama31_8b_sft_128k_cp8", "llama31_8b_sft_32k_cp2", "llama31_8b_sft_64k_cp4",
                                "llama3_8b_sft_packed_8k", "llama3_8b_sft_packed_8k_cuda_graphs",
                                "qwen25_vl_3b_sft_in_batch_4k", "qwen3_8b_sft_16k_cp2", "small_gpt_smoke_4k"]
