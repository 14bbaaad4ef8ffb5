"""Pretraining datasets (Megatron-Core's ``GPTDataset`` through Megatron-Bridge's ``GPTDatasetConfig``): document
masking, per-document positions and the dense attention mask, as Megatron-Bridge 0.6.2's GPT step consumes them."""

from __future__ import annotations

from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import rule

#: processes per node that build a dataset mask: one per GPU of an 8-GPU node (every rank builds its own loaders,
#: training/setup.py setup_data_iterators), times its dataloader workers (the main process when there are none)
GPUS_PER_NODE = 8
#: host memory per node the masks may take before the advisory speaks: beyond waste, a real share of a node's RAM
MASK_ADVISORY_BYTES = 64 * 2**30
#: the host memory of the largest node the verdict assumes (2 TiB: a DGX H100/H200/B200's system memory); a mask need
#: beyond it fails on any such machine, so the advisory's own figure proves the failure and it is an error. A
#: constant, not an environment variable: the verdict depends on the fields it names and nothing else.
NODE_HOST_BYTES = 2 * 2**40


def _mask_dropped_reason(ctx: RuleContext) -> str:
    """Why the dataset's attention mask never reaches an attention that applies it."""
    if not getattr(ctx.dataset, "create_attention_mask", True):
        return "create_attention_mask=False builds no mask at all"
    if getattr(ctx.dataset, "skip_getting_attention_mask_from_dataset", True):
        return (
            "Megatron-Bridge's get_batch drops the dataset's mask (skip_getting_attention_mask_from_dataset=True, "
            "the default)"
        )
    return "Transformer Engine's causal attention ignores attention_mask (it reads one only for padding/arbitrary)"


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


def _blend_size(dataset: object) -> int:
    """Datasets in the training blend (each GPTDataset caches its own mask), 1 for mock data."""
    blend = getattr(dataset, "blend", None)
    per_split = getattr(dataset, "blend_per_split", None)
    if blend is None and isinstance(per_split, (list, tuple)) and per_split:
        blend = per_split[0]  # the training split's blend
    paths = blend[0] if isinstance(blend, (tuple, list)) and blend and isinstance(blend[0], (list, tuple)) else None
    if paths is None and isinstance(getattr(dataset, "data_path", None), (list, str)):
        data_path = dataset.data_path
        words = data_path.split() if isinstance(data_path, str) else list(data_path)
        paths = [w for w in words if not _is_number(str(w))]
    return max(1, len(paths) if paths else 1)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def mask_host_bytes(seq_length: int, workers: int, datasets: int, world_size: int) -> int:
    """Host memory one node spends on dataset attention masks: every mask-building process (each worker, or the
    main process) peaks at 8*S^2 bytes while ``torch.tril(torch.ones((S, S)))`` runs (two float32 S x S tensors),
    then keeps one bool S x S mask per dataset of the blend it has read."""
    processes = min(world_size, GPUS_PER_NODE) * max(1, workers)
    return processes * (8 + datasets) * seq_length**2


@rule(
    "dataset.create_attention_mask",
    "create_attention_mask=True builds an S x S mask in every dataloader worker that Megatron-Bridge then drops.",
    severity=ADVISORY,
    evidence=(
        "megatron/core/datasets/gpt_dataset.py _get_ltor_masks_and_position_ids runs "
        "torch.tril(torch.ones((S, S))) (two float32 S x S tensors) and keeps a bool S x S mask cached per dataset "
        "in every worker (GPTDatasetConfig.create_attention_mask defaults to True; Megatron-Bridge's recipes leave "
        "it); megatron/bridge/training/gpt_step.py get_batch_from_iterator drops it unless "
        "skip_getting_attention_mask_from_dataset=False, and Transformer Engine's causal attention ignores it. "
        "Quadratic host memory: NVIDIA-NeMo/Megatron-Bridge#3555 (RAM ramp to OOM, fixed by "
        "create_attention_mask=False), NVIDIA/Megatron-LM#1657 (worker killed above 90K tokens). Reported from "
        "64 GiB per node (8 ranks x workers); whether a node runs out depends on its memory, so an advisory, and an "
        "error when the figure is beyond a node of 2 TiB (NODE_HOST_BYTES), where every machine runs out."
    ),
)
def create_attention_mask(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.pretraining_dataset or not getattr(ctx.dataset, "create_attention_mask", True):
        return None
    if ctx.dataset_mask_honoured:
        return []  # a non-TE attention applies it
    seq = getattr(ctx.dataset, "seq_length", None) or ctx.model.seq_length
    workers = int(getattr(ctx.dataset, "num_workers", 0) or 0)
    datasets = _blend_size(ctx.dataset)
    need = mask_host_bytes(seq, workers, datasets, ctx.world_size)
    if need < MASK_ADVISORY_BYTES:
        return []
    gib = need / 2**30
    proven = ""
    if need > NODE_HOST_BYTES:
        proven = (
            f"{gib:,.0f} GiB of host memory per node is beyond a node of {NODE_HOST_BYTES // 2**40} TiB: the "
            "dataloader workers run out of memory on any machine"
        )
    return [
        Violation(
            {
                "dataset.create_attention_mask": True,
                "dataset.seq_length": seq,
                "dataset.num_workers": workers,
                "blend datasets": datasets,
                "host GiB per node": round(gib, 1),
            },
            f"each of {min(ctx.world_size, GPUS_PER_NODE) * max(1, workers)} mask-building processes per node "
            f"builds a {seq} x {seq} mask (float32 while built, then one bool copy per dataset): about {gib:.0f} "
            f"GiB of host memory per node for a mask that is never applied: {_mask_dropped_reason(ctx)}",
            assignments={"dataset.create_attention_mask": False},
            proven=proven,
        )
    ]
