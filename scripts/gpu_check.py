"""GPU check for static THD packing, on the batches training really gets (one command, under 5 minutes).

Rows reach attention by the two paths training uses. *Launch*: Megatron-Bridge's own packed collate
(``GPTSFTPackedDataset.collate_fn`` with ``pad_cu_seqlens``: logical ``cu_seqlens_q``, physical
``cu_seqlens_q_padded`` aligned to ``pad_seq_to_mult``, one ``max_seqlen`` from the pack metadata) read by
Megatron-Core's ``FullCudaGraphWrapper.data_read`` with mbridge_seqpack's injection installed (static device
buffers, host ``max_seqlen``), then by Megatron-Bridge's ``get_batch_from_iterator`` and ``get_packed_seq_params``,
as a full-iteration graph's step reads them. *Custom step*: the same rows in that collate convention made static by
``mbridge_seqpack.thd.static_thd_batch`` with a ``StaticTHDLayout`` read from the same pack metadata. Attention
consumes exactly the fields the step gets: logical boundaries, physical (ragged, padded) offsets, ``max_seqlen``:

- where TE is installed (and CUDA present), through TE's own THD path (``DotProductAttention`` with
  ``qkv_format="thd"``, ``padding_causal``, the logical ``cu_seqlens``, the physical ``cu_seqlens_*_padded`` and
  ``max_seqlen``: what Megatron-Core's ``TEDotProductAttention`` gets from the step), compared on the logical tokens
  (``te_thd`` in (a); skipped, with why, elsewhere); and
- the logical tokens are gathered from their physical offsets with device index arithmetic (no host reads, static
  shapes, capturable), attended with causal varlen attention driven by the logical boundaries and ``max_seqlen``
  (``torch.nn.attention.varlen.varlen_attn``, flash, on CUDA; the float64 reference in ``--dry-run``), and
  scattered back. Flash writes no row past ``cu_seqlens[-1]`` of its output or of its q/k/v gradients; the dry run's
  kernel leaves those rows NaN the same way, and the gather zeroes them (inputs masked before the kernel, output
  after), so padding is compared honestly: every logical token against each sequence attended alone, every other
  position against exactly zero. A NaN or an infinity anywhere fails a comparison.

Checks (each "pass", "fail", "skipped" with a reason, or "measured"):
  (a) outputs and q/k/v gradients of the packed call equal each sequence attended alone at its physical offset
      (zero elsewhere), within a tolerance from the dtype's measured noise, on both paths; the step reads nothing
      on the host: the launch step's reads of the injected buffers and the custom step's attention, recorded by
      devtools' host-read recorder on the GPU itself (its real-device mode; ``--dry-run``: the launch
      step with stand-in device tensors, the custom step not, its kernel being a host emulation);
  (b) boundary mutants of the static batch fail: the THD contract check (capacity, monotone, closed row,
      logical within physical, max_seqlen bound) or (a)'s comparison: zero-padded tail, last end + 1, tail off by
      one, unclosed row, truncation to capacity, off by one, dropped boundary, shifted, max_seqlen too small;
  (c) one CUDA-graph capture of the launch path's step (``get_batch_from_iterator``, ``get_packed_seq_params``,
      forward and backward) over the injected ``data_read`` buffers, replayed over rows with other boundaries
      (``data_read`` refills the buffers), equals eager within the eager-vs-eager spread, deterministic algorithms
      on (CUDA only; without Megatron the custom step's static buffers, refilled in place, feed the graph);
  (d) throughput, packed rows vs padded batches at equal real tokens; (e) graph vs eager step time;
  (f) the THD context-parallel split of the physical boundaries equals the kernel's formula, and TE's partition
      kernel itself (``thd_get_partitioned_indices``) where TE and CUDA are present (else "te_kernel" is skipped).

The launch path needs Megatron-Bridge and Megatron-Core importable (an NGC container, this repo's environment);
without them, or with ``--no-launch``, it is skipped, saying why (then (a) covers the custom-step path only). TE is
optional the same way ("skipped: TE not installed"): a machine with PyTorch and CUDA alone runs every torch-only
check. Each run first prints its plan, one line per part, "runs" or "skipped: why"; ``--dry-run`` also prints what
a CUDA run with this machine's installs would run.

    PYTHONPATH=. python scripts/gpu_check.py --json out/gpu_check.json            # on the GPU machine
    PYTHONPATH=. python scripts/gpu_check.py --dry-run --json out/gpu_check.json  # CPU: float64, tiny sizes
Exit 0 when no check failed and nothing was skipped that the run was not told to skip; 1 when a check failed or a
part was skipped (TE, Megatron or a kernel missing) that ``--allow-skips`` does not name: a GPU run that skipped TE's
THD attention, the launch path or TE's partition kernel is no evidence about them, so it must not read as a pass.
``--allow-skips te_thd,launch`` accepts those parts by name (a result's dotted path or its last part, as the skip
lines print them); a dry run's CUDA-only skips and ``--no-launch``'s are what the run was asked for. Without CUDA and
without --dry-run it runs nothing and exits 2, as it does for an ``--allow-skips`` name that is no part of the check.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mbridge_seqpack.thd import StaticTHDLayout, static_thd_batch  # noqa: E402
from mbridge_seqpack.thd.reference import thd_cp_partition_indices, varlen_causal_attention  # noqa: E402

HEADS, DIM = 4, 32
#: the parts a run can skip (the last part of a skipped result's dotted path): what ``--allow-skips`` may name
SKIPPABLE = (
    "te_thd",
    "launch",
    "attention_host_reads",
    "te_kernel",
    "c_graph_replay_equals_eager",
    "e_graph_vs_eager_step_time",
)
NAMES = (
    "a_attention_parity",
    "b_mutants_detected",
    "c_graph_replay_equals_eager",
    "d_throughput_packed_vs_padded",
    "e_graph_vs_eager_step_time",
    "f_cp_split_matches_kernel_formula",
)


# ---- what is installed --------------------------------------------------------------------------------------


def missing(module: str, what: str) -> str | None:
    """Why ``module`` cannot run here ("TE not installed"), or None when it is importable."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"{what} not installed"


