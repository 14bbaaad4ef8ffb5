"""The GPU check script: its CPU dry run here, the real run on a CUDA device.

On the device (PyTorch with CUDA; no TE or Megatron needed):
    PYTHONPATH=. python -m pytest -q -m gpu tests/test_gpu.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_dry_run_on_cpu_checks_parity() -> None:
    done = _run("--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "  PASS  (a) packed vs unpacked loss" in done.stdout
    assert done.stdout.rstrip().endswith("summary: 4 of 4 checks passed")


def test_without_cuda_the_script_skips() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    done = _run()
    assert (done.returncode, done.stdout) == (0, "gpu_check: no CUDA device: skipped\n")


@pytest.mark.gpu
def test_gpu_check_passes_on_device() -> None:
    done = _run()
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "PASS  (b) CUDA graph replay == eager" in done.stdout
