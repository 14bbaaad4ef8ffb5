"""Qwen3-8B SFT, offline packed at 16k with CP2."""

from mbridge_seqpack.recipes.building_blocks import QWEN3_CONTEXT, recipe


@recipe(
    "qwen3_8b_sft_16k_cp2",
    model="Qwen3-8B",
    mode="offline packed, long context",
    world_size=8,
    context_window=QWEN3_CONTEXT,
    description="16k packed rows, CP2 x TP2 (SP), DP2 on 8 GPUs.",
)
def qwen3_8b_sft_16k_cp2(dataset_root=None, tokenizer_model=None):
    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import LongContext, OfflinePacking, Parallelism
    from mbridge_seqpack.recipes.building_blocks import qwen3_8b_provider, sft_base

    cfg = sft_base(
        qwen3_8b_provider(),
        seq_length=16384,
        global_batch_size=16,
        dataset_root=dataset_root,
        tokenizer_model=tokenizer_model,
    )
    return apply(cfg, Parallelism(tensor=2), LongContext(16384, 2), OfflinePacking())
