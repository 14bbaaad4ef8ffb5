"""Qwen2.5-VL-3B SFT with in-batch (collate-time) packing on Megatron-Bridge's synthetic VLM data."""

from mbridge_seqpack.recipes.building_blocks import QWEN25_VL_CONTEXT, recipe


@recipe(
    "qwen25_vl_3b_sft_in_batch_4k",
    model="Qwen2.5-VL-3B",
    mode="in-batch packed",
    world_size=8,
    context_window=QWEN25_VL_CONTEXT,
    description="4k rows, micro batch 4 packed at collate, DP8 on 8 GPUs; synthetic conversations "
    "(set dataset.hf_processor_path to a local processor to train).",
)
def qwen25_vl_3b_sft_in_batch_4k(hf_processor_path="Qwen/Qwen2.5-VL-3B-Instruct"):
    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import InBatchPacking
    from mbridge_seqpack.recipes.building_blocks import qwen25_vl_3b_provider, vlm_sft_base

    cfg = vlm_sft_base(
        qwen25_vl_3b_provider(),
        seq_length=4096,
        global_batch_size=32,
        micro_batch_size=4,
        hf_processor_path=hf_processor_path,
    )
    return apply(cfg, InBatchPacking(micro_batch_size=4))
