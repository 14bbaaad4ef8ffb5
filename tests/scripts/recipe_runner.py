"""A training script shaped like Megatron-Bridge's recipe runner; it never imports mbridge_seqpack."""

import sys

from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.recipes.common import _sft_common
from megatron.bridge.training.config import runtime_config_update
from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides


def recipe():
    cfg = _sft_common()
    cfg.model = GPTModelProvider(
        num_layers=2, hidden_size=128, num_attention_heads=4, seq_length=2048, vocab_size=1024
    )
    cfg.dataset.seq_length = 2048
    cfg.train.global_batch_size = 8
    cfg.train.micro_batch_size = 1
    return cfg


cfg = process_config_with_overrides(recipe(), cli_overrides=sys.argv[1:])
runtime_config_update(cfg)  # what pretrain()/finetune() run first
print("accepted")

from megatron.core.full_cuda_graph import FullCudaGraphWrapper  # noqa: E402

print(f"data_read injected: {getattr(FullCudaGraphWrapper.data_read, '__mbridge_seqpack_static_thd__', False)}")
