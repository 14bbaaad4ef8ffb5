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
MUTANTS = (
    "zero_padded_tail",
    "last_end_plus_one",
    "tail_off_by_one",
    "unclosed_row",
    "truncated_to_capacity",
    "off_by_one",
    "dropped_boundary",
    "shifted",
    "max_seqlen_too_small",
)


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
    for mult in ("mult1", "mult8"):
        assert results["b_mutants_detected"][mult]["detected"] == dict.fromkeys(MUTANTS, 6)
    assert results["a_attention_parity"]["mult8"]["layout"]["mult"] == 8
    # Seeded lengths: the same 566 tokens in 5 rows of 128 at every run (an unseeded draw once filled its rows
    # exactly and failed CI's "0 < padding" check).
    throughput = results["d_throughput_packed_vs_padded"]
    assert (throughput["real_tokens"], throughput["padding_fraction_packed"]) == (566, 1 - 566 / (5 * 128))
    assert done.stdout.rstrip().endswith("summary: 3 pass, 0 fail, 2 skipped, 1 measured")


def test_a_contiguous_cp_split_fails_the_dry_run(monkeypatch: pytest.MonkeyPatch) -> None:
    gc = _module()
    monkeypatch.setattr(
        gc, "thd_cp_partition_indices", lambda cu, cp, rank: torch.arange(int(cu[-1])).chunk(cp)[rank]
    )  # the mutant
    assert gc.check_cp_split([[10, 20, 30], [5, 40]])["status"] == "fail"
    assert _module().check_cp_split([[10, 20, 30], [5, 40]])["status"] == "pass"


ROWS = [[10, 20, 30], [5, 40], [7, 7, 7, 7]]


def _parity(gc: Any, mult: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    layout = gc.layout_for(ROWS, 128, mult)
    parity, _ = gc.check_attention(ROWS, layout, mult, torch.float64, torch.device("cpu"), gen)
    return parity


@pytest.mark.parametrize("mult", [1, 8])
def test_the_right_static_batches_pass(mult: int) -> None:
    assert _parity(_module(), mult)["status"] == "pass"


def _zero_fill(cu: torch.Tensor, capacity: int, *, name: str = "cu_seqlens") -> torch.Tensor:
    return torch.cat([cu, cu.new_zeros(capacity - cu.shape[-1])])


@pytest.mark.parametrize("mult", [1, 8])
@pytest.mark.parametrize(
    "broken", ["ignore_boundaries", "late_boundaries", "zero_filled_capacity", "unclosed_rows", "no_gather"]
)
def test_the_check_fails_when_the_packed_path_is_wrong(
    broken: str, mult: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutants of the code under test make check (a) fail on CPU: attention ignoring the boundaries, boundaries
    one token late in the collate, mbridge_seqpack's capacity padding filling zeros, its row closing skipped, and
    the physical offsets ignored (no gather)."""
    from mbridge_seqpack.thd import layout as thd_layout

    gc = _module()
    if broken == "ignore_boundaries":
        real = gc.varlen_kernel
        monkeypatch.setattr(
            gc, "varlen_kernel", lambda q, k, v, cu, m: real(q, k, v, torch.tensor([0, q.shape[0]], dtype=cu.dtype), m)
        )
    elif broken == "late_boundaries":
        real_raw = gc.raw_batch

        def late(lengths: list[int], width: int, m: int) -> dict[str, Any]:
            batch = real_raw(lengths, width, m)
            batch["cu_seqlens_q"] = batch["cu_seqlens_q"].clone()
            batch["cu_seqlens_q"][0, 1:] += 1
            return batch

        monkeypatch.setattr(gc, "raw_batch", late)
    elif broken == "zero_filled_capacity":
        monkeypatch.setattr(thd_layout, "pad_cu_seqlens", _zero_fill)
    elif broken == "unclosed_rows":
        real_static = thd_layout.static_cu_seqlens
        monkeypatch.setattr(
            thd_layout, "static_cu_seqlens", lambda cu, **kw: real_static(cu, **{**kw, "row_width": None})
        )
    else:
        if mult == 1:
            pytest.skip("without alignment the physical offsets are the logical ones: nothing to gather")
        monkeypatch.setattr(
            gc, "gather_index", lambda lo, ph, total: (torch.arange(total), torch.arange(total) < lo[-1])
        )
    assert _parity(gc, mult)["status"] == "fail"


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
