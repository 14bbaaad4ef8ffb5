"""``collate.*``: the sequence length the collates of Hugging Face, Energon and mock VLM datasets need for CP / SP
(they pad, never pack, to lcm(2*CP, CP*TP if SP))."""

from __future__ import annotations

from mbridge_seqpack.analysis.topology import round_up
from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import POSITIVE_INT
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.shared import _seq_length_fix


@rule(
    "collate.seq_length_alignment",
    "DirectHF/Energon/MockVLM: dataset.seq_length divisible by lcm(2*CP, CP*TP if SP) for train and eval CP.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError '<Dataset>.seq_length must be "
        "divisible by the CP/SP collate padding multiple' for DirectHF/Energon/MockVLM datasets."
    ),
    reads={**TOPOLOGY_READS, "dataset.seq_length": POSITIVE_INT, "model.seq_length": POSITIVE_INT},
)
def collate_seq_length_alignment(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.has_collate_padding:
        return None
    need = ctx.topology.alignment
    seq = ctx.dataset.seq_length
    if seq % need == 0:
        return []
    topo = ctx.topology
    return [
        Violation(
            {
                "dataset.seq_length": seq,
                "model.context_parallel_size": topo.cp,
                "model.tensor_model_parallel_size": topo.tp,
                "model.sequence_parallel": topo.sequence_parallel,
            }
            | ({} if topo.eval_cp is None else {"dist.eval_context_parallel_size": topo.eval_cp}),
            f"the collate pads every sequence to the CP/SP multiple {need}, so dataset.seq_length must be "
            f"a multiple of {need}",
            assignments=_seq_length_fix(ctx, round_up(seq, need)),
        )
    ]
