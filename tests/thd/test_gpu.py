"""The GPU check script: its CPU dry run here (including that it fails on wrong boundaries, NaN outputs or
gradients, an unwritten kernel tail leaking into the comparison, and a launch without the injection), the real
run on a CUDA device.

On the device (PyTorch with CUDA; no TE or Megatron needed):
    PYTHONPATH=. python -m pytest -q -m gpu tests/thd/test_gpu.py
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

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"
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


@pytest.fixture(scope="module")
def dry_run(
    tmp_path_factory: pytest.TempPathFactory, megatron_bridge: Any
) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """One CPU dry run of the script (about a minute; it imports Megatron-Bridge in its process, so the tests reading
    it are slow: the fixture), its process and its JSON, for every test that reads them."""
    out = tmp_path_factory.mktemp("dry") / "r.json"
    done = _run("--dry-run", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    return done, json.loads(out.read_text())


def test_dry_run_on_cpu_writes_json_and_reports_skips(dry_run: tuple[subprocess.CompletedProcess, dict]) -> None:
    done, report = dry_run
    results = report["results"]
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
        launch = results["a_attention_parity"][mult]["launch"]
        assert launch["status"] == "pass" and launch["rows"] == 6
        assert (launch["step_host_reads"], launch["max_seqlen_on_host"], launch["boundaries_on_device"]) == (
            [],
            True,
            True,
        )
    assert results["a_attention_parity"]["mult8"]["layout"]["mult"] == 8
    # TE's own THD attention and partition kernel need CUDA: said skipped, with why, never counted as a pass
    for mult in ("mult1", "mult8"):
        assert results["a_attention_parity"][mult]["te_thd"] == {
            "status": "skipped",
            "reason": "TE's THD attention needs a CUDA device (dry run)",
        }
    assert results["f_cp_split_matches_kernel_formula"]["te_kernel"] == {
        "status": "skipped",
        "reason": "TE's partition kernel needs a CUDA device (dry run)",
    }
    # Seeded lengths: the same 586 tokens in 5 rows of 128 at every run (an unseeded draw once filled its rows
    # exactly and failed CI's "0 < padding" check).
    throughput = results["d_throughput_packed_vs_padded"]
    assert (throughput["real_tokens"], throughput["padding_fraction_packed"]) == (586, 1 - 586 / (5 * 128))
    summary = done.stdout.rstrip().splitlines()[-1]
    seconds = report["seconds"]
    assert summary == (
        f"summary: 3 pass, 0 fail, 2 skipped, 1 measured; 11 parts skipped at any depth, 0 not allowed; {seconds} s"
    )
    assert 0 < seconds < 300 and report["unallowed_skips"] == []
    # the plan comes first: what this dry run runs or skips, then what a CUDA run here would, each with why
    plan = report["plan"]
    lines = done.stdout.splitlines()
    assert (
        lines[0] == "plan (dry run, CPU):"
        and lines[1 + len(plan)] == "on a CUDA device, with what this machine has installed:"
    )
    assert lines[1 : 1 + len(plan)] == [f"  {part}: {what}" for part, what in plan.items()]
    assert plan["c graph replay"] == "skipped: CUDA graphs need a CUDA device (dry run)"
    assert plan["a launch path host reads"] == "runs: recorded with stand-in device tensors"
    assert "  a launch path host reads: runs: recorded on the GPU (real device)" in lines
    for mult in ("mult1", "mult8"):
        assert results["a_attention_parity"][mult]["attention_host_reads"] == {
            "status": "skipped",
            "reason": "the dry run's kernel is a host emulation: recorded on the GPU only",
        }


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


def _nan_rows(t: torch.Tensor, rows: slice) -> torch.Tensor:
    t = t.clone()
    t[rows] = float("nan")
    return t


class _NanGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return _nan_rows(grad, slice(1, 2))


@pytest.mark.parametrize("mult", [1, 8])
@pytest.mark.parametrize("broken", ["nan_output", "nan_gradient", "unmasked_tail", "unzeroed_output"])
def test_nan_and_the_unwritten_tail_fail_the_check(broken: str, mult: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN in a logical token's output or gradient fails (check (a) once took max(worst, nan), which is worst);
    the kernel's unwritten rows past cu_seqlens[-1] (NaN in the dry run's emulation, garbage on a GPU) must never
    reach the comparison: without the input mask they flow back into a physical row's gradient, without the output
    mask into its output."""
    gc = _module()
    real_kernel = gc.varlen_kernel
    if broken == "nan_output":
        monkeypatch.setattr(gc, "varlen_kernel", lambda *a: _nan_rows(real_kernel(*a), slice(1, 2)))
    elif broken == "nan_gradient":
        monkeypatch.setattr(gc, "varlen_kernel", lambda q, k, v, cu, m: real_kernel(_NanGrad.apply(q), k, v, cu, m))
    else:
        if mult == 1:
            pytest.skip("without alignment the logical boundaries close the row: no kernel row is left unwritten")

        def attention(q: Any, k: Any, v: Any, logical: Any, physical: Any, max_seqlen: int) -> torch.Tensor:
            where, inside = gc.gather_index(logical, physical, q.shape[0])
            keep = inside[:, None, None]
            compact = [t.index_select(0, where) for t in (q, k, v)]
            if broken == "unzeroed_output":
                compact = [torch.where(keep, c, torch.zeros_like(c)) for c in compact]
            out = gc.varlen_kernel(*compact, logical.to(torch.int32), max_seqlen)
            if broken == "unmasked_tail":
                out = torch.where(keep, out, torch.zeros_like(out))
            return torch.zeros_like(q).index_add(0, where, out)

        monkeypatch.setattr(gc, "attention", attention)
    parity = _parity(gc, mult)
    assert parity["status"] == "fail" and parity["max_abs_diff"] == float("inf")


