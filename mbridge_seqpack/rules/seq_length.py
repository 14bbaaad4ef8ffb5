"""``seq_length.*``: the model's sequence length against the dataset's."""

from __future__ import annotations

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.field_types import POSITIVE_INT
from mbridge_seqpack.rules.registry import rule


@rule(
    "seq_length.model_matches_dataset",
    "model.seq_length == dataset.seq_length.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate asserts 'Please ensure sequence length configuration in "
        "model config and dataset config match.'"
    ),
    reads={"dataset.seq_length": POSITIVE_INT, "model.seq_length": POSITIVE_INT},
)
def model_matches_dataset(ctx: RuleContext) -> list[Violation] | None:
    data_seq = getattr(ctx.dataset, "seq_length", None)
    if data_seq is None:
        return None
    if data_seq == ctx.model.seq_length:
        return []
    return [
        Violation(
            {"model.seq_length": ctx.model.seq_length, "dataset.seq_length": data_seq},
            "the dataset emits rows of dataset.seq_length tokens; the model (RoPE, CP chunks) is sized for "
            "model.seq_length",
            assignments={"dataset.seq_length": ctx.model.seq_length},
        )
    ]
