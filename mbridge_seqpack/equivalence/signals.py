"""Per-token training signals of a run: what the loss sees at each input position of each sample.

- the label and whether it is trained (the batch's ``labels`` and ``loss_mask``, which Megatron-Bridge's
  ``masked_next_token_loss`` and the model's cross entropy read as they are);
- the sequence the token attends within, as Transformer Engine reads ``PackedSeqParams`` (a token at physical
  position ``x`` belongs to the segment ``[cu_seqlens_q_padded[k], cu_seqlens_q_padded[k+1])`` and is a real token
  of it when ``x - cu_seqlens_q_padded[k] < cu_seqlens_q[k+1] - cu_seqlens_q[k]``): the offset from its own
  sequence's first token, or None where it is in another sequence or counted as padding. TE's attention kernel does
  not run on CPU; this per-sequence reference of what it attends is what the check compares;
- the MTP targets per depth: Megatron-Core's own ``process_mtp_loss`` (transformer/multi_token_prediction.py),
  which rolls labels and the loss mask with ``roll_tensor`` (``_roll_tensor_packed_seq`` for packed params), run
  with the step's ``PackedSeqParams`` and the loss mask the step passes (gpt_step passes none: the model then uses
  ones). The loss per token is replaced by a probe (ones that record their gradient), so the gradient each MTP
  target gets is what ``MTPLossAutoScaler`` gives it: its weight in training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mbridge_seqpack.equivalence.batches import Run
from mbridge_seqpack.equivalence.setup import Setup

__all__ = ["IGNORE_INDEX", "Token", "token_signals", "mtp_targets"]

IGNORE_INDEX = -100  # data/datasets/utils.py IGNORE_INDEX: the in-batch collate's label for untrained positions


@dataclass(frozen=True)
class Token:
    """One input position of one sample: label, trained, attention offset, MTP (label, trained) per depth."""

    label: int
    trained: bool
    offset: int | None
    mtp: tuple[tuple[int, bool], ...] = ()


def _offsets(params: Any, width: int) -> list[tuple[int, int] | None]:
    """Per physical position: (segment start, offset) when TE counts it a real token of that segment."""
    if params is None:
        return [(0, x) for x in range(width)]
    logical = [int(v) for v in params.cu_seqlens_q.reshape(-1).tolist()]
    padded_t = getattr(params, "cu_seqlens_q_padded", None)
    physical = logical if padded_t is None else [int(v) for v in padded_t.reshape(-1).tolist()]
    out: list[tuple[int, int] | None] = [None] * width
    for k in range(len(physical) - 1):
        start, end = physical[k], physical[k + 1]
        real = logical[k + 1] - logical[k]
        for x in range(max(start, 0), min(end, width)):
            if x - start < real:
                out[x] = (start, x - start)
    return out


class _LossProbe:
    """Stands for the model's ``compute_language_model_loss`` inside ``process_mtp_loss``: records each depth's
    labels and returns ones whose gradient is the weight training gives each MTP target."""

    def __init__(self) -> None:
        self.labels: list[torch.Tensor] = []
        self.leaves: list[torch.Tensor] = []

    def __call__(self, labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        leaf = torch.ones(labels.shape, dtype=torch.float32, requires_grad=True)
        self.labels.append(labels.detach().clone())
        self.leaves.append(leaf)
        return leaf


def _mtp_config(setup: Setup) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=1,
        hidden_size=8,
        num_attention_heads=1,
        mtp_num_layers=setup.mtp_layers,
        mtp_loss_scaling_factor=setup.mtp_loss_scale,
        calculate_per_token_loss=setup.per_token_loss,
        use_cpu_initialization=True,
    )


def mtp_targets(setup: Setup, batch: dict[str, Any], params: Any, pass_loss_mask: bool) -> list[tuple[Any, Any]]:
    """Per MTP depth: (labels [rows, width], weights [rows, width]) as Megatron-Core's ``process_mtp_loss`` trains
    them for this micro batch."""
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler, process_mtp_loss

    labels = batch["labels"]
    rows, width = labels.shape
    depth = setup.mtp_layers
    hidden = torch.zeros((width * (1 + depth), rows, 1), requires_grad=True)
    probe = _LossProbe()
    scale = MTPLossAutoScaler.main_loss_backward_scale
    MTPLossAutoScaler.main_loss_backward_scale = torch.tensor(1.0)
    try:
        out = process_mtp_loss(
            hidden_states=hidden,
            labels=labels,
            loss_mask=batch["loss_mask"] if pass_loss_mask else None,
            output_layer=lambda h, weight=None, runtime_gather_output=None: (h, None),
            output_weight=None,
            runtime_gather_output=None,
            is_training=False,  # the metrics tracker's logging is not what is compared
            compute_language_model_loss=probe,
            config=_mtp_config(setup),
            cp_group=None,
            packed_seq_params=params,
        )
        out.sum().backward()
    finally:
        MTPLossAutoScaler.main_loss_backward_scale = scale
    return [
        (lab, leaf.grad if leaf.grad is not None else torch.zeros_like(leaf))
        for lab, leaf in zip(probe.labels, probe.leaves)
    ]


def _trained(label: Any, weight: Any) -> bool:
    """A target training sees: a positive weight on a label that is not the collate's ignore index."""
    return bool(weight > 0) and int(label) != IGNORE_INDEX


def token_signals(setup: Setup, run: Run, *, pass_loss_mask: bool = False) -> list[list[Token]]:
    """Per sample, per input position: the training signals of ``run``."""
    out: list[list[Token]] = []
    cache: dict[int, tuple[list[Any], list[tuple[Any, Any]]]] = {}
    for placed in run.placed:
        batch, params = run.batches[placed.micro], run.params[placed.micro]
        if placed.micro not in cache:
            width = batch["tokens"].shape[1]
            mtp = mtp_targets(setup, batch, params, pass_loss_mask) if setup.mtp_layers else []
            cache[placed.micro] = (_offsets(params, width), mtp)
        offsets, mtp = cache[placed.micro]
        tokens = []
        row = placed.row
        for j in range(placed.inputs):
            x = placed.start + j
            seg = offsets[x] if params is not None else (0, j)
            offset = seg[1] if seg is not None and seg[0] == placed.start else None
            tokens.append(
                Token(
                    label=int(batch["labels"][placed.row, x]),
                    trained=_trained(batch["labels"][placed.row, x], batch["loss_mask"][placed.row, x]),
                    offset=offset,
                    mtp=tuple((int(lab[row, x]), _trained(lab[row, x], w[row, x])) for lab, w in mtp),
                )
            )
        out.append(tokens)
    return out
