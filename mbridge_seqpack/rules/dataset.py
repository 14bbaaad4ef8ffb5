"""``dataset.*``: the dense attention mask a pretraining ``GPTDataset`` builds per sample, and the host memory it
takes."""

from __future__ import annotations

from mbridge_seqpack.errors import ADVISORY, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.field_types import BOOL, OPTIONAL_NON_NEGATIVE_INT, POSITIVE_INT, UNCHECKED
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.shared import _mask_dropped_reason

#: processes per node that build a dataset mask: one per GPU of an 8-GPU node (every rank builds its own loaders,
#: training/setup.py setup_data_iterators), times its dataloader workers (the main process when there are none)
GPUS_PER_NODE = 8


#: host memory per node the masks may take before the advisory speaks: beyond waste, a real share of a node's RAM
MASK_ADVISORY_BYTES = 64 * 2**30


#: the host memory of the largest node the verdict assumes (2 TiB: a DGX H100/H200/B200's system memory); a mask need
#: beyond it fails on any such machine, so the advisory's own figure proves the failure and it is an error. A
#: constant, not an environment variable: the verdict depends on the fields it names and nothing else.
NODE_HOST_BYTES = 2 * 2**40


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
        paths = [w for w in words if not _parses_as_number(str(w))]
    return max(1, len(paths) if paths else 1)


def _parses_as_number(text: str) -> bool:
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
    reads={
        "dataset.blend": UNCHECKED,
        "dataset.blend_per_split": UNCHECKED,
        "dataset.create_attention_mask": BOOL,
        "dataset.data_path": UNCHECKED,
        "dataset.num_workers": OPTIONAL_NON_NEGATIVE_INT,
        "dataset.seq_length": POSITIVE_INT,
        "dataset.skip_getting_attention_mask_from_dataset": BOOL,
    },
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
