"""GPU check for static THD packing: checks that can fail (one command, under 5 minutes; PyTorch only).

Attention is PyTorch's ``torch.nn.attention.varlen.varlen_attn`` on CUDA (the ``cu_seqlens`` / ``max_seqlen``
contract of Transformer Engine's THD attention) and the CPU reference elsewhere, fed by mbridge_seqpack's
static boundaries (``mbridge_seqpack.thd.static_cu_seqlens``). Results go to a JSON file; each check is
"pass", "fail", "skipped" (with the reason) or "measured" (a number, never a verdict):

  (a) per-segment attention outputs AND input gradients of the static packed call equal each sequence run
      alone, within a tolerance set from the measured noise of the dtype (alone in the run dtype vs float64);
  (b) mutants of the boundaries (off by one, a dropped boundary, all shifted) each exceed that tolerance:
      the check can tell right boundaries from wrong ones;
  (c) one CUDA-graph capture of forward+backward, replayed over rows with different boundaries and sequence
      counts, equals eager on the outputs and every parameter gradient (CUDA only);
  (d) throughput, packed rows vs padded batches holding the same real tokens: a ratio and the padding fraction;
  (e) graph vs eager step time: a ratio (CUDA only);
  (f) the THD context-parallel split of the static rows (mbridge_seqpack.thd.reference, used by ``verify``) equals the
      kernel's formula (TE ``thd_get_partitioned_indices``: rank r holds chunks r and 2*CP-1-r of each sequence).

    PYTHONPATH=. python scripts/gpu_check.py --json out/gpu_check.json            # on the GPU machine
    PYTHONPATH=. python scripts/gpu_check.py --dry-run --json out/gpu_check.json  # CPU: float64, tiny sizes
Exit 0 when no check failed; without CUDA and without --dry-run it writes every check as skipped and exits 0.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mbridge_seqpack.thd import static_cu_seqlens  # noqa: E402
from mbridge_seqpack.thd.reference import thd_cp_partition_indices, varlen_causal_attention  # noqa: E402

HEADS, DIM = 4, 32


def causal_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_seqlen: int
) -> torch.Tensor:
    """varlen_attn (flash) on CUDA, the CPU reference elsewhere; causal either way."""
    if q.is_cuda:
        from torch.nn.attention.varlen import varlen_attn

        params = inspect.signature(varlen_attn).parameters
        causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        return varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, max_seqlen, max_seqlen, **causal)
    return varlen_causal_attention(q, k, v, cu)


def alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    """Each sequence attended on its own (SDPA, causal); positions past the last boundary stay zero."""
    out = torch.zeros_like(q)
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b > a:
            out[a:b] = torch.nn.functional.scaled_dot_product_attention(
                q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1), is_causal=True
            ).transpose(0, 1)
    return out


def output_and_grads(
    fn: Callable[..., torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    upstream: torch.Tensor,
    real: int,
) -> tuple[torch.Tensor, ...]:
    """Outputs on the real tokens and the gradients of <out, upstream> w.r.t. q, k, v."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)[:real]
    (out * upstream[:real]).sum().backward()
    return out.detach(), q.grad[:real], k.grad[:real], v.grad[:real]


def max_diff(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b))


