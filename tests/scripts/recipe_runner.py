"""A training script shaped like Megatron-Bridge's recipe runner; it never imports mbridge_seqpack."""

import sys

from megatron.bridge.training.config import runtime_config_update
from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

from tests.scripts.tiny_recipe import recipe

cfg = process_config_with_overrides(recipe(), cli_overrides=sys.argv[1:])
runtime_config_update(cfg)  # what pretrain()/finetune() run first
print("accepted")

from megatron.core.full_cuda_graph import FullCudaGraphWrapper  # noqa: E402

print(f"data_read injected: {getattr(FullCudaGraphWrapper.data_read, '__mbridge_seqpack_static_thd__', False)}")
