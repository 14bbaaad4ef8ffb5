"""Llama-3.1-8B long-context SFT: 32k/CP2, 64k/CP4, 128k/CP8, offline packed, TP2 + SP."""

from mbridge_seqpack.recipes.building_blocks import LLAMA31_CONTEXT, recipe


def _long_context(seq_length, cp, global_batch_size, dataset_root, tokenizer_model):
    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import LongContext, OfflinePacking, Parallelism
    from mbridge_seqpack.recipes.building_blocks import llama31_8b_provider, sft_base

    cfg = sft_base(
        llama31_8b_provider(),
        seq_length=seq_length,
        global_batch_size=global_batch_size,
        dataset_root=dataset_root,
        tokenizer_model=tokenizer_model,
    )
    return apply(cfg, Parallelism(tensor=2), LongContext(seq_length, cp), OfflinePacking())


@recipe(
    "llama31_8b_sft_32k_cp2",
    model="Llama-3.1-8B",
    mode="offline packed, long context",
    world_size=16,
    context_window=LLAMA31_CONTEXT,
    description="32k packed rows, CP2 x TP2 (SP), DP4 on 16 GPUs.",
)
def llama31_8b_sft_32k_cp2(dataset_root=None, tokenizer_model=None):
    return _long_context(32768, 2, 16, dataset_root, tokenizer_model)


@recipe(
    "llama31_8b_sft_64k_cp4",
    model="Llama-3.1-8B",
    mode="offline packed, long context",
    world_size=16,
    context_window=LLAMA31_CONTEXT,
    description="64k packed rows, CP4 x TP2 (SP), DP2 on 16 GPUs.",
)
def llama31_8b_sft_64k_cp4(dataset_root=None, tokenizer_model=None):
    return _long_context(65536, 4, 8, dataset_root, tokenizer_model)


@recipe(
    "llama31_8b_sft_128k_cp8",
    model="Llama-3.1-8B",
    mode="offline packed, long context",
    world_size=32,
    context_window=LLAMA31_CONTEXT,
    description="128k packed rows, CP8 x TP2 (SP), DP2 on 32 GPUs.",
)
def llama31_8b_sft_128k_cp8(dataset_root=None, tokenizer_model=None):
    return _long_context(131072, 8, 4, dataset_root, tokenizer_model)
