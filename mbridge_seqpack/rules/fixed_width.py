"""``fixed_width.*``: where GPT SFT packs must be one fixed width (pipeline stages and expert dispatch)."""

from __future__ import annotations

from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import DATASET_KWARGS_READS, TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import OPTIONAL_NAME, UNCHECKED
from mbridge_seqpack.rules.registry import rule


@rule(
    "fixed_width.gpt_sft_pipeline",
    "GPT SFT with PP>1 outside the 'batch' dataloader needs dataset_kwargs['pad_to_max_length']=True.",
    severity=ERROR,
    evidence=(
        "With PP>1 and variable_seq_lengths=False, megatron/core/pipeline_parallel/schedules.py get_tensor_shapes "
        "sizes every p2p buffer from the seq_length training/train.py passes: the width of the current global batch "
        "for dataloader_type='batch' (data/batch_utils.py prepare_finetuning_batch, Megatron-Bridge's SFT default), "
        "else model.seq_length, while data/packing/gpt_sft.py and data/datasets/gpt_sft.py collate_fn emit rows only "
        "as wide as their content."
    ),
    reads={
        **TOPOLOGY_READS,
        **DATASET_KWARGS_READS,
        "dataset.dataloader_type": OPTIONAL_NAME,
        "model.variable_seq_lengths": UNCHECKED,
    },
)
def gpt_sft_pipeline(ctx: RuleContext) -> list[Violation] | None:
    topo = ctx.topology
    if not ctx.dataset_is("gpt_sft") or topo.pp <= 1 or getattr(ctx.model, "variable_seq_lengths", False) is True:
        return None
    if getattr(ctx.dataset, "dataloader_type", None) == "batch":
        return None  # the training loop takes each global batch's own width
    if ctx.pad_to_max_length:
        return []
    return [
        Violation(
            {
                ctx.pad_to_max_length_path: False,
                "model.pipeline_model_parallel_size": topo.pp,
                "dataset.dataloader_type": getattr(ctx.dataset, "dataloader_type", None),
            },
            "pipeline stages exchange activations through buffers of seq_length tokens; variable-width rows "
            "do not fit them",
            assignments=ctx.pad_to_max_length_fix(),
        )
    ]


@rule(
    "fixed_width.gpt_sft_experts",
    "GPT SFT with EP>1: Megatron-Bridge pads rows to full width for expert parallelism on its other datasets.",
    severity=ADVISORY,
    evidence=(
        "training/config.py ConfigContainer.validate sets pad_to_max_length=True for EP>1 on DirectHF/Energon/"
        "MockVLM datasets; no Megatron-Core code fails on variable-width rows with EP>1 for the alltoall/allgather "
        "dispatchers (they take any token count), so for GPT SFT this is a consistency/performance advisory; "
        "HybridEP, which does need equal counts, is moe.hybridep_uneven_inputs."
    ),
    reads={**TOPOLOGY_READS, **DATASET_KWARGS_READS},
)
def gpt_sft_experts(ctx: RuleContext) -> list[Violation] | None:
    topo = ctx.topology
    if not ctx.dataset_is("gpt_sft") or topo.ep <= 1:
        return None
    if ctx.pad_to_max_length:
        return []
    return [
        Violation(
            {ctx.pad_to_max_length_path: False, "model.expert_model_parallel_size": topo.ep},
            "Megatron-Bridge pads rows to full width under expert parallelism for its HF/VLM datasets; GPT SFT "
            "rows stay variable-width",
            assignments=ctx.pad_to_max_length_fix(),
        )
    ]