def test_a_nan_never_compares_as_small() -> None:
    gc = _module()
    nan, zero = torch.tensor([float("nan")]), torch.tensor([0.0])
    assert max(0.1, float("nan")) == 0.1  # how NaN used to pass
    assert gc.max_diff((nan,), (zero,)) == gc.max_diff((zero,), (nan,)) == float("inf")
    assert gc.tolerance(float("nan"), torch.float64) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("mult", [1, 8])
def test_the_launch_path_runs_through_the_injected_data_read(megatron_bridge: Any, mult: int) -> None:
    """Megatron-Bridge's collate, FullCudaGraphWrapper.data_read with the injection, get_batch_from_iterator and
    get_packed_seq_params: the step reads nothing on the host and attention passes (a) on what it gets."""
    gc = _module()
    gen = torch.Generator().manual_seed(0)
    layout = gc.layout_for(ROWS, 128, mult)
    launch = gc.check_launch(ROWS, layout, mult, torch.float64, torch.device("cpu"), gen)
    assert launch["status"] == "pass", launch
    facts = (launch["step_host_reads"], launch["max_seqlen_on_host"], launch["boundaries_on_device"])
    assert facts == ([], True, True)


@pytest.mark.slow
def test_a_launch_without_the_injection_fails_the_check(megatron_bridge: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: data_read without mbridge_seqpack's wrapper. The step's max_seqlen is then a device buffer that
    get_batch_from_iterator reads back with .cpu(): the launch check fails, naming the read."""
    import contextlib

    from mbridge_seqpack.thd import inject

    gc = _module()
    monkeypatch.setattr(inject, "installed", lambda on: contextlib.nullcontext())
    layout = gc.layout_for(ROWS, 128, 8)
    launch = gc.check_launch(ROWS, layout, 8, torch.float64, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert launch["status"] == "fail" and launch["max_seqlen_on_host"] is False
    assert launch["step_host_reads"][0] == (
        "device-to-host copy (.cpu()) at megatron/bridge/training/gpt_step.py:268 get_batch_from_iterator"
    )


@pytest.mark.slow
def test_a_host_read_in_the_step_fails_the_launch_check(megatron_bridge: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the injection on, any host read the step makes (here the boundaries read back with .tolist(), as
    Megatron-Core's non-fused THD RoPE does) fails the launch check, named at its site."""
    gc = _module()
    real = gc.step_fields

    def reading(static: dict[str, Any]) -> Any:
        batch, fields = real(static)
        fields[0].tolist()
        return batch, fields

    monkeypatch.setattr(gc, "step_fields", reading)
    layout = gc.layout_for(ROWS, 128, 8)
    launch = gc.check_launch(ROWS, layout, 8, torch.float64, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert launch["status"] == "fail" and launch["max_seqlen_on_host"] is True
    assert launch["step_host_reads"] == ["host read (tolist()) at <outside Megatron>"] * len(ROWS)


def test_without_cuda_and_without_dry_run_it_refuses_to_pass(tmp_path: Path) -> None:
    """Every check skipped used to exit 0: on a machine whose CUDA is broken the GPU check "passed". It now runs
    nothing, writes nothing and exits 2 with one line that says what to do."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    done = _run("--json", str(tmp_path / "r.json"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "gpu_check: no CUDA device here; run it on the GPU machine, or pass --dry-run for the CPU check (float64, "
        "tiny sizes)"
    )
    assert not (tmp_path / "r.json").exists()


def _without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``modules`` unimportable for the test (as on a device with PyTorch but no TE or Megatron)."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_without_te_each_te_part_says_skipped_te_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA machine without TE (the lent device), TE's THD attention and partition kernel are skipped with
    the reason, before any CUDA call; the torch-only checks still run."""
    gc = _module()
    _without(monkeypatch, "transformer_engine", "transformer_engine_torch")
    assert gc.te_thd_attention(torch.device("cuda")) == (None, "TE not installed")
    assert gc.te_partition_kernel(True) == (None, "TE not installed")
    result = gc.check_cp_split([[10, 20, 30]], cuda=False)
    assert result["status"] == "pass" and result["te_kernel"] == {"status": "skipped", "reason": "TE not installed"}
    plan = gc.plan(True)
    assert (
        plan["a te_thd (TE's THD DotProductAttention)"]
        == plan["f te_kernel (thd_get_partitioned_indices)"]
        == ("skipped: TE not installed")
    )
    assert plan["a custom step host reads"] == "runs: recorded on the GPU (real device)"


def test_without_megatron_the_launch_path_is_skipped_and_the_graph_runs_the_custom_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gc = _module()
    _without(monkeypatch, "megatron.bridge", "megatron.core")
    assert gc.megatron_missing() == "Megatron-Bridge not installed"
    plan = gc.plan(True)
    assert plan["a launch path (Megatron-Bridge collate, injected data_read, step)"] == (
        "skipped: Megatron-Bridge not installed"
    )
    assert plan["c graph replay"] == "runs: on CUDA, fed by the custom step (Megatron-Bridge not installed)"
    results = gc.run_checks(False, 2)
    for mult in ("mult1", "mult8"):
        parity = results["a_attention_parity"][mult]
        assert parity["launch"] == {"status": "skipped", "reason": "Megatron-Bridge not installed"}
    assert results["a_attention_parity"]["status"] == results["b_mutants_detected"]["status"] == "pass"


def test_the_real_device_recorder_finds_a_host_read_in_the_step() -> None:
    """The GPU run's host-read sub-check: mbridge_seqpack's recorder in its real-device mode (here the CPU plays
    the device). The gather's index arithmetic reads nothing; the dry run's kernel emulation does read
    (``int(cu[-1])``), and so would a step that reads its boundaries back: the sub-check fails, naming the read."""
    gc = _module()
    lo, ph = torch.tensor([0, 10, 30, 60], dtype=torch.int32), torch.tensor([0, 16, 32, 64], dtype=torch.int32)
    with gc.device_recorder("cpu") as recorder:
        gc.gather_index(lo, ph, 128)
    assert recorder.reads == [] and gc.host_read_result([]) == {"status": "pass", "reads": []}
    q = torch.randn(128, gc.HEADS, gc.DIM, dtype=torch.float64)
    with gc.device_recorder("cpu") as recorder:
        gc.attention(q, q, q, lo, ph, 30)
        lo.tolist()
    reads = [r.describe() for r in recorder.reads]
    assert reads[0] == "host read (int(tensor)) at <outside Megatron>" and reads[-1].startswith("host read (tolist())")
    assert gc.host_read_result(reads)["status"] == "fail"
    with gc.device_recorder(None) as nothing:
        assert nothing is None


@pytest.mark.gpu
def test_gpu_check_passes_on_device(tmp_path: Path) -> None:
    missing = [
        part
        for part, module in (("te_thd", "transformer_engine"), ("te_kernel", "transformer_engine"))
        + (("launch", "megatron.bridge"),)
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None
    ]
    done = _run("--json", str(tmp_path / "r.json"), *(["--allow-skips", ",".join(missing)] if missing else []))
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert results["c_graph_replay_equals_eager"]["status"] == "pass"
    for mult in ("mult1", "mult8"):  # recorded on the GPU itself: the step's attention read nothing on the host
        assert results["a_attention_parity"][mult]["attention_host_reads"] == {"status": "pass", "reads": []}
        launch = results["a_attention_parity"][mult]["launch"]
        if importlib.util.find_spec("megatron.bridge") is not None:
            assert (launch["status"], launch["step_host_reads"], launch["recorded_on"]) == (
                "pass",
                [],
                "cuda (real device)",
            )
        else:
            assert launch == {"status": "skipped", "reason": "Megatron-Bridge not installed"}
    if importlib.util.find_spec("transformer_engine") is not None:  # TE's own kernels ran, not only formulas
        assert results["f_cp_split_matches_kernel_formula"]["te_kernel"]["status"] == "pass"
        for mult in ("mult1", "mult8"):
            assert results["a_attention_parity"][mult]["te_thd"]["status"] == "pass"


#: what a CUDA run without TE (the lent device) skips, at any depth, as the dry run's results name the parts
WITHOUT_TE = [
    f"a_attention_parity.{mult}.{path}"
    for mult in ("mult1", "mult8")
    for path in ("te_thd", "attention_host_reads", "launch.te_thd", "launch.attention_host_reads")
] + [
    "c_graph_replay_equals_eager",
    "e_graph_vs_eager_step_time",
    "f_cp_split_matches_kernel_formula.te_kernel",
]


def test_a_skip_the_run_was_not_asked_for_fails_it(dry_run: tuple[subprocess.CompletedProcess, dict]) -> None:
    """Nested skips used to leave the exit status 0: a GPU run with TE's THD attention, the launch path and TE's
    partition kernel all skipped passed. Every skip at any depth counts, unless the run was asked for it (a dry run's
    CUDA-only parts, ``--no-launch``) or ``--allow-skips`` names it."""
    gc = _module()
    results = json.loads(json.dumps(dry_run[1]["results"]))
    assert [path for path, _ in gc.unallowed_skips(results, [], dry_run=False, no_launch=False)] == WITHOUT_TE
    assert gc.unallowed_skips(results, [], dry_run=True, no_launch=False) == []
    assert gc.unallowed_skips(results, list(gc.SKIPPABLE), dry_run=False, no_launch=False) == []
    allowed = ["te_thd", "mult1.attention_host_reads"]
    assert [p for p, _ in gc.unallowed_skips(results, allowed, dry_run=False, no_launch=False)] == [
        "a_attention_parity.mult1.launch.attention_host_reads",
        "a_attention_parity.mult8.attention_host_reads",
        "a_attention_parity.mult8.launch.attention_host_reads",
        "c_graph_replay_equals_eager",
        "e_graph_vs_eager_step_time",
        "f_cp_split_matches_kernel_formula.te_kernel",
    ]
    no_megatron = {"status": "skipped", "reason": "Megatron-Bridge not installed"}
    for mult in ("mult1", "mult8"):  # a device without Megatron: the launch path is a skip it must be told of
        results["a_attention_parity"][mult]["launch"] = no_megatron
    assert gc.unallowed_skips(results, [], dry_run=True, no_launch=False) == [
        ("a_attention_parity.mult1.launch", "Megatron-Bridge not installed"),
        ("a_attention_parity.mult8.launch", "Megatron-Bridge not installed"),
    ]
    assert gc.unallowed_skips(results, ["launch"], dry_run=True, no_launch=False) == []
    for mult in ("mult1", "mult8"):
        results["a_attention_parity"][mult]["launch"] = {"status": "skipped", "reason": "--no-launch"}
    assert gc.unallowed_skips(results, [], dry_run=True, no_launch=True) == []
    assert {path.rsplit(".", 1)[-1] for path, _ in gc.skipped_parts(results)} <= set(gc.SKIPPABLE)


def test_main_exits_1_naming_each_skip_not_allowed(
    dry_run: tuple[subprocess.CompletedProcess, dict], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """The exit status and the lines of a run whose checks all pass but whose TE parts were skipped (the dry run's
    results, as a CUDA-less TE-less run of the checks would give them, fed to ``main``)."""
    gc = _module()
    results = json.loads(json.dumps(dry_run[1]["results"]))
    for mult in ("mult1", "mult8"):
        results["a_attention_parity"][mult]["te_thd"] = {"status": "skipped", "reason": "TE not installed"}
    monkeypatch.setattr(gc, "run_checks", lambda cuda, rows, launch=True: results)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--dry-run"])
    assert gc.main() == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("  UNASKED")] == [
        f"  UNASKED  a_attention_parity.{m}.te_thd: skipped, TE not installed; --allow-skips te_thd accepts it"
        for m in ("mult1", "mult8")
    ]
    assert lines[-1].startswith("summary: 3 pass, 0 fail, 2 skipped, 1 measured; 11 parts skipped at any depth, 2 not")
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--dry-run", "--allow-skips", "te_thd"])
    assert gc.main() == 0


def test_an_allow_skips_name_that_is_no_part_exits_2_before_running() -> None:
    done = _run("--dry-run", "--allow-skips", "te_thd,te_thd_attention")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        "gpu_check: --allow-skips names no part that can be skipped: te_thd_attention (the parts: te_thd, launch, "
        "attention_host_reads, te_kernel, c_graph_replay_equals_eager, e_graph_vs_eager_step_time)"
    )
