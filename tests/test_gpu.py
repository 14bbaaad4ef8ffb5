"""The GPU check script: its CPU dry run here (including that it fails on wrong boundaries), the real run on
a CUDA device.

On the device (PyTorch with CUDA; no TE or Megatron needed):
    PYTHONPATH=. python -m pytest -q -m gpu tests/test_gpu.py
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_on_cpu_writes_json_and_reports_skips(tmp_path: Path) -> None:
    done = _run("--dry-run", "--json", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert {k: v["status"] for k, v in results.items()} == {
        "a_attention_parity": "pass",
        "b_mutants_detected": "pass",
        "c_graph_replay_equals_eager": "skipped",
        "d_throughput_packed_vs_padded": "measured",
        "e_graph_vs_eager_step_time": "skipped",
        "f_cp_split_matches_kernel_formula": "pass",
    }
    assert results["b_mutants_detected"]["detected"] == {"off_by_one": 6, "dropped_boundary": 6, "shifted": 6}
    assert 0 < results["d_throughput_packed_vs_padded"]["padding_fraction_packed"] < 1
    assert done.stdout.rstrip().endswith("summary: 3 pass, 0 fail, 2 skipped, 1 measured")


def test_a_contiguous_cp_split_fails_the_dry_run(monkeypatch: pytest.MonkeyPatch) -> None:
    gc = _module()
    monkeypatch.setattr(
        gc, "thd_cp_partition_indices", lambda cu, cp, rank: torch.arange(int(cu[-1])).chunk(cp)[rank]
    )  # the mutant
    assert gc.check_cp_split([[10, 20, 30], [5, 40]])["status"] == "fail"


@pytest.mark.parametrize("broken", ["ignore_boundaries", "off_by_one_in_collate"])
def test_the_check_fails_when_the_packed_path_is_wrong(broken: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants of the code under test (attention ignoring cu_seqlens; boundaries built one token late) make
    check (a) fail on CPU."""
    gc = _module()
    real_attention, real_static = gc.causal_varlen, gc.static_cu_seqlens
    if broken == "ignore_boundaries":
        monkeypatch.setattr(
            gc,
            "causal_varlen",
            lambda q, k, v, cu, m: real_attention(q, k, v, torch.tensor([0, q.shape[0]], dtype=torch.int32), m),
        )
    else:

        def late(bounds: torch.Tensor, **kwargs: Any) -> Any:
            shifted = bounds.clone()
            shifted[1:-1] += 1
            return real_static(shifted, **kwargs)

        monkeypatch.setattr(gc, "static_cu_seqlens", late)
    gen = torch.Generator().manual_seed(0)
    parity, _ = gc.check_attention([[10, 20, 30], [5, 40]], 96, 6, torch.float64, torch.device("cpu"), gen)
    assert parity["status"] == "fail" and parity["max_abs_diff"] > 1e-3


def test_without_cuda_every_check_is_skipped(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    done = _run("--json", str(tmp_path / "r.json"))
    assert done.returncode == 0
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert {v["status"] for v in results.values()} == {"skipped"}


@pytest.mark.gpu
def test_gpu_check_passes_on_device(tmp_path: Path) -> None:
    done = _run("--json", str(tmp_path / "r.json"))
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert results["c_graph_replay_equals_eager"]["status"] == "pass"
