"""CP > 1: what each context-parallel rank trains, packed and unpacked, in a real gloo world of CP CPU processes.

Each rank takes the micro batches as Megatron-Bridge's ``get_batch`` splits them (training/gpt_step.py:330-337):
packed batches through ``_partition_packed_batch_for_cp`` (-> packed_seq_utils.py ``get_thd_cp_partition_indices``
-> megatron/core/utils.py ``get_batch_on_this_cp_rank`` -> ``_get_batch_on_this_cp_rank_per_document_balancing``
-> TE's ``thd_get_partitioned_indices``), unpacked ones through ``get_batch_on_this_cp_rank`` (no cu_seqlens: the
per-sequence zigzag), with the keys ``get_batch_from_iterator`` keeps. TE's kernel is CUDA only (its wrapper makes
a CUDA output tensor; here ``transformer_engine_torch`` does not even load): where calling it fails, the split runs
with ``te_partition_indices`` in its place, a line-by-line transliteration of TE's ``thd_partition_indices_kernel``
(common/fused_attn/context_parallel.cu), and the verdict says what stood in (``check`` prints it, text and JSON).

Per rank: the physical position of every token it holds, its label, loss mask and per-token loss contribution (the
stand-in loss of ``loss.py`` times the mask), Megatron-Bridge's ``masked_next_token_loss`` and Megatron-Core's
``forward_step_calc_loss`` with the CP size, then the reductions over the CP group as the step does them: the
reported ``lm loss`` ([sum, tokens] all-reduced over dp_cp, training/train.py:984-992) and the loss backward runs on
(with ``calculate_per_token_loss``, which ``ConfigContainer.validate`` requires for SFT at CP > 1 (training/
config.py:1452): the summed loss over the all-reduced token count, as finalize_model_grads.py:680-697 scales).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator

import torch

from mbridge_seqpack.equivalence.batches import Run
from mbridge_seqpack.equivalence.loss import _config, _Model, _quiet, stand_in_losses
from mbridge_seqpack.equivalence.setup import Setup

__all__ = ["CpSide", "CpSignals", "CpToken", "cp_signals", "te_partition_indices"]

#: the step's kept keys (get_batch_from_iterator, first and last pipeline stage, no attention mask from the dataset)
_STEP_KEYS = ("tokens", "labels", "loss_mask", "position_ids")
#: a key the check adds to each batch: every position's own index, split with the rest (where each token went)
POSITION = "physical_position"


def te_partition_indices(cu_seqlens: torch.Tensor, total_tokens: int, world_size: int, rank: int) -> torch.Tensor:
    """TE's ``thd_get_partitioned_indices`` on CPU: its checks and ``thd_partition_indices_kernel`` line by line
    (each rank holds, per sequence, chunk ``rank`` and chunk ``2*world_size-1-rank`` of 2*world_size)."""
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.size(0) < 2:
        raise RuntimeError("thd_get_partitioned_indices: cu_seqlens must be a 1-D int32 tensor of 2 or more")
    if not 0 <= rank < world_size or total_tokens <= 0 or total_tokens % (world_size * 2):
        raise RuntimeError(f"thd_get_partitioned_indices: total_tokens {total_tokens} % (2*{world_size}) != 0")
    bounds = [int(v) for v in cu_seqlens.tolist()]
    if any(v % (world_size * 2) for v in bounds):
        raise RuntimeError(f"thd_partition_indices_kernel: a cu_seqlens entry is not a multiple of 2*{world_size}")
    local = [v // world_size for v in bounds]
    out = []
    for token in range(total_tokens // world_size):
        left, right = 1, len(local) - 1  # binary_search(token, cu_seqlens_s, batch + 1)
        while left < right:
            mid = (left + right) // 2
            if local[mid] <= token:
                left = mid + 1
            else:
                right = mid
        seq = left - 1
        seq_len = local[seq + 1] - local[seq]
        index = token - local[seq]
        offset = rank if index < seq_len // 2 else (world_size - 1) * 2 - rank
        out.append(index + local[seq] * world_size + seq_len // 2 * offset)
    return torch.tensor(out, dtype=torch.int32)


class _TexStandIn:
    """Stands for ``transformer_engine_torch`` in megatron/core/utils.py: only the partition kernel."""

    def __init__(self, kernel: Callable[..., torch.Tensor]) -> None:
        self.thd_get_partitioned_indices = kernel


@contextlib.contextmanager
def _kernel(kernel: Callable[..., torch.Tensor]) -> Iterator[None]:
    import megatron.core.utils as mcore_utils

    previous = mcore_utils.tex
    mcore_utils.tex = _TexStandIn(kernel)
    try:
        yield
    finally:
        mcore_utils.tex = previous


@dataclass(frozen=True)
class CpToken:
    """One token a CP rank holds: the rank, its physical position in the micro batch's row, label, trained, loss
    contribution, and the position TE's CP attention reads it at (from the rank's local layout)."""

    rank: int
    position: int
    label: int
    trained: bool
    loss: float
    layout: int


@dataclass(frozen=True)
class CpSide:
    """One run split over CP: per sample, per input position, the CpTokens holding it (exactly one when right);
    per rank the (loss sum, trained tokens) it contributes; the reported and the backward loss after the CP
    reductions."""

    tokens: tuple[tuple[tuple[CpToken, ...], ...], ...]
    per_rank: tuple[tuple[float, int], ...]
    reported: float
    backward: float


@dataclass(frozen=True)
class CpSignals:
    """Packed and unpacked CP sides, and what could not run (the TE kernel, when its stand-in was used)."""

    packed: CpSide
    unpacked: CpSide
    not_run: tuple[str, ...] = ()


def _step_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch as get_batch_from_iterator leaves it (gpt_step.py:220-272): the step's keys and the packed
    metadata, every other key None; plus the check's position key."""
    from megatron.bridge.training.gpt_step import _CURRENT_PACKED_SEQ_DEVICE_KEYS, _CURRENT_PACKED_SEQ_HOST_KEYS

    kept = set(_STEP_KEYS) | set(_CURRENT_PACKED_SEQ_DEVICE_KEYS) | set(_CURRENT_PACKED_SEQ_HOST_KEYS)
    out = {key: (val if key in kept else None) for key, val in batch.items()}
    rows, width = batch["tokens"].shape
    out[POSITION] = torch.arange(width).repeat(rows, 1)
    return out