def make_row(lengths: list[int], width: int, capacity: int, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """Static (capacity-entry, width-closed) boundaries of one row, and the real boundaries."""
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    cu, _ = static_cu_seqlens(torch.tensor(bounds, dtype=torch.int32), capacity=capacity, row_width=width)
    return cu.to(device), bounds


def mutants(bounds: list[int]) -> dict[str, list[int]]:
    """Wrong boundaries a broken collate could produce."""
    inner = len(bounds) // 2
    off_by_one = list(bounds)
    off_by_one[inner] += 1
    return {
        "off_by_one": off_by_one,
        "dropped_boundary": bounds[:inner] + bounds[inner + 1 :],
        "shifted": [0] + [b + 2 for b in bounds[1:-1]] + [bounds[-1]],
    }


def check_attention(
    rows: list[list[int]], width: int, capacity: int, dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(a) parity of outputs and gradients, (b) every mutant detected; tolerances from measured noise."""
    worst, noise, detected = 0.0, 0.0, {name: 0 for name in mutants([0, 1, 2])}
    for lengths in rows:
        cu, bounds = make_row(lengths, width, capacity, device)
        real = bounds[-1]
        q, k, v, up = (torch.randn(width, HEADS, DIM, generator=gen, dtype=torch.float64).to(device) for _ in range(4))
        run = [t.to(dtype) for t in (q, k, v)]
        exact = output_and_grads(lambda a, b, c: alone(a, b, c, bounds), q, k, v, up, real)
        same_dtype = output_and_grads(lambda a, b, c: alone(a, b, c, bounds), *run, up.to(dtype), real)
        noise = max(noise, max_diff(exact, same_dtype))
        packed = output_and_grads(lambda a, b, c: causal_varlen(a, b, c, cu, width), *run, up.to(dtype), real)
        worst = max(worst, max_diff(exact, packed))
        for name, wrong in mutants(bounds).items():
            wrong_cu = static_cu_seqlens(
                torch.tensor(wrong, dtype=torch.int32), capacity=capacity + 1, row_width=width
            )[0].to(device)
            bad = output_and_grads(lambda a, b, c: causal_varlen(a, b, c, wrong_cu, width), *run, up.to(dtype), real)
            detected[name] += max_diff(exact, bad) > tolerance(noise, dtype)
    tol = tolerance(noise, dtype)
    parity = {
        "status": "pass" if worst <= tol else "fail",
        "max_abs_diff": worst,
        "tolerance": tol,
        "dtype_noise": noise,
        "rows": len(rows),
    }
    caught = all(count == len(rows) for count in detected.values())
    return parity, {"status": "pass" if caught else "fail", "detected": detected, "rows": len(rows)}


def tolerance(noise: float, dtype: torch.dtype) -> float:
    """Four times the measured dtype noise, floored at 1000 ulps of 1.0 (float64 noise can measure as 0)."""
    return max(4 * noise, 1000 * torch.finfo(dtype).eps if dtype == torch.float64 else 8 * torch.finfo(dtype).eps)


class TinyLM(torch.nn.Module):
    """Embedding, two THD attention blocks with MLPs, a tied head: enough for a graph of fwd+bwd."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(dim, 3 * dim) for _ in range(2))
        self.mlp = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
            for _ in range(2)
        )

    def forward(self, tokens: torch.Tensor, cu: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        h = self.embed(tokens)
        for qkv, mlp in zip(self.qkv, self.mlp):
            q, k, v = qkv(h).view(h.shape[0], 3, HEADS, -1).unbind(1)
            h = h + causal_varlen(q, k, v, cu, max_seqlen).reshape(h.shape)
            h = h + mlp(h)
        return h @ self.embed.weight.T


def check_graph(
    rows: list[list[int]], width: int, capacity: int, device: torch.device, gen: torch.Generator
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(c) graph replay equals eager on outputs and every parameter gradient; (e) graph vs eager step time."""
    model = TinyLM(1024, HEADS * DIM).to(device, torch.bfloat16)
    tokens = torch.zeros(width, dtype=torch.int64, device=device)
    cu_buf, _ = make_row(rows[0], width, capacity, device)
    cu_buf = cu_buf.clone()

    def step() -> torch.Tensor:
        logits = model(tokens, cu_buf, width)
        loss = logits.float().logsumexp(-1).mean()
        loss.backward()
        return loss

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
    worst = 0.0
    for lengths in rows:
        cu, _ = make_row(lengths, width, capacity, device)
        tokens.copy_(torch.randint(0, 1024, (width,), generator=gen).to(device))
        cu_buf.copy_(cu)
        model.zero_grad(set_to_none=False)
        graph.replay()
        replayed = [graph_loss.detach().clone()] + [p.grad.detach().clone() for p in model.parameters()]
        model.zero_grad(set_to_none=False)
        eager = [step().detach()] + [p.grad.detach().clone() for p in model.parameters()]
        worst = max(worst, max(float((a.float() - b.float()).abs().max()) for a, b in zip(replayed, eager)))
    replay = {
        "status": "pass" if worst == 0.0 else "fail",
        "max_abs_diff": worst,
        "rows": len(rows),
        "note": "same kernels, same inputs: bitwise equal expected",
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


def check_throughput(
    lengths: list[int], width: int, max_len: int, dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> dict[str, Any]:
    """(d) attention fwd+bwd over the same real tokens: packed rows vs padded batches of max_len."""
    from mbridge_seqpack.packing.packer import pack_lengths

    bins = pack_lengths(torch.tensor(lengths).numpy(), width)
    rows = [[n for n, b in zip(lengths, bins) if b == r] for r in range(int(bins.max()) + 1)]
    real = sum(lengths)
    q = torch.randn(width, HEADS, DIM, generator=gen).to(device, dtype).requires_grad_(True)

    def packed_epoch() -> None:
        for row in rows:
            cu, _ = make_row(row, width, len(row) + 2, device)
            causal_varlen(q, q, q, cu, width).sum().backward()

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


def check_cp_split(rows: list[list[int]]) -> dict[str, Any]:
    """(f) every rank's indices for CP 2 and 4, on the rows aligned to 2*CP as pad_seq_to_mult would."""
    mismatches, checked = 0, 0
    for cp in (2, 4):
        for lengths in rows:
            bounds = [0]
            for n in lengths:
                bounds.append(bounds[-1] + -(-n // (2 * cp)) * 2 * cp)
            for rank in range(cp):
                checked += 1
                got = thd_cp_partition_indices(torch.tensor(bounds), cp, rank).tolist()
                mismatches += got != kernel_formula(bounds, cp, rank)
    return {"status": "pass" if mismatches == 0 else "fail", "mismatches": mismatches, "rank_splits": checked}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU: float64, tiny sizes, no graphs")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--rows", type=int, default=6)
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.dry_run
    results: dict[str, Any] = {}
    names = (
        "a_attention_parity",
        "b_mutants_detected",
        "c_graph_replay_equals_eager",
        "d_throughput_packed_vs_padded",
        "e_graph_vs_eager_step_time",
        "f_cp_split_matches_kernel_formula",
    )
    if not cuda and not args.dry_run:
        results = {name: {"status": "skipped", "reason": "no CUDA device"} for name in names}
    else:
        device = torch.device("cuda" if cuda else "cpu")
        dtype = torch.bfloat16 if cuda else torch.float64
        width, max_len = (8192, 2048) if cuda else (96, 32)
        gen = torch.Generator().manual_seed(0)
        rows = [
            sorted(torch.randint(2, max_len, (int(torch.randint(2, 6, (1,), generator=gen)),), generator=gen).tolist())
            for _ in range(args.rows)
        ]
        rows = [r for r in rows if sum(r) <= width] or [[max_len // 2, max_len // 2]]
        capacity = max(len(r) for r in rows) + 2
        results["a_attention_parity"], results["b_mutants_detected"] = check_attention(
            rows, width, capacity, dtype, device, gen
        )
        if cuda:
            results["c_graph_replay_equals_eager"], results["e_graph_vs_eager_step_time"] = check_graph(
                rows, width, capacity, device, gen
            )
        else:
            for name in ("c_graph_replay_equals_eager", "e_graph_vs_eager_step_time"):
                results[name] = {"status": "skipped", "reason": "CUDA graphs need a CUDA device (dry run)"}
        lengths = (
            torch.clamp(
                torch.distributions.LogNormal(5.5 if cuda else 2.5, 0.8).sample((400 if cuda else 40,)), 2, max_len
            )
            .long()
            .tolist()
        )
        results["d_throughput_packed_vs_padded"] = check_throughput(lengths, width, max_len, dtype, device, gen)
        results["f_cp_split_matches_kernel_formula"] = check_cp_split(rows)
    for name in names:
        r = results[name]
        detail = {k: v for k, v in r.items() if k != "status"}
        print(f"  {r['status'].upper():<8} {name}  {json.dumps(detail, default=str)}")
    failed = [n for n in names if results[n]["status"] == "fail"]
    counts = {s: sum(r["status"] == s for r in results.values()) for s in ("pass", "fail", "skipped", "measured")}
    print("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"device": "cuda" if cuda else "cpu", "results": results}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
