"""A ~100M-parameter GPT, offline packed at 4k, for single-GPU smoke runs on the embedded data."""

from mbridge_seqpack.recipes.building_blocks import recipe


@recipe(
    "small_gpt_smoke_4k",
    model="GPT ~100M",
    mode="offline packed",
    world_size=1,
    description="12-layer 768-hidden GPT, 4k packed rows, one GPU; trains on the embedded corpus.",
)
def small_gpt_smoke_4k(dataset_root=None, tokenizer_model=None):
    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import OfflinePacking
    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

    cfg = sft_base(
        small_gpt_provider(4096),
        seq_length=4096,
        global_batch_size=8,
        train_iters=100,
        dataset_root=dataset_root,
        tokenizer_model=tokenizer_model,
    )
    cfg.checkpoint.pretrained_checkpoint = None
    return apply(cfg, OfflinePacking(pack_size=4096))
