"""The loss and its reduction: Megatron-Bridge's ``masked_next_token_loss`` (training/losses.py, what gpt_step's
``loss_func`` is) and Megatron-Core's ``forward_step_calc_loss`` (pipeline_parallel/schedules.py:290-342) over a
run's micro batches, then the step's reported ``lm loss`` (training/train.py:984-992: the [sum, tokens] pairs of the
micro batches summed, then sum / tokens).

Logits need a model, so the per-token loss is a stand-in: a fixed function of each position's input token and label
(what a cross entropy reads), the same packed and unpacked for a sample's real tokens. Per sample: the loss sum and
token count ``masked_next_token_loss`` gives over the sample's positions. Per run: the reported loss, and the loss
backward runs on (``forward_step_calc_loss``'s outputs summed over the micro batches; with
``calculate_per_token_loss`` divided by the global token count, as finalize_model_grads scales the gradients).
Without ``calculate_per_token_loss`` that one averages per micro batch, so it depends on which sequences share one:
it is compared only where packed and unpacked micro batches hold the same sequences (in-batch packing).
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch

from mbridge_seqpack.equivalence.batches import Run
from mbridge_seqpack.equivalence.setup import Setup

__all__ = ["LossSignal", "loss_signal", "stand_in_losses"]


@dataclass(frozen=True)
class LossSignal:
    """Per sample (loss sum, trained tokens); the step's reported loss; the loss backward runs on."""

    per_sample: tuple[tuple[float, int], ...]
    reported: float
    backward: float


def stand_in_losses(batch: dict[str, Any]) -> torch.Tensor:
    """[rows, width] a positive per-token loss from the input token and the label (ignored labels included)."""
    tokens, labels = batch["tokens"].long(), batch["labels"].long()
    return 1.0 + torch.remainder(tokens * 7 + labels * 3, 11).float() / 8.0


def _mnt_loss() -> Callable[..., Any]:
    from megatron.bridge.training.losses import masked_next_token_loss

    return masked_next_token_loss


def _config(per_token: bool) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=1,
        hidden_size=8,
        num_attention_heads=1,
        calculate_per_token_loss=per_token,
        use_cpu_initialization=True,
    )


class _Model:
    """What forward_step_calc_loss reads of the model: its virtual pipeline stage (none)."""

    vp_stage = None


def loss_signal(setup: Setup, run: Run, loss_fn: Callable[..., Any] | None = None) -> LossSignal:
    """The loss signals of ``run`` (``loss_fn`` stands for masked_next_token_loss: a test passes a mutant)."""
    from megatron.core.pipeline_parallel.schedules import forward_step_calc_loss

    loss_fn = loss_fn or _mnt_loss()
    losses = [stand_in_losses(b) for b in run.batches]
    per_sample = []
    with contextlib.redirect_stderr(io.StringIO()), _quiet():  # the rerun state machine's implicit-init warning
        for p in run.placed:
            window = slice(p.start, p.start + p.inputs)
            mask = run.batches[p.micro]["loss_mask"][p.row : p.row + 1, window]
            total, count, _ = loss_fn(mask, losses[p.micro][p.row : p.row + 1, window], check_for_nan_in_loss=False)
            per_sample.append((float(total), int(count)))
        config, store, backward, tokens = _config(setup.per_token_loss), [], 0.0, 0
        for batch, loss in zip(run.batches, losses):
            out, count = forward_step_calc_loss(
                _Model(),
                loss.clone(),
                partial(loss_fn, batch["loss_mask"], check_for_nan_in_loss=False),
                config,
                None,
                False,
                len(run.batches),
                store,
                cp_group_size=1,
                is_last_stage=True,
            )
            backward += float(out)
            tokens += int(count)
    pairs = torch.vstack([d["lm loss"].view(-1) for d in store]).sum(dim=0)
    if setup.per_token_loss:
        backward /= max(tokens, 1)
    return LossSignal(tuple(per_sample), float(pairs[0] / pairs[1]), backward)


@contextlib.contextmanager
def _quiet():
    log = logging.getLogger("megatron.core.rerun_state_machine")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)
