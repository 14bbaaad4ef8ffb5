"""The config fields the recipe mixins derive, read back from a ConfigContainer (shared by the mixin and NeMo-Run
tests)."""

from __future__ import annotations

from typing import Any

FIELDS = [
    "model.seq_length",
    "dataset.seq_length",
    "model.tensor_model_parallel_size",
    "model.sequence_parallel",
    "model.context_parallel_size",
    "model.cp_comm_type",
    "model.hierarchical_context_parallel_sizes",
    "model.calculate_per_token_loss",
    "ddp.average_in_collective",
    "model.cuda_graph_impl",
    "train.micro_batch_size",
    "train.global_batch_size",
    "dataset.enable_offline_packing",
    "dataset.offline_packing_specs.packed_sequence_size",
    "dataset.offline_packing_specs.pad_seq_to_mult",
    "dataset.offline_packing_specs.pad_cu_seqlens",
    "dataset.dataset_kwargs",
]


def snapshot(cfg: Any) -> dict[str, Any]:
    from megatron.bridge.utils.cuda_graph import cuda_graph_module_names

    from mbridge_seqpack.config_paths import get_path

    out = {path: get_path(cfg, path) for path in FIELDS}
    out["cuda_graph_modules"] = cuda_graph_module_names(cfg.model)
    return out
