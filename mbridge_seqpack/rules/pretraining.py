"""Pretraining datasets (Megatron-Core's ``GPTDataset`` through Megatron-Bridge's ``GPTDatasetConfig``): document
masking, per-document positions and the dense attention mask, as Megatron-Bridge 0.6.2's GPT step consumes them."""

from __future__ import annotations

from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import BOOL, OPTIONAL_BOOL, OPTIONAL_MICRO_BATCH, OPTIONAL_NAME
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.shared import _mask_dropped_reason


@rule(
    "pretraining.inter_document_masking",
    "dataset.inter_document_masking does not run in Megatron-Bridge 0.6.2's GPT step.",
    severity=ERROR,
    evidence=(
        "megatron/core/datasets/gpt_dataset.py GPTDataset.__getitem__ returns cu_seqlens padded to seq_length+1 "
        "entries with the value seq_length, and max_seqlen per sample; megatron/bridge/training/gpt_step.py "
        "get_batch treats 'cu_seqlens' as its legacy packed format: training/utils/packed_seq_utils.py "
        "get_packed_seq_params cuts it at torch.argmin (the -1 padding of packed SFT), which is index 0 here, so "
        "attention gets an empty cu_seqlens (micro batch 1, CP 1); at micro batch > 1 it raises 'max_seqlen must "
        "contain exactly one value'; at CP > 1 gpt_step._trim_padded_cu_seqlens_for_cp raises 'Packed CP batches "
        "require cu_seqlens_argmin' (GPU batches). The merge helper Megatron-LM uses for these batches is not in "
        "Megatron-Bridge."
    ),
    reads={**TOPOLOGY_READS, "dataset.inter_document_masking": BOOL, "train.micro_batch_size": OPTIONAL_MICRO_BATCH},
)
def inter_document_masking(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.pretraining_dataset or not getattr(ctx.dataset, "inter_document_masking", False):
        return None
    mbs = ctx.train.micro_batch_size
    cp = ctx.topology.cp
    if cp > 1:
        why = "at CP>1 the packed CP split raises for want of cu_seqlens_argmin"
    elif mbs is not None and mbs > 1:
        why = "at micro batch > 1 get_packed_seq_params raises on the stacked max_seqlen"
    else:
        why = "get_packed_seq_params cuts cu_seqlens at its argmin (index 0): attention gets no sequence"
    return [
        Violation(
            {"dataset.inter_document_masking": True, "train.micro_batch_size": mbs, "model.context_parallel_size": cp},
            "Megatron-Core's GPTDataset pads cu_seqlens with seq_length, Megatron-Bridge's step reads them as "
            f"packed SFT data padded with -1: {why}, at the first step",
            assignments={"dataset.inter_document_masking": False},
        )
    ]


@rule(
    "pretraining.reset_attention_mask",
    "dataset.reset_attention_mask only isolates documents when the mask reaches a non-TE attention.",
    severity=ADVISORY,
    evidence=(
        "megatron/core/datasets/gpt_dataset.py _get_ltor_masks_and_position_ids zeroes the mask across each EOD "
        "(only when create_attention_mask); megatron/bridge/training/gpt_step.py get_batch_from_iterator sets "
        "attention_mask to None unless skip_getting_attention_mask_from_dataset=False (every Megatron-Bridge recipe "
        "keeps True); Transformer Engine's DotProductAttention reads attention_mask only for 'padding'/'arbitrary' "
        "mask types and Megatron-Core's layer specs use 'causal'. Training runs, with documents attending to each "
        "other: the flag has no effect (and disables the dataset's mask cache)."
    ),
    reads={
        "dataset.create_attention_mask": BOOL,
        "dataset.reset_attention_mask": OPTIONAL_BOOL,
        "dataset.skip_getting_attention_mask_from_dataset": BOOL,
    },
)
def reset_attention_mask(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.pretraining_dataset or not getattr(ctx.dataset, "reset_attention_mask", False):
        return None
    if getattr(ctx.dataset, "create_attention_mask", True) and ctx.dataset_mask_honoured:
        return []
    return [
        Violation(
            {
                "dataset.reset_attention_mask": True,
                "dataset.create_attention_mask": getattr(ctx.dataset, "create_attention_mask", True),
                "dataset.skip_getting_attention_mask_from_dataset": getattr(
                    ctx.dataset, "skip_getting_attention_mask_from_dataset", True
                ),
            },
            f"the per-document mask never applies: {_mask_dropped_reason(ctx)}; tokens attend to earlier "
            "documents of their row (in Megatron-Bridge 0.6.2 documents are isolated only in packed SFT rows)",
            assignments={"dataset.reset_attention_mask": False},
        )
    ]


#: position embeddings that read position_ids (megatron/core/models/gpt/gpt_model.py _preprocess: the learned
#: embedding adds them, mRoPE rotates by them); RoPE and YaRN rotate by 0..S-1 whatever position_ids hold
_READS_POSITION_IDS = ("learned_absolute", "mrope")


@rule(
    "pretraining.reset_position_ids",
    "dataset.reset_position_ids has no effect on RoPE / YaRN models (positions come from the row, not the ids).",
    severity=ADVISORY,
    evidence=(
        "megatron/core/datasets/gpt_dataset.py _get_ltor_masks_and_position_ids restarts position_ids after each "
        "EOD; megatron/core/models/gpt/gpt_model.py GPTModel._preprocess builds rotary embeddings from the sequence "
        "length only (RotaryEmbedding.forward(max_seq_len, offset, packed_seq, cp_group) takes no position ids) and "
        "the embedding adds position_ids only for learned_absolute; mRoPE is the one rotary type that reads them."
    ),
    reads={"dataset.reset_position_ids": OPTIONAL_BOOL, "model.position_embedding_type": OPTIONAL_NAME},
)
def reset_position_ids(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.pretraining_dataset or not getattr(ctx.dataset, "reset_position_ids", False):
        return None
    kind = getattr(ctx.model, "position_embedding_type", "learned_absolute")
    if kind in _READS_POSITION_IDS:
        return []
    return [
        Violation(
            {"dataset.reset_position_ids": True, "model.position_embedding_type": kind},
            f"{kind} position encoding never reads position_ids: every document continues its row's positions "
            "whatever the dataset resets",
            assignments={"dataset.reset_position_ids": False},
        )
    ]