def _split(batch: dict[str, Any], group: Any, packed: bool) -> dict[str, Any]:
    """Megatron-Bridge's get_batch CP branch (gpt_step.py:330-337)."""
    from megatron.bridge.training.gpt_step import _partition_packed_batch_for_cp
    from megatron.core.utils import get_batch_on_this_cp_rank

    if packed:
        return _partition_packed_batch_for_cp(batch, group)
    return get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=group)


def _layout(batch: dict[str, Any], packed: bool, width: int, cp: int, rank: int) -> list[int]:
    """Where TE's CP attention reads each of the rank's local tokens: the zigzag of the packed cu_seqlens (the
    padded ones where present, as ``_cu_seqlens_for_cp_partition`` picks), or of the whole row unpacked."""
    from megatron.bridge.training.gpt_step import _cu_seqlens_for_cp_partition

    cu = _cu_seqlens_for_cp_partition(batch).to(torch.int32) if packed else torch.tensor([0, width], dtype=torch.int32)
    return [int(v) for v in te_partition_indices(cu, width, cp, rank).tolist()]


def _rank_side(
    setup: Setup, run: Run, packed: bool, split: Callable[..., dict[str, Any]], rank: int, group: Any
) -> dict[str, Any]:
    """One rank's part of ``run``: per micro batch its tokens' (position, label, trained, loss, layout) per row,
    then the loss reductions over the CP group."""
    from megatron.bridge.training.losses import masked_next_token_loss
    from megatron.core.pipeline_parallel.schedules import forward_step_calc_loss

    cp = setup.cp
    micro, store, backward, tokens = [], [], 0.0, 0
    config = _config(setup.per_token_loss)
    with contextlib.redirect_stderr(io.StringIO()), _quiet():
        for whole in run.batches:
            width = whole["tokens"].shape[1]
            layout = _layout(whole, packed, width, cp, rank)
            part = split(_step_batch(whole), group, packed)
            losses = stand_in_losses(part)
            rows = []
            for row in range(part["tokens"].shape[0]):
                rows.append(
                    [
                        (
                            int(part[POSITION][row, i]),
                            int(part["labels"][row, i]),
                            bool(part["loss_mask"][row, i] > 0) and int(part["labels"][row, i]) != -100,
                            float(losses[row, i] * part["loss_mask"][row, i]),
                            layout[i] if i < len(layout) else -1,
                        )
                        for i in range(part["tokens"].shape[1])
                    ]
                )
            micro.append(rows)
            out, count = forward_step_calc_loss(
                _Model(),
                losses.clone(),
                partial(masked_next_token_loss, part["loss_mask"], check_for_nan_in_loss=False),
                config,
                None,
                False,
                len(run.batches),
                store,
                cp_group_size=cp,
                is_last_stage=True,
            )
            backward += float(out)
            tokens += int(count)
    pair = torch.vstack([d["lm loss"].view(-1) for d in store]).sum(dim=0)
    mine = (float(pair[0]), int(pair[1]))
    torch.distributed.all_reduce(pair, group=group)  # train.py:988-990, over dp_cp
    totals = torch.tensor([backward, float(tokens)], dtype=torch.float64)
    torch.distributed.all_reduce(totals, group=group)
    if setup.per_token_loss:  # finalize_model_grads: the grads of the summed loss over the all-reduced tokens
        grad_loss = float(totals[0] / max(float(totals[1]), 1.0))
    else:  # DDP averages the gradients over dp_cp: the mean of the ranks' losses
        grad_loss = float(totals[0]) / cp
    return {"micro": micro, "mine": mine, "reported": float(pair[0] / pair[1]), "backward": grad_loss}


