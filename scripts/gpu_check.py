"""GPU check for static THD packing (one command, a few minutes on one GPU; no TE or Megatron needed).

A small causal transformer whose attention is PyTorch's ``torch.nn.attention.varlen.varlen_attn`` (the
same ``cu_seqlens`` / ``max_seqlen`` contract as Transformer Engine's THD attention), fed by
mbridge_seqpack's static boundaries (``mbridge_seqpack.thd.static_cu_seqlens``):

  (a) packed vs unpacked loss parity on real packed rows;
  (b) one CUDA-graph capture of forward+backward with static cu_seqlens, replayed over batches with
      different boundaries and sequence counts: loss equal to eager, no re-capture;
  (c) real tokens/s, packed rows vs padded batches, on a realistic length mix;
  (d) graph vs eager step time.

    PYTHONPATH=. python scripts/gpu_check.py            # on the GPU machine
    PYTHONPATH=. python scripts/gpu_check.py --dry-run  # CPU: reference attention, tiny sizes, no graphs
Without CUDA and without --dry-run it prints a skip line and exits 0.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mbridge_seqpack.reference import varlen_causal_attention  # noqa: E402
from mbridge_seqpack.thd import static_cu_seqlens  # noqa: E402


@dataclass
class Sizes:
    vocab: int = 32000
    dim: int = 512
    heads: int = 8
    layers: int = 4
    row: int = 8192
    max_len: int = 4096
    sequences: int = 600
    capacity: int = 0  # set from the packed rows


def causal_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    """varlen_attn (flash) on CUDA, the CPU reference elsewhere; causal either way."""
    if q.is_cuda:
        from torch.nn.attention.varlen import varlen_attn

        params = inspect.signature(varlen_attn).parameters
        causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return varlen_attn(q, k, v, cu, cu, max_seqlen, max_seqlen, **causal)
    return varlen_causal_attention(q, k, v, cu)


class Block(torch.nn.Module):
    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.heads = s.heads
        self.norm1 = torch.nn.RMSNorm(s.dim)
        self.qkv = torch.nn.Linear(s.dim, 3 * s.dim, bias=False)
        self.proj = torch.nn.Linear(s.dim, s.dim, bias=False)
        self.norm2 = torch.nn.RMSNorm(s.dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(s.dim, 4 * s.dim, bias=False), torch.nn.GELU(),
                                       torch.nn.Linear(4 * s.dim, s.dim, bias=False))

    def forward(self, h: torch.Tensor, cu: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        t = h.shape[0]
        q, k, v = self.qkv(self.norm1(h)).view(t, 3, self.heads, -1).unbind(1)
        h = h + self.proj(causal_varlen(q, k, v, cu, max_seqlen).reshape(t, -1))
        return h + self.mlp(self.norm2(h))


class TinyLM(torch.nn.Module):
    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(s.vocab, s.dim)
        self.pos = torch.nn.Embedding(s.row, s.dim)
        self.blocks = torch.nn.ModuleList(Block(s) for _ in range(s.layers))
        self.head = torch.nn.Linear(s.dim, s.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
                cu: torch.Tensor, max_seqlen: int) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.emb(tokens) + self.pos(positions)
        for block in self.blocks:
            h = block(h, cu, max_seqlen)
        losses = torch.nn.functional.cross_entropy(self.head(h).float(), labels, reduction="none")
        return (losses * mask).sum(), mask.sum()


def make_rows(s: Sizes, gen: torch.Generator, device: torch.device) -> tuple[list[dict], list[list[torch.Tensor]]]:
    """Sequences with lognormal lengths packed (best-fit decreasing) into rows of ``s.row`` tokens."""
    import numpy as np

    from mbridge_seqpack.packing.packer import pack_lengths

    lengths = np.clip(np.random.default_rng(0).lognormal(6, 1, s.sequences).astype(np.int64), 16, s.max_len)
    seqs = [torch.randint(0, s.vocab, (int(n) + 1,), generator=gen) for n in lengths]
    bins = pack_lengths(lengths, s.row, seed=0)
    rows, members = [], []
    for b in range(int(bins.max()) + 1):
        chosen = [seqs[i] for i in np.flatnonzero(bins == b)]
        members.append(chosen)
        tokens = torch.cat([c[:-1] for c in chosen])
        labels = torch.cat([c[1:] for c in chosen])
        positions = torch.cat([torch.arange(len(c) - 1) for c in chosen])
        cu = torch.tensor([0, *torch.cumsum(torch.tensor([len(c) - 1 for c in chosen]), 0).tolist()], dtype=torch.int32)
        pad = s.row - tokens.numel()
        rows.append({
            "tokens": torch.cat([tokens, torch.zeros(pad, dtype=torch.int64)]).to(device),
            "labels": torch.cat([labels, torch.zeros(pad, dtype=torch.int64)]).to(device),
            "positions": torch.cat([positions, torch.zeros(pad, dtype=torch.int64)]).to(device),
            "mask": torch.cat([torch.ones(tokens.numel()), torch.zeros(pad)]).to(device),
            "cu": cu,
        })
    s.capacity = max(len(r["cu"]) for r in rows) + 1
    for r in rows:  # static boundaries built on the host, then one copy to the device
        r["cu"] = static_cu_seqlens(r["cu"], capacity=s.capacity, row_width=s.row)[0].to(device)
    return rows, members


def check_parity(model: TinyLM, rows: list[dict], members: list[list[torch.Tensor]], s: Sizes,
                 device: torch.device, dtype: torch.dtype) -> tuple[float, float, float]:
    """(packed loss, unpacked loss, relative difference) over the first rows."""
    packed_sum = packed_n = alone_sum = alone_n = 0.0
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        for row, chosen in list(zip(rows, members))[:3]:
            loss, n = model(row["tokens"], row["positions"], row["labels"], row["mask"], row["cu"], s.row)
            packed_sum, packed_n = packed_sum + float(loss), packed_n + float(n)
            for seq in chosen:
                t = len(seq) - 1
                cu = torch.tensor([0, t], dtype=torch.int32, device=device)
                loss, n = model(seq[:-1].to(device), torch.arange(t, device=device), seq[1:].to(device),
                                torch.ones(t, device=device), cu, t)
                alone_sum, alone_n = alone_sum + float(loss), alone_n + float(n)
    a, b = packed_sum / packed_n, alone_sum / alone_n
    return a, b, abs(a - b) / abs(b)


def timed(fn, repeats: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU: reference attention, tiny sizes, no graphs")
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print("gpu_check: no CUDA device: skipped")
        return 0
    device = torch.device("cuda" if cuda else "cpu")
    s = Sizes() if cuda else Sizes(vocab=97, dim=32, heads=2, layers=1, row=256, max_len=96, sequences=24)
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = TinyLM(s).to(device)
    rows, members = make_rows(s, gen, device)
    results: list[tuple[str, str, bool]] = []

    # (a) parity
    packed_loss, alone_loss, rel = check_parity(model, rows, members, s, device, dtype)
    tol = 2e-2 if cuda else 1e-5
    results.append(("(a) packed vs unpacked loss", f"{packed_loss:.5f} vs {alone_loss:.5f} (rel {rel:.2e})",
                    rel < tol))

    # (b) CUDA graph over static cu_seqlens, replayed on rows with different boundaries
    def eager_step(row: dict) -> torch.Tensor:
        model.zero_grad(set_to_none=False)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss, n = model(row["tokens"], row["positions"], row["labels"], row["mask"], row["cu"], s.row)
            loss = loss / n
        loss.backward()
        return loss.detach()

    if cuda:
        static = {k: v.clone() for k, v in rows[0].items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                eager_step(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = eager_step(static)
        counts = sorted({int((r["cu"][1:] > r["cu"][:-1]).sum()) for r in rows})
        worst = 0.0
        replays = 0
        for i in range(args.replays):
            row = rows[i % len(rows)]
            for key in static:
                static[key].copy_(row[key])
            graph.replay()
            graphed = float(static_loss)
            expected = float(eager_step(row))
            worst = max(worst, abs(graphed - expected) / abs(expected))
            replays += 1
        results.append(("(b) CUDA graph replay == eager",
                        f"{replays} replays of 1 capture over rows with {counts[0]}..{counts[-1]} segments, "
                        f"capacity {s.capacity}, max rel diff {worst:.2e}", worst < 1e-3))
    else:
        results.append(("(b) CUDA graph replay == eager", "skipped (no CUDA)", True))

    # (c) tokens/s: packed rows vs padded batches of the same sequences
    real_tokens = sum(len(c) - 1 for m in members for c in m)
    packed_t = timed(lambda: [eager_step(r) for r in rows], 1 if not cuda else 3, device)
    flat = sorted((c for m in members for c in m), key=len, reverse=False)
    rng = torch.Generator().manual_seed(1)
    order = torch.randperm(len(flat), generator=rng).tolist()
    per_batch = max(1, s.row // s.max_len)  # same token slots per step as one packed row

    padded_rows = []  # built before timing, like the packed rows
    for i in range(0, len(order), per_batch):
        batch = [flat[j] for j in order[i:i + per_batch]]
        width = max(len(c) - 1 for c in batch)

        def pad(t: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, width - t.numel()))

        padded_rows.append((width, {  # B rows of `width`, each its own causal segment
            "tokens": torch.cat([pad(c[:-1]) for c in batch]).to(device),
            "labels": torch.cat([pad(c[1:]) for c in batch]).to(device),
            "mask": torch.cat([pad(torch.ones(len(c) - 1)) for c in batch]).to(device),
            "positions": torch.arange(width, device=device).repeat(len(batch)),
            "cu": torch.arange(0, (len(batch) + 1) * width, width, dtype=torch.int32, device=device),
        }))

    def padded_epoch() -> None:
        for width, row in padded_rows:
            model.zero_grad(set_to_none=False)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss, n = model(row["tokens"], row["positions"], row["labels"], row["mask"], row["cu"], width)
            (loss / n).backward()

    padded_t = timed(padded_epoch, 1 if not cuda else 3, device)
    results.append(("(c) tokens/s packed vs padded",
                    f"{real_tokens / packed_t:,.0f} vs {real_tokens / padded_t:,.0f} "
                    f"({padded_t / packed_t:.2f}x)", True))

    # (d) graph vs eager step time
    if cuda:
        eager_t = timed(lambda: eager_step(rows[0]), 20, device)
        graph_t = timed(graph.replay, 20, device)
        results.append(("(d) step time graph vs eager", f"{graph_t * 1e3:.2f} ms vs {eager_t * 1e3:.2f} ms "
                        f"({eager_t / graph_t:.2f}x)", True))
    else:
        results.append(("(d) step time graph vs eager", "skipped (no CUDA)", True))

    name = torch.cuda.get_device_name() if cuda else "cpu (dry run)"
    print(f"gpu_check on {name}, torch {torch.__version__}: {len(rows)} packed rows of {s.row}, "
          f"{sum(len(m) for m in members)} sequences")
    width = max(len(r[0]) for r in results)
    for label, detail, ok in results:
        print(f"  {'PASS' if ok else 'FAIL'}  {label:<{width}}  {detail}")
    failed = sum(not ok for _, _, ok in results)
    print(f"summary: {len(results) - failed} of {len(results)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
