"""CPU stand-ins for TE kernels the captured step calls, so a run goes on past them instead of stopping there.

A TE kernel is device work: inside a CUDA graph it is captured like any other and reads nothing on the host. On CPU
it cannot run (its extension wants CUDA tensors), so a run that reaches one would stop, and what follows it (a NaN
check's ``bool(tensor)``, a loss, a backward) would never be seen. A stand-in gives the kernel's result with the
kernel's shapes, computed by torch ops while the recorder only tracks device tensors (a kernel's own work is no host
read), and is listed in the run's ``stood_in`` with the site that called it, so the verdict says where it stood in.

Stood in: TE's fused RoPE (``tex.fused_rope_forward`` / ``tex.fused_rope_backward``: THD with ``cu_seqlens``,
SBHD / BSHD; one context-parallel rank, no ``start_positions``). Any other case of these kernels, and every other TE
kernel, has no stand-in: the run stops there and its verdict is undetermined (``iteration.kernel_boundary``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from devtools.capture.recorder import HostReadRecorder, library_frames
from mbridge_seqpack.frames import site_of

__all__ = ["kernel_stand_ins", "rope_reference"]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _positions(t: torch.Tensor, fmt: str, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """Each token's position in its own sequence, laid out as ``t``'s leading dims."""
    if fmt == "thd":
        tokens = torch.arange(t.shape[0])
        bounds = cu_seqlens.to(torch.long)
        seq = torch.searchsorted(bounds[1:], tokens, right=True).clamp(max=bounds.numel() - 2)
        return tokens - bounds[seq]
    if fmt == "sbhd":
        return torch.arange(t.shape[0])
    return torch.arange(t.shape[1])  # bshd


def rope_reference(
    t: torch.Tensor, freqs: torch.Tensor, fmt: str, cu_seqlens: torch.Tensor | None, *, backward: bool = False
) -> torch.Tensor:
    """Non-interleaved RoPE of ``t`` (forward), or the gradient through it of ``t`` (backward): the first
    ``freqs.shape[-1]`` channels rotated by each token's position in its own sequence, the rest passed through."""
    pos = _positions(t, fmt, cu_seqlens).clamp(max=freqs.shape[0] - 1)
    work = torch.promote_types(t.dtype, torch.float32)  # the kernel computes in float32 at least
    angle = freqs.reshape(freqs.shape[0], -1)[pos].to(work)  # [T, d] | [S, d]
    if fmt == "thd":
        angle = angle[:, None, :]
    elif fmt == "sbhd":
        angle = angle[:, None, None, :]
    else:
        angle = angle[None, :, None, :]
    width = angle.shape[-1]
    x = t[..., :width].to(work)
    cos, sin = torch.cos(angle), torch.sin(angle)
    out = x * cos - _rotate_half(x * sin) if backward else x * cos + _rotate_half(x) * sin
    return torch.cat((out.to(t.dtype), t[..., width:]), dim=-1)


def _fused_rope(recorder: HostReadRecorder, name: str, stood_in: list[str], backward: bool) -> Callable[..., Any]:
    from transformer_engine.pytorch.cpp_extensions.fused_attn import QKVFormat

    formats = {value: key for key, value in QKVFormat.items()}

    def stand_in(t, freqs, start_positions, fmt, interleaved, cu_seqlens, cp_size, cp_rank):  # noqa: ANN001, ANN202
        site = site_of(library_frames(2))[0]
        layout = formats.get(fmt)
        if interleaved or start_positions is not None or cp_size != 1 or layout not in ("thd", "sbhd", "bshd"):
            raise RuntimeError(f"CUDA kernel {name} has no CPU stand-in for this call (at {site})")
        if f"{name} at {site}" not in stood_in:
            stood_in.append(f"{name} at {site}")
        with recorder.capturing(False):
            return rope_reference(t, freqs, layout, cu_seqlens, backward=backward)

    return stand_in


@contextlib.contextmanager
def kernel_stand_ins(recorder: HostReadRecorder, stood_in: list[str]) -> Iterator[None]:
    """The stand-ins in place of TE's kernels for the run (put back after); each call's site lands in
    ``stood_in``. Without TE nothing is replaced."""
    try:
        import transformer_engine_torch as tex
    except ImportError:
        yield
        return
    patches = {
        name: _fused_rope(recorder, f"tex.{name}", stood_in, backward=name.endswith("backward"))
        for name in ("fused_rope_forward", "fused_rope_backward")
        if hasattr(tex, name)
    }
    saved = {name: getattr(tex, name) for name in patches}
    try:
        for name, fn in patches.items():
            setattr(tex, name, fn)
        yield
    finally:
        for name, fn in saved.items():
            setattr(tex, name, fn)