def _side(run: Run, results: list[dict[str, Any]]) -> CpSide:
    """Per sample and input position, the rank tokens that hold it."""
    held: dict[tuple[int, int, int], list[CpToken]] = {}
    for rank, result in enumerate(results):
        for m, rows in enumerate(result["micro"]):
            for row, entries in enumerate(rows):
                for position, label, trained, loss, layout in entries:
                    token = CpToken(rank, position, label, trained, loss, layout)
                    held.setdefault((m, row, position), []).append(token)
    tokens = tuple(
        tuple(tuple(held.get((p.micro, p.row, p.start + j), ())) for j in range(p.inputs)) for p in run.placed
    )
    return CpSide(tokens, tuple(r["mine"] for r in results), results[0]["reported"], results[0]["backward"])


def _kernel_note(error: str) -> str:
    return (
        f"stood in here: Transformer Engine's thd_get_partitioned_indices kernel (CUDA only; here: {error}): "
        "each CP rank's packed split ran through Megatron-Bridge's _partition_packed_batch_for_cp with a "
        "transliteration of TE's thd_partition_indices_kernel in its place"
    )


def cp_signals(
    setup: Setup,
    packed: Run,
    unpacked: Run,
    split: Callable[..., dict[str, Any]] = _split,
    kernel: Callable[..., torch.Tensor] = te_partition_indices,
) -> CpSignals:
    """Both runs split over ``setup.cp`` ranks of a forked gloo world (``split`` and ``kernel`` stand for
    Megatron-Bridge's split and TE's kernel: a test passes mutants). Raises RanksUnavailable where no world can be
    made here."""
    from mbridge_seqpack.capture.cpu_world import ranks

    def on_rank(rank: int, group: Any) -> tuple[dict[str, Any], dict[str, Any], str]:
        error = ""
        try:
            probe = _step_batch(packed.batches[0])
            split(probe, group, True)
        except Exception as exc:  # noqa: BLE001 - the kernel's failure here is what the verdict reports
            error = f"{type(exc).__name__}: {str(exc).split('. ')[0].splitlines()[0] if str(exc) else ''}"
        if error:
            with _kernel(kernel):
                side = _rank_side(setup, packed, True, split, rank, group)
        else:
            side = _rank_side(setup, packed, True, split, rank, group)
        return side, _rank_side(setup, unpacked, False, split, rank, group), error

    results = ranks(on_rank, world_size=setup.cp)
    errors = sorted({error for _, _, error in results if error})
    return CpSignals(
        _side(packed, [r[0] for r in results]),
        _side(unpacked, [r[1] for r in results]),
        tuple(_kernel_note(e) for e in errors),
    )
