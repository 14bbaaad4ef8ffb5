"""The small GPT SFT recipe the launch-shaped scripts build (Megatron-Bridge objects only, no mbridge_seqpack)."""

from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.recipes.common import _sft_common


def recipe():
    cfg = _sft_common()
    cfg.model = GPTModelProvider(
        num_layers=2, hidden_size=128, num_attention_heads=4, seq_length=2048, vocab_size=1024
    )
    cfg.dataset.seq_length = 2048
    cfg.train.global_batch_size = 8
    cfg.train.micro_batch_size = 1
    return cfg
