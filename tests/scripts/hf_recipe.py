"""A small GPT SFT recipe reading a local JSON file as a Hugging Face dataset (``dataset.hf_dataset``)."""


def hf_smoke():
    from megatron.bridge.data.builders.gpt_sft import _default_gpt_sft_preprocessing
    from megatron.bridge.data.sources.hf import HFDatasetSourceConfig

    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import OfflinePacking
    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

    cfg = sft_base(small_gpt_provider(4096), seq_length=4096, global_batch_size=8)
    cfg.dataset.dataset_root = None
    cfg.dataset.hf_dataset = HFDatasetSourceConfig(
        path_or_dataset="json", load_kwargs={"data_files": "set-me.jsonl"}, split="train"
    )
    cfg.dataset.preprocessing = _default_gpt_sft_preprocessing()
    cfg.dataset.do_validation = False
    cfg.dataset.do_test = False
    return apply(cfg, OfflinePacking(pack_size=4096))
