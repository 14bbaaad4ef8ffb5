"""Llama-3-8B SFT, offline packed at 8k (the embedded default), and its CUDA-graph variant."""

from mbridge_seqpack.recipes.building_blocks import LLAMA3_CONTEXT, recipe


@recipe(
    "llama3_8b_sft_packed_8k",
    model="Llama-3-8B",
    mode="offline packed",
    world_size=8,
    context_window=LLAMA3_CONTEXT,
    description="Full SFT, offline packed 8k rows, TP2+SP, DP4 on 8 GPUs (the embedded default: global batch 16, "
    "evaluation batch 4, which its packed splits hold).",
)
def llama3_8b_sft_packed_8k(dataset_root=None, tokenizer_model=None):
    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import OfflinePacking, Parallelism
    from mbridge_seqpack.recipes.building_blocks import llama3_8b_provider, sft_base

    cfg = sft_base(
        llama3_8b_provider(),
        seq_length=8192,
        global_batch_size=16,
        dataset_root=dataset_root,
        tokenizer_model=tokenizer_model,
    )
    cfg.validation.eval_global_batch_size = 4  # one row per DP rank: the embedded validation split packs into 6
    return apply(cfg, Parallelism(tensor=2), OfflinePacking(pack_size=8192))


@recipe(
    "llama3_8b_sft_packed_8k_cuda_graphs",
    model="Llama-3-8B",
    mode="offline packed + CUDA graphs",
    world_size=8,
    context_window=LLAMA3_CONTEXT,
    description="The 8k packed recipe with TE per-layer CUDA graphs of the MLP, the path Megatron-Core replays "
    "over packed rows (attention runs eagerly on the packed boundaries).",
)
def llama3_8b_sft_packed_8k_cuda_graphs(dataset_root=None, tokenizer_model=None):
    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import OfflinePacking, PackedCudaGraphs, Parallelism
    from mbridge_seqpack.recipes.building_blocks import llama3_8b_provider, sft_base

    cfg = sft_base(
        llama3_8b_provider(),
        seq_length=8192,
        global_batch_size=16,
        dataset_root=dataset_root,
        tokenizer_model=tokenizer_model,
    )
    cfg.validation.eval_global_batch_size = 4
    cfg.rerun_state_machine.check_for_nan_in_loss = False
    return apply(cfg, Parallelism(tensor=2), OfflinePacking(pack_size=8192), PackedCudaGraphs())