def te_missing() -> str | None:
    return missing("transformer_engine", "TE")


def megatron_missing() -> str | None:
    """The launch path needs Megatron-Bridge's collate and step and Megatron-Core's full-iteration wrapper."""
    return missing("megatron.bridge", "Megatron-Bridge") or missing("megatron.core", "Megatron-Core")


# ---- the static batch ---------------------------------------------------------------------------------------


def pack_metadata(rows: list[list[int]], mult: int) -> list[dict[str, int]]:
    """The pack metadata Megatron-Bridge's prep writes for these rows; the pack also holds a row of two more
    sequences, so every row here has capacity padding to check."""
    padded = [[-(-n // mult) * mult for n in row] for row in rows]
    return [
        {
            "max_samples_per_bin": max(len(r) for r in rows) + 2,
            "dataset_max_seqlen": max(max(r) for r in padded),
            "min_packed_seqlen": min(sum(r) for r in padded),
        }
    ]


def layout_for(rows: list[list[int]], width: int, mult: int) -> StaticTHDLayout:
    """The layout the training path sizes from pack metadata (written and read back as Megatron-Bridge's is)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{width}_metadata.jsonl"
        path.write_text(json.dumps(pack_metadata(rows, mult)))
        return StaticTHDLayout.from_pack_metadata(path, width)


def raw_batch(lengths: list[int], width: int, mult: int) -> dict[str, torch.Tensor]:
    """One micro batch as Megatron-Bridge's packed collate emits it before static padding: logical boundaries
    (cumulative lengths) and, when ``mult`` > 1, physical offsets of the slots aligned to ``mult``."""
    logical, physical = [0], [0]
    for n in lengths:
        logical.append(logical[-1] + n)
        physical.append(physical[-1] + -(-n // mult) * mult)
    batch = {
        "tokens": torch.zeros(1, width, dtype=torch.int64),
        "cu_seqlens_q": torch.tensor([logical], dtype=torch.int32),
        "max_seqlen_q": torch.tensor([[max(lengths)]], dtype=torch.int32),
    }
    batch["cu_seqlens_kv"] = batch["cu_seqlens_q"]
    batch["max_seqlen_kv"] = batch["max_seqlen_q"]
    if mult > 1:
        batch["cu_seqlens_q_padded"] = batch["cu_seqlens_kv_padded"] = torch.tensor([physical], dtype=torch.int32)
    return batch


def static_row(lengths: list[int], layout: StaticTHDLayout, mult: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(logical, physical, max_seqlen) of one row after ``static_thd_batch``: what the step hands attention."""
    batch = static_thd_batch(raw_batch(lengths, layout.width, mult), layout)
    logical = batch["cu_seqlens_q"].reshape(-1)
    physical = batch.get("cu_seqlens_q_padded")
    physical = logical if physical is None else physical.reshape(-1)
    return logical, physical, int(batch["max_seqlen_q"].reshape(-1)[0])


def contract_problems(
    logical: torch.Tensor, physical: torch.Tensor, max_seqlen: int, layout: StaticTHDLayout
) -> list[str]:
    """The THD contract the kernel relies on, read on host copies (the check's own inputs, never the step's)."""
    lo, ph = logical.cpu().to(torch.int64), physical.cpu().to(torch.int64)
    problems = []
    if lo.numel() != layout.capacity or ph.numel() != layout.capacity:
        problems.append(f"capacity {lo.numel()}/{ph.numel()} != {layout.capacity}")
    if int(lo[0]) != 0 or int(ph[0]) != 0:
        problems.append("does not start at 0")
    if (lo[1:] < lo[:-1]).any() or (ph[1:] < ph[:-1]).any():
        problems.append("boundaries decrease")
    if int(ph[-1]) != layout.width:
        problems.append(f"row closed at {int(ph[-1])}, not the width {layout.width}")
    if lo.numel() == ph.numel() and lo.numel() > 1:
        lengths, slots = lo[1:] - lo[:-1], ph[1:] - ph[:-1]
        if (lengths > slots).any():
            problems.append("a logical segment is longer than its physical slot")
        if int(lengths.max()) > max_seqlen:
            problems.append(f"max_seqlen {max_seqlen} < longest segment {int(lengths.max())}")
    return problems


# ---- attention ----------------------------------------------------------------------------------------------


def gather_index(logical: torch.Tensor, physical: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(physical position of compact token t, whether t is inside a logical segment): device arithmetic only."""
    lo, ph = logical.to(torch.int64), physical.to(torch.int64)
    t = torch.arange(total, device=lo.device)
    seg = (torch.searchsorted(lo.contiguous(), t, right=True) - 1).clamp(0, lo.numel() - 2)
    where = (ph[seg] + t - lo[seg]).clamp(0, total - 1)
    return where, t < lo[-1]


class _UnwrittenPastEnd(torch.autograd.Function):
    """Identity forward; backward leaves the gradient rows at or past ``end`` NaN: what flash's varlen backward
    leaves in its dq/dk/dv buffers (``torch.empty``) past ``cu_seqlens[-1]``."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, end: int) -> torch.Tensor:
        ctx.end = end
        return t.view_as(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone()
        grad[ctx.end :] = float("nan")
        return grad, None


def emulated_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """The dry run's kernel: the float64 reference inside ``cu``'s segments, and, like flash, nothing written past
    ``cu[-1]``: those output rows and their q/k/v gradient rows are NaN."""
    end = int(cu[-1])  # a host read of the check's own CPU tensor
    q, k, v = (_UnwrittenPastEnd.apply(t, end) for t in (q, k, v))
    out = varlen_causal_attention(q, k, v, cu)
    past = torch.arange(out.shape[0], device=out.device) >= end
    return torch.where(past[:, None, None], torch.full_like(out, float("nan")), out)


def varlen_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_seqlen: int
) -> torch.Tensor:
    """Causal varlen attention over contiguous segments: flash (``varlen_attn``) on CUDA, its CPU emulation
    (:func:`emulated_flash`) in the dry run."""
    if q.is_cuda:
        from torch.nn.attention.varlen import varlen_attn

        params = inspect.signature(varlen_attn).parameters
        causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        return varlen_attn(q, k, v, cu, cu, max_seqlen, max_seqlen, **causal)
    return emulated_flash(q, k, v, cu)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, logical: torch.Tensor, physical: torch.Tensor, max_seqlen: int
) -> torch.Tensor:
    """THD attention over ragged physical offsets: gather the logical tokens from their slots, attend with the
    logical boundaries and ``max_seqlen``, scatter back. The compact rows past the last logical token are zero going
    in (so the kernel's unwritten gradient rows there never flow back) and zero coming out."""
    total = q.shape[0]
    where, inside = gather_index(logical, physical, total)
    keep = inside[:, None, None]
    compact = [torch.where(keep, t.index_select(0, where), torch.zeros_like(t)).contiguous() for t in (q, k, v)]
    out_c = varlen_kernel(*compact, logical.to(torch.int32).contiguous(), max_seqlen)
    out_c = torch.where(keep, out_c, torch.zeros_like(out_c))
    return torch.zeros_like(q).index_add(0, where, out_c)


def te_thd_attention(device: torch.device) -> tuple[Callable[..., torch.Tensor] | None, str]:
    """TE's THD path as training calls it: ``DotProductAttention(qkv_format="thd", attn_mask_type="padding_causal")``
    with the logical ``cu_seqlens``, the physical ``cu_seqlens_*_padded`` and ``max_seqlen``, as Megatron-Core's
    ``TEDotProductAttention`` passes the step's ``PackedSeqParams``; or None with why it cannot run here."""
    why = te_missing()
    if why:
        return None, why
    if device.type != "cuda":
        return None, "TE's THD attention needs a CUDA device (dry run)"
    try:
        from transformer_engine.pytorch import DotProductAttention
    except ImportError as exc:
        return None, f"TE not importable ({exc})"
    module = DotProductAttention(HEADS, DIM, qkv_format="thd", attn_mask_type="padding_causal", attention_dropout=0.0)

    def run(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        logical: torch.Tensor,
        physical: torch.Tensor,
        max_seqlen: int,
    ) -> torch.Tensor:
        lo, ph = logical.to(torch.int32).contiguous(), physical.to(torch.int32).contiguous()
        out = module(
            q, k, v, cu_seqlens_q=lo, cu_seqlens_kv=lo, cu_seqlens_q_padded=ph, cu_seqlens_kv_padded=ph,
            max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen,
        )  # fmt: skip
        return out.reshape(q.shape)

    return run, ""


def inside_logical(logical: torch.Tensor, physical: torch.Tensor, width: int) -> torch.Tensor:
    """Which physical positions hold a logical token (TE leaves the padding of each slot to itself: compared only
    where it writes)."""
    lo, ph = logical.cpu().to(torch.int64), physical.cpu().to(torch.int64)
    inside = torch.zeros(width, dtype=torch.bool)
    for start, n in zip(ph[:-1].tolist(), (lo[1:] - lo[:-1]).tolist()):
        inside[start : start + n] = True
    return inside


def alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], mult: int) -> torch.Tensor:
    """The expected result, from the lengths alone: each sequence attended on its own at its aligned offset;
    without alignment (``mult`` 1) the row tail is one more sequence of pad tokens (Megatron-Bridge's collate
    closes the row with it), with alignment it is padding and stays zero like the gaps."""
    out, start, width = torch.zeros_like(q), 0, q.shape[0]
    spans = []
    for n in lengths:
        spans.append((start, n))
        start += -(-n // mult) * mult
    if mult == 1 and start < width:
        spans.append((start, width - start))
    for first, n in spans:
        out[first : first + n] = torch.nn.functional.scaled_dot_product_attention(
            *(t[first : first + n].transpose(0, 1) for t in (q, k, v)), is_causal=True
        ).transpose(0, 1)
    return out


def output_and_grads(
    fn: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, up: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    (out * up).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


def max_diff(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> float:
    """The largest absolute difference; infinite when either side holds a NaN or an infinity, so a NaN output or
    gradient can never pass (``max(0.1, nan)`` is 0.1)."""
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if not (bool(torch.isfinite(x).all()) and bool(torch.isfinite(y).all())):
            return math.inf
        worst = max(worst, float((x.double() - y.double()).abs().max()))
    return worst


def tolerance(noise: float, dtype: torch.dtype) -> float:
    """Four times the measured dtype noise, floored (float64 noise can measure as 0); 0 when the noise itself is
    not finite (a broken reference passes nothing)."""
    if not math.isfinite(noise):
        return 0.0
    return max(4 * noise, 1000 * torch.finfo(dtype).eps if dtype == torch.float64 else 8 * torch.finfo(dtype).eps)


# ---- (a) and (b) ----------------------------------------------------------------------------------------------


def mutants(
    logical: torch.Tensor, physical: torch.Tensor, max_seqlen: int, lengths: list[int], mult: int
) -> dict[str, tuple[torch.Tensor, torch.Tensor, int]]:
    """Wrong static batches a broken collate, padding or injection could produce, made from the right one.
    Without alignment the row has one boundary tensor (logical == physical), so each edit applies to both."""
    n = len(lengths)  # boundaries: [0, ends of the n sequences, row close (or the zero-length tail), padding...]
    single = mult == 1

    def edit(fn: Callable[[torch.Tensor], torch.Tensor], on: str) -> tuple[torch.Tensor, torch.Tensor, int]:
        lo, ph = logical.clone(), physical.clone()
        if single or on in ("logical", "both"):
            lo = fn(lo)
        if single:
            ph = lo.clone()
        elif on in ("physical", "both"):
            ph = fn(ph)
        return lo, ph, max_seqlen

    def setting(index: Any, value: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], torch.Tensor]:
        def fn(t: torch.Tensor) -> torch.Tensor:
            t[index] = value(t)
            return t

        return fn

    def dropping(index: int) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda t: torch.cat([t[:index], t[index + 1 :], t[-1:]])  # capacity kept: the last value repeats

    return {
        "zero_padded_tail": edit(setting(slice(n + 2, None), lambda t: 0), "both"),
        "last_end_plus_one": edit(setting(n, lambda t: t[n] + 1), "logical"),
        "tail_off_by_one": edit(setting(slice(n + 1, None), lambda t: t[n + 1] - 1), "physical"),
        "unclosed_row": edit(setting(slice(n + 1, None), lambda t: t[n]), "physical"),
        "truncated_to_capacity": edit(dropping(n - 1), "both"),
        "off_by_one": edit(setting(max(1, n // 2), lambda t: t[max(1, n // 2)] + 1), "logical"),
        "dropped_boundary": edit(dropping(1), "both"),
        "shifted": edit(setting(slice(1, n), lambda t: t[1:n] + 2), "both"),
        "max_seqlen_too_small": (logical.clone(), physical.clone(), max(lengths) - 1),
    }


Static = tuple[torch.Tensor, torch.Tensor, int]  # (logical, physical, max_seqlen) as the step hands attention


@contextlib.contextmanager
def device_recorder(device_type: str | None = "cuda") -> Any:
    """devtools' host-read recorder in its real-device mode, recording (every host read of a tensor on
    ``device_type``, synchronization, object or host collective, read on a thread it starts), active for the block:
    the GPU run's host-read sub-checks record on the GPU itself. ``None``: nothing recorded (yields None)."""
    if device_type is None:
        yield None
        return
    from devtools.capture.recorder import HostReadRecorder, cuda_stand_ins

    recorder = HostReadRecorder(real_device=device_type)
    with cuda_stand_ins(recorder), recorder:
        yield recorder


def host_read_result(reads: list[str] | None, why: str = "") -> dict[str, Any]:
    """A host-read sub-check: pass only when the step was recorded and read nothing."""
    if reads is None:
        return {"status": "skipped", "reason": why}
    return {"status": "pass" if not reads else "fail", "reads": reads}


def check_attention(
    rows: list[list[int]],
    layout: StaticTHDLayout,
    mult: int,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
    statics: list[Static] | None = None,
    with_mutants: bool = True,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(a) over ``statics`` (default: the custom-step path, :func:`static_row`), and (b) over their mutants."""
    width = layout.width
    statics = statics if statics is not None else [static_row(lengths, layout, mult) for lengths in rows]
    worst, noise, contract_fail, te_worst = 0.0, 0.0, 0, 0.0
    te_run, te_why = te_thd_attention(device)
    cuda = device.type == "cuda"
    step_reads: list[str] = []
    detected: dict[str, int] = {}
    how: dict[str, set[str]] = {}
    for lengths, (logical, physical, max_seqlen) in zip(rows, statics, strict=True):
        contract_fail += bool(contract_problems(logical, physical, max_seqlen, layout))
        q, k, v, up = (torch.randn(width, HEADS, DIM, generator=gen, dtype=torch.float64).to(device) for _ in range(4))
        run = [t.to(dtype) for t in (q, k, v)]
        exact = output_and_grads(lambda a, b, c: alone(a, b, c, lengths, mult), q, k, v, up)
        same_dtype = output_and_grads(lambda a, b, c: alone(a, b, c, lengths, mult), *run, up.to(dtype))
        noise = max(noise, max_diff(exact, same_dtype))
        lo_d, ph_d = logical.to(device), physical.to(device)
        with device_recorder("cuda" if cuda else None) as recorder:  # the step's attention, recorded on the GPU
            packed = output_and_grads(lambda a, b, c: attention(a, b, c, lo_d, ph_d, max_seqlen), *run, up.to(dtype))
        step_reads += [r.describe() for r in recorder.reads] if recorder is not None else []
        worst = max(worst, max_diff(exact, packed))
        if te_run is not None:
            through_te = output_and_grads(
                lambda a, b, c: te_run(a, b, c, lo_d, ph_d, max_seqlen), *run, up.to(dtype)
            )  # fmt: skip
            keep = inside_logical(logical, physical, width).to(device)[:, None, None]
            te_worst = max(
                te_worst, max_diff(*(tuple(torch.where(keep, t, 0) for t in ts) for ts in (exact, through_te)))
            )
        rows_tol = tolerance(noise, dtype)
        for name, (lo_m, ph_m, ms_m) in (mutants(logical, physical, max_seqlen, lengths, mult) if with_mutants
                                         else {}).items():  # fmt: skip
            detected.setdefault(name, 0)
            how.setdefault(name, set())
            if contract_problems(lo_m, ph_m, ms_m, layout):
                detected[name] += 1
                how[name].add("contract")
                continue
            bad = output_and_grads(
                lambda a, b, c: attention(a, b, c, lo_m.to(device), ph_m.to(device), ms_m), *run, up.to(dtype)
            )
            if max_diff(exact, bad) > rows_tol:
                detected[name] += 1
                how[name].add("parity")
    tol = tolerance(noise, dtype)
    reads = host_read_result(
        step_reads if cuda else None, "the dry run's kernel is a host emulation: recorded on the GPU only"
    )
    te = (
        {"status": "pass" if te_worst <= tol else "fail", "max_abs_diff_logical_tokens": te_worst}
        if te_run is not None
        else {"status": "skipped", "reason": te_why}
    )
    parity = {
        "status": "pass"
        if worst <= tol
        and math.isfinite(noise)
        and contract_fail == 0
        and "fail" not in (te["status"], reads["status"])
        else "fail",
        "te_thd": te,
        "attention_host_reads": reads,
        "max_abs_diff": worst,
        "tolerance": tol,
        "dtype_noise": noise,
        "contract_violations": contract_fail,
        "rows": len(rows),
        "layout": {"capacity": layout.capacity, "max_seqlen": layout.max_seqlen, "width": width, "mult": mult},
    }
    caught = bool(detected) and all(count == len(rows) for count in detected.values())
    return parity, {
        "status": "pass" if caught else "fail",
        "detected": detected,
        "by": {k: sorted(v) for k, v in how.items()},
        "rows": len(rows),
    }


# ---- the launch path ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def launch_world(cuda: bool, record: bool = True) -> Any:
    """Where the launch path runs, under devtools' host-read recorder (not yet capturing): on CUDA in its
    real-device mode (recorded on the GPU); in the dry run with its ``torch.cuda`` stand-ins (CPU tensors stand for
    the device buffers ``data_read`` fills). ``record=False`` (the graph check, CUDA only): no recorder. The
    full-iteration wrapper's class-level buffers are fresh for the run and put back after."""
    from megatron.core.full_cuda_graph import StaticBufferLoader

    saved = {stage: list(items) for stage, items in StaticBufferLoader.static_buffers.items()}
    for stage in StaticBufferLoader.static_buffers:
        StaticBufferLoader.static_buffers[stage] = []
    try:
        if cuda:
            with device_recorder("cuda" if record else None) as recorder:
                with recorder.capturing(False) if recorder is not None else contextlib.nullcontext():
                    yield recorder
        else:
            from devtools.capture.recorder import HostReadRecorder, cuda_stand_ins

            recorder = HostReadRecorder()
            with cuda_stand_ins(recorder), recorder, recorder.capturing(False):
                yield recorder
    finally:
        StaticBufferLoader.static_buffers.clear()
        StaticBufferLoader.static_buffers.update(saved)


def launch_batches(rows: list[list[int]], width: int, mult: int) -> list[dict[str, Any]]:
    """Megatron-Bridge's packed collate (``pad_cu_seqlens``) over the rows, with the pack metadata of
    :func:`pack_metadata`: the raw micro batches its data loader yields."""
    from devtools.capture.iteration import collate_packed_rows

    return collate_packed_rows(rows, width, mult, pack_metadata(rows, mult))


def step_fields(static: dict[str, Any]) -> tuple[dict[str, Any], Static]:
    """What Megatron-Bridge's step hands attention from one static batch: ``get_batch_from_iterator`` (device keys
    ``.cuda()``, host keys ``.cpu()``) and ``get_packed_seq_params``, as ``get_batch`` calls them (PP 1, CP 1)."""
    from megatron.bridge.training.gpt_step import _packed_metadata_for_forward, get_batch_from_iterator
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    batch = get_batch_from_iterator(iter([static]), is_first_pp_stage=True, is_last_pp_stage=True)
    params = get_packed_seq_params(_packed_metadata_for_forward(batch))
    physical = params.cu_seqlens_q_padded if params.cu_seqlens_q_padded is not None else params.cu_seqlens_q
    return batch, (params.cu_seqlens_q, physical, params.max_seqlen_q)


def read_through_injection(wrapper: Any, raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``FullCudaGraphWrapper.data_read`` as the class has it, with mbridge_seqpack's injection installed: the
    static buffers (refilled in place after the first call) with a host ``max_seqlen``."""
    from mbridge_seqpack.thd import inject

    with inject.installed(True):
        [statics] = wrapper.data_read(iter(raw), None, True, len(raw))
    return list(statics)


def launch_rows(rows: list[list[int]], width: int, mult: int, device: torch.device) -> tuple[list[Static], dict]:
    """The rows as a launch with the plugin feeds attention, and what the step read on the host doing so (dry run:
    recorded; must be nothing)."""
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper

    raw = launch_batches(rows, width, mult)
    with launch_world(device.type == "cuda") as recorder:
        wrapper = FullCudaGraphWrapper(None, cuda_graph_warmup_steps=1)
        statics = read_through_injection(wrapper, raw)
        host = all(not s["max_seqlen_q"].is_cuda for s in statics)
        on_device = all(s["cu_seqlens_q"].is_cuda for s in statics)
        out = []
        with recorder.capturing(True) if recorder is not None else contextlib.nullcontext():
            for static in statics:
                out.append(step_fields(static)[1])
        reads = [r.describe() for r in recorder.reads] if recorder is not None else []
    where = "cuda (real device)" if device.type == "cuda" else "cpu (stand-in device tensors)"
    return out, {
        "step_host_reads": reads,
        "recorded_on": where,
        "max_seqlen_on_host": host,
        "boundaries_on_device": on_device,
    }


def check_launch(
    rows: list[list[int]], layout: StaticTHDLayout, mult: int, dtype: torch.dtype, device: torch.device, gen: Any
) -> dict[str, Any]:
    """(a) over the launch path, plus: the step read nothing on the host, got a host max_seqlen (the injection) and
    device boundaries (the static buffers)."""
    statics, info = launch_rows(rows, layout.width, mult, device)
    parity, _ = check_attention(rows, layout, mult, dtype, device, gen, statics=statics, with_mutants=False)
    clean = not info["step_host_reads"] and info["max_seqlen_on_host"] and info["boundaries_on_device"]
    parity.update(info)
    parity["status"] = "pass" if parity["status"] == "pass" and clean else "fail"
    return parity


# ---- (c) and (e) ----------------------------------------------------------------------------------------------


class TinyLM(torch.nn.Module):
    """Embedding, two THD attention blocks with MLPs, a tied head: enough for a graph of fwd+bwd."""

    def __init__(self, vocab: int, dim: int, attend: Callable[..., torch.Tensor] = attention) -> None:
        super().__init__()
        self.attend = attend
        self.embed = torch.nn.Embedding(vocab, dim)
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(dim, 3 * dim) for _ in range(2))
        self.mlp = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
            for _ in range(2)
        )

    def forward(
        self, tokens: torch.Tensor, logical: torch.Tensor, physical: torch.Tensor, max_seqlen: int
    ) -> torch.Tensor:
        h = self.embed(tokens)
        for qkv, mlp in zip(self.qkv, self.mlp):
            q, k, v = qkv(h).view(h.shape[0], 3, HEADS, -1).unbind(1)
            h = h + self.attend(q, k, v, logical, physical, max_seqlen).reshape(h.shape)
            h = h + mlp(h)
        return h @ self.embed.weight.T


@contextlib.contextmanager
def launch_feed(rows: list[list[int]], width: int, mult: int) -> Any:
    """The launch path's step inputs read from the injected ``data_read`` buffers (``get_batch_from_iterator``,
    ``get_packed_seq_params``), and one refill per row (``data_read`` refills the buffers in place)."""
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper

    raw = launch_batches(rows, width, mult)
    with launch_world(True, record=False):
        wrapper = FullCudaGraphWrapper(None, cuda_graph_warmup_steps=1)
        static = read_through_injection(wrapper, raw[:1])[0]

        def fields() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
            batch, (logical, physical, max_seqlen) = step_fields(static)
            return batch["tokens"].reshape(-1), logical, physical, max_seqlen

        yield fields, [lambda b=batch: read_through_injection(wrapper, [b]) for batch in raw]


@contextlib.contextmanager
def custom_feed(rows: list[list[int]], width: int, mult: int, device: torch.device, gen: torch.Generator) -> Any:
    """The custom step's inputs: ``static_thd_batch``'s rows (one ``StaticTHDLayout``) in static device buffers,
    refilled in place with each row's tokens and boundaries (no Megatron needed)."""
    layout = layout_for(rows, width, mult)
    statics = [static_row(lengths, layout, mult) for lengths in rows]
    tokens = [torch.randint(0, 1024, (width,), generator=gen) for _ in rows]
    buffers = [t.to(device).clone() for t in (tokens[0], statics[0][0], statics[0][1])]
    max_seqlen = statics[0][2]  # the layout's: the same for every row

    def refill(i: int) -> None:
        for buffer, value in zip(buffers, (tokens[i], statics[i][0], statics[i][1])):
            buffer.copy_(value.to(device))

    yield (lambda: (*buffers, max_seqlen)), [lambda i=i: refill(i) for i in range(len(rows))]


def check_graph(
    rows: list[list[int]], width: int, mult: int, device: torch.device, gen: torch.Generator, launch: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Capture the step once over static buffers (fed by the launch path: the injected ``data_read``; without
    Megatron: the custom step's ``static_thd_batch`` rows), forward and backward, replay it after each other row
    refilled the buffers, compare with eager on the same buffers."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    te_attend, te_why = te_thd_attention(device)  # the graph captures TE's THD attention where TE runs
    model = TinyLM(1024, HEADS * DIM, te_attend or attention).to(device, torch.bfloat16)
    feed = launch_feed(rows, width, mult) if launch else custom_feed(rows, width, mult, device, gen)
    with feed as (fields, refills):

        def step() -> torch.Tensor:
            tokens, logical, physical, max_seqlen = fields()
            loss = model(tokens, logical, physical, max_seqlen).float().logsumexp(-1).mean()
            loss.backward()
            return loss

        def grads(loss: torch.Tensor) -> list[torch.Tensor]:
            return [loss.detach().clone()] + [p.grad.detach().clone() for p in model.parameters()]

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                model.zero_grad(set_to_none=False)
                step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        model.zero_grad(set_to_none=False)
        with torch.cuda.graph(graph):
            graph_loss = step()
        worst, spread = 0.0, 0.0
        for refill in refills:
            refill()  # refills the captured buffers in place
            model.zero_grad(set_to_none=False)
            graph.replay()
            replayed = grads(graph_loss)
            model.zero_grad(set_to_none=False)
            eager = grads(step())
            model.zero_grad(set_to_none=False)
            again = grads(step())
            worst = max(worst, max_diff(tuple(replayed), tuple(eager)))
            spread = max(spread, max_diff(tuple(eager), tuple(again)))
        allowed = 4 * spread if math.isfinite(spread) else 0.0
        replay = {
            "status": "pass" if math.isfinite(worst) and math.isfinite(spread) and worst <= allowed else "fail",
            "path": "launch (injected data_read)" if launch else "custom step (static_thd_batch)",
            "attention": "TE DotProductAttention (thd)" if te_attend else f"gather + varlen_attn (TE: {te_why})",
            "max_abs_diff": worst,
            "eager_run_to_run": spread,
            "allowed": allowed,
            "rows": len(rows),
        }
        t_graph = timed(graph.replay, 20, device)
        t_eager = timed(lambda: (model.zero_grad(set_to_none=False), step()), 20, device)
    return replay, {
        "status": "measured",
        "graph_ms": t_graph * 1e3,
        "eager_ms": t_eager * 1e3,
        "eager_over_graph": t_eager / t_graph,
    }


def timed(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


# ---- (d) and (f) ----------------------------------------------------------------------------------------------


def check_throughput(
    lengths: list[int], width: int, max_len: int, dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> dict[str, Any]:
    """(d) attention fwd+bwd over the same real tokens: packed static rows vs padded batches of max_len."""
    from mbridge_seqpack.placement.packer import pack_lengths

    bins = pack_lengths(torch.tensor(lengths).numpy(), width)
    rows = [[n for n, b in zip(lengths, bins) if b == r] for r in range(int(bins.max()) + 1)]
    layout = layout_for(rows, width, 1)
    statics = [static_row(row, layout, 1) for row in rows]
    real = sum(lengths)
    q = torch.randn(width, HEADS, DIM, generator=gen).to(device, dtype).requires_grad_(True)

    def packed_epoch() -> None:
        for logical, physical, max_seqlen in statics:
            attention(q, q, q, logical.to(device), physical.to(device), max_seqlen).sum().backward()

    batch = max(1, width // max_len)
    padded_q = torch.randn(batch, HEADS, max_len, DIM, generator=gen).to(device, dtype).requires_grad_(True)

    def padded_epoch() -> None:
        for _ in range(0, len(lengths), batch):
            torch.nn.functional.scaled_dot_product_attention(
                padded_q, padded_q, padded_q, is_causal=True
            ).sum().backward()

    t_packed, t_padded = timed(packed_epoch, 2, device), timed(padded_epoch, 2, device)
    padded_slots = -(-len(lengths) // batch) * batch * max_len
    return {
        "status": "measured",
        "real_tokens": real,
        "packed_tokens_per_s": real / t_packed,
        "padded_tokens_per_s": real / t_padded,
        "packed_over_padded": t_padded / t_packed,
        "padding_fraction_padded": 1 - real / padded_slots,
        "padding_fraction_packed": 1 - real / (len(rows) * width),
    }


def kernel_formula(bounds: list[int], cp: int, rank: int) -> list[int]:
    """TE's documented per-sequence zigzag, written out independently of mbridge_seqpack.thd.reference."""
    out: list[int] = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        chunk = (end - start) // (2 * cp)
        out += list(range(start + rank * chunk, start + (rank + 1) * chunk))
        out += list(range(start + (2 * cp - 1 - rank) * chunk, start + (2 * cp - rank) * chunk))
    return out


def te_partition_kernel(cuda: bool) -> tuple[Callable[[list[int], int, int, int], list[int]] | None, str]:
    """TE's own THD context-parallel split (``tex.thd_get_partitioned_indices``, the kernel
    ``get_batch_on_this_cp_rank`` calls) as ``fn(bounds, total_tokens, cp, rank) -> indices``, or None with why."""
    why = te_missing()
    if why:
        return None, why
    if not cuda:
        return None, "TE's partition kernel needs a CUDA device (dry run)"
    try:
        import transformer_engine_torch as tex
    except ImportError as exc:
        return None, f"TE not importable ({exc})"

    def split(bounds: list[int], total: int, cp: int, rank: int) -> list[int]:
        cu = torch.tensor(bounds, dtype=torch.int32, device="cuda")
        return tex.thd_get_partitioned_indices(cu, total, cp, rank).cpu().tolist()

    return split, ""


def check_cp_split(rows: list[list[int]], cuda: bool = False) -> dict[str, Any]:
    """(f) every rank's indices for CP 2 and 4 on the static physical boundaries (aligned to 2*CP, row closed):
    mbridge_seqpack's split against the kernel's formula, and against TE's partition kernel itself where TE and a
    CUDA device are present (else that part says it was skipped, and why)."""
    kernel, why = te_partition_kernel(cuda)
    mismatches, kernel_mismatches, checked = 0, 0, 0
    for cp in (2, 4):
        for lengths in rows:
            mult = 2 * cp
            row_width = sum(-(-n // mult) * mult for n in lengths) + 2 * mult  # a multiple of mult
            _, physical, _ = static_row(lengths, layout_for([lengths], row_width, mult), mult)
            bounds = physical.tolist()
            for rank in range(cp):
                checked += 1
                got = thd_cp_partition_indices(torch.tensor(bounds), cp, rank).tolist()
                mismatches += got != kernel_formula(bounds, cp, rank)
                if kernel is not None:
                    kernel_mismatches += got != kernel(bounds, row_width, cp, rank)
    te = (
        {"status": "pass" if kernel_mismatches == 0 else "fail", "mismatches": kernel_mismatches}
        if kernel is not None
        else {"status": "skipped", "reason": why}
    )
    ok = mismatches == 0 and te["status"] != "fail"
    return {"status": "pass" if ok else "fail", "mismatches": mismatches, "rank_splits": checked, "te_kernel": te}


# ---- main -----------------------------------------------------------------------------------------------------


def plan(cuda: bool, launch: bool = True) -> dict[str, str]:
    """What a run does on this machine before it does it: each part "runs: ..." or "skipped: why" (TE and
    Megatron are optional; a part that cannot run says so, and the torch-only checks still run)."""
    te, mb = te_missing(), megatron_missing()
    launch_why = "--no-launch" if not launch else mb
    gpu = "runs: on CUDA" if cuda else "skipped: CUDA graphs need a CUDA device (dry run)"
    te_why = te or ("" if cuda else "needs a CUDA device (dry run)")
    return {
        "a custom step": "runs: gather + " + ("flash varlen_attn (bfloat16)" if cuda else "float64 flash emulation"),
        "a custom step host reads": "runs: recorded on the GPU (real device)"
        if cuda
        else "skipped: the dry run's kernel is a host emulation: recorded on the GPU only",
        "a te_thd (TE's THD DotProductAttention)": f"skipped: {te_why}" if te_why else "runs",
        "a launch path (Megatron-Bridge collate, injected data_read, step)": f"skipped: {launch_why}"
        if launch_why
        else "runs",
        "a launch path host reads": f"skipped: {launch_why}"
        if launch_why
        else ("runs: recorded on the GPU (real device)" if cuda else "runs: recorded with stand-in device tensors"),
        "b mutants": "runs",
        "c graph replay": gpu
        if not cuda
        else f"{gpu}, fed by the " + ("launch path" if not launch_why else f"custom step ({launch_why})"),  # fmt: skip
        "d throughput": "runs",
        "e graph vs eager": gpu,
        "f cp split formula": "runs",
        "f te_kernel (thd_get_partitioned_indices)": f"skipped: {te_why}" if te_why else "runs",
    }


def run_checks(cuda: bool, n_rows: int, launch: bool = True) -> dict[str, Any]:
    launch_why = "--no-launch" if not launch else megatron_missing()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float64
    width, max_len = (8192, 2048) if cuda else (128, 32)
    gen = torch.Generator().manual_seed(0)
    rows = [
        torch.randint(2, max_len, (int(torch.randint(2, 6, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(n_rows)
    ]
    results: dict[str, Any] = {}
    for mult in (1, 8):
        fitting = [r for r in rows if sum(-(-n // mult) * mult for n in r) < width] or [[max_len // 2, max_len // 2]]
        layout = layout_for(fitting, width, mult)
        parity, caught = check_attention(fitting, layout, mult, dtype, device, gen)
        if launch_why:
            parity = {**parity, "launch": {"status": "skipped", "reason": launch_why}}
        else:
            parity = {**parity, "launch": check_launch(fitting, layout, mult, dtype, device, gen)}
            if parity["launch"]["status"] != "pass":
                parity["status"] = "fail"
        results[f"a_attention_parity_mult{mult}"], results[f"b_mutants_detected_mult{mult}"] = parity, caught
    results["a_attention_parity"] = _merge(
        results.pop("a_attention_parity_mult1"), results.pop("a_attention_parity_mult8")
    )
    results["b_mutants_detected"] = _merge(
        results.pop("b_mutants_detected_mult1"), results.pop("b_mutants_detected_mult8")
    )
    if cuda:  # without Megatron (or with --no-launch) the custom step's static buffers feed the graph
        fitting = [r for r in rows if sum(-(-n // 8) * 8 for n in r) < width] or [[max_len // 2, max_len // 2]]
        results["c_graph_replay_equals_eager"], results["e_graph_vs_eager_step_time"] = check_graph(
            fitting, width, 8, device, gen, launch=not launch_why
        )
    else:
        for name in ("c_graph_replay_equals_eager", "e_graph_vs_eager_step_time"):
            results[name] = {"status": "skipped", "reason": "CUDA graphs need a CUDA device (dry run)"}
    # Lognormal lengths drawn from the seeded generator: an unseeded draw made the dry run's figures vary per run.
    log_lengths = torch.randn(400 if cuda else 40, generator=gen, dtype=torch.float64) * 0.8 + (5.5 if cuda else 2.5)
    lengths = torch.clamp(log_lengths.exp(), 2, max_len).long().tolist()
    results["d_throughput_packed_vs_padded"] = check_throughput(lengths, width, max_len, dtype, device, gen)
    results["f_cp_split_matches_kernel_formula"] = check_cp_split(rows, cuda)
    return results


def _merge(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """One result for both alignments (pad_seq_to_mult 1: no physical offsets; 8: ragged padded offsets)."""
    status = "pass" if first["status"] == second["status"] == "pass" else "fail"
    return {
        "status": status,
        "mult1": {k: v for k, v in first.items() if k != "status"},
        "mult8": {k: v for k, v in second.items() if k != "status"},
    }


def skipped_parts(results: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Every part of ``results``, at any depth, whose status is "skipped": (dotted path, reason)."""
    found = []
    for name, value in results.items():
        if isinstance(value, dict):
            path = f"{prefix}{name}"
            if value.get("status") == "skipped":
                found.append((path, str(value.get("reason", ""))))
            found += skipped_parts(value, f"{path}.")
    return found


def names(path: str, name: str) -> bool:
    """``name`` names ``path``: its parts appear in ``path``'s, in order and together (``te_thd`` names every
    ``...te_thd``, ``mult1.te_thd`` only ``a_attention_parity.mult1.te_thd``)."""
    return f".{name}." in f".{path}."


def unallowed_skips(
    results: dict[str, Any], allowed: list[str], dry_run: bool, no_launch: bool
) -> list[tuple[str, str]]:
    """The skipped parts the run was not told to skip: not named by ``allowed``, not a dry run's CUDA-only part, not
    the launch path under ``--no-launch``."""

    def asked(path: str, reason: str) -> bool:
        return (dry_run and "dry run" in reason) or (no_launch and reason == "--no-launch")

    return [
        (path, reason)
        for path, reason in skipped_parts(results)
        if not asked(path, reason) and not any(names(path, n) for n in allowed)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU: float64, tiny sizes, no graphs")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--rows", type=int, default=6)
    parser.add_argument(
        "--no-launch",
        action="store_true",
        help="leave out the launch path (Megatron-Bridge's collate and step, the injected data_read)",
    )
    parser.add_argument(
        "--allow-skips",
        default="",
        metavar="PARTS",
        help="comma-separated parts whose skip is accepted (e.g. te_thd,launch,te_kernel); other skips fail the run",
    )
    args = parser.parse_args()
    allowed = [n.strip() for n in args.allow_skips.split(",") if n.strip()]
    unknown = [n for n in allowed if n.rsplit(".", 1)[-1] not in SKIPPABLE]
    if unknown:  # before anything runs: a mistyped name must not cost the device's minutes
        print(f"gpu_check: --allow-skips names no part that can be skipped: {', '.join(unknown)} (the parts: "
              f"{', '.join(SKIPPABLE)})", file=sys.stderr)  # fmt: skip
        return 2
    start = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        # every check skipped would read as a pass on a machine whose CUDA is broken: refuse instead
        print("gpu_check: no CUDA device here; run it on the GPU machine, or pass --dry-run for the CPU check "
              "(float64, tiny sizes)", file=sys.stderr)  # fmt: skip
        return 2
    steps = plan(cuda, launch=not args.no_launch)
    print("plan (dry run, CPU):" if not cuda else "plan (CUDA):")
    for part, what in steps.items():
        print(f"  {part}: {what}")
    if args.dry_run:
        print("on a CUDA device, with what this machine has installed:")
        for part, what in plan(True, launch=not args.no_launch).items():
            print(f"  {part}: {what}")
    results = run_checks(cuda, args.rows, launch=not args.no_launch)
    for name in NAMES:
        r = results[name]
        detail = {k: v for k, v in r.items() if k != "status"}
        print(f"  {r['status'].upper():<8} {name}  {json.dumps(detail, default=str)}")
    failed = [n for n in NAMES if results[n]["status"] == "fail"]
    failed_checks = len(failed)
    for path, reason in unallowed_skips(results, allowed, args.dry_run, args.no_launch):
        print(f"  UNASKED  {path}: skipped, {reason}; --allow-skips {path.rsplit('.', 1)[-1]} accepts it")
        failed.append(path)
    counts = {s: sum(r["status"] == s for r in results.values()) for s in ("pass", "fail", "skipped", "measured")}
    seconds = round(time.perf_counter() - start, 1)  # the one command's budget is 5 minutes
    skips = f"{len(skipped_parts(results))} parts skipped at any depth, {len(failed) - failed_checks} not allowed"
    print("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + f"; {skips}; {seconds} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        out = {"device": "cuda" if cuda else "cpu", "seconds": seconds, "plan": steps, "results": results}
        out["unallowed_skips"] = failed[failed_checks:]
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
