"""A config per guarded census mechanism (devtools/census/silent.py): the base fixture, the world size and the
changes under which the mechanism's site is reached, so the census test can run the real rules on it and see one of
the mechanism's guarding rules report it. Where building the config takes files (a pack, a checkpoint), the case
names the test that builds it and runs the rule (``proven_by``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["CensusCase", "CASES"]


@dataclass(frozen=True)
class CensusCase:
    """``base`` (a conftest fixture name) at ``world``, then ``values`` (dotted path -> value) and ``change``."""

    base: str = "packed_cfg"
    world: int = 8
    values: dict[str, Any] = field(default_factory=dict)
    change: Callable[[Any], None] | None = None
    env: dict[str, str] = field(default_factory=dict)
    proven_by: str = ""  # tests/<file>.py::<test>, for a case whose config needs files on disk


def _hybrid_mamba(cfg: Any) -> None:
    from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider

    cfg.model = HybridModelProvider(
        hybrid_layer_pattern="M*M-", hidden_size=256, num_attention_heads=4, mamba_num_heads=8, seq_length=4096
    )


def _full_iteration(cfg: Any) -> None:
    from megatron.bridge.utils.cuda_graph import set_full_iteration_cuda_graph

    set_full_iteration_cuda_graph(cfg.model)
    cfg.rerun_state_machine.check_for_nan_in_loss = False
    cfg.dataset.offline_packing_specs.pad_cu_seqlens = True  # fixed shapes: what the graph replays
    cfg.dataset.dataset_kwargs["pad_to_max_length"] = True


def _te_graphs(cfg: Any) -> None:
    from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules

    cfg.model.cuda_graph_impl = "transformer_engine"
    set_cuda_graph_modules(cfg.model, ["attn"])


MOE = {"model.num_moe_experts": 4, "model.moe_router_topk": 2, "model.moe_aux_loss_coeff": 0.01}
CP2 = {"model.context_parallel_size": 2, "model.calculate_per_token_loss": True, "ddp.average_in_collective": False}
TP2_SP = {"model.tensor_model_parallel_size": 2, "model.sequence_parallel": True}

CASES: dict[str, CensusCase] = {
    "reset_attention_mask dropped": CensusCase("pretrain_cfg", values={"dataset.reset_attention_mask": True}),
    "reset_position_ids ignored by RoPE": CensusCase("pretrain_cfg", values={"dataset.reset_position_ids": True}),
    "create_attention_mask built and dropped": CensusCase(
        "pretrain_cfg", values={"model.seq_length": 32768, "dataset.seq_length": 32768}
    ),
    "inter_document_masking through the legacy cu_seqlens path": CensusCase(
        "pretrain_cfg", values={"dataset.inter_document_masking": True}
    ),
    # packed rows: the census lists this mechanism with the packing field, so its case is a packed MoE config
    "MoE router counts padding tokens": CensusCase(values=MOE),
    "MTP labels rolled on the logical cu_seqlens of padded packs": CensusCase(
        values={"model.mtp_num_layers": 1, "dataset.offline_packing_specs.pad_seq_to_mult": 16}
    ),
    "Mamba over packed rows without seq_idx": CensusCase(change=_hybrid_mamba),
    "MTP labels rolled across sequences under CP": CensusCase(
        values={**CP2, "dataset.offline_packing_specs.pad_seq_to_mult": 4, "model.mtp_num_layers": 1}
    ),
    "resume after re-packing": CensusCase(
        proven_by="tests/rules/test_mechanism_evidence.py::test_resuming_over_a_pack_written_after_the_checkpoint_is_reported"
    ),
    "a stale or foreign pack at the builder's default path": CensusCase(
        proven_by="tests/artifact/test_artifacts.py::test_stale_pack_rule"
    ),
    "THD CP partition (tex.thd_get_partitioned_indices)": CensusCase(values=CP2),
    "FP8 GEMM operand alignment (cuBLASLt)": CensusCase(values={"mixed_precision": "bf16_with_mxfp8_mixed", **TP2_SP}),
    "MXFP8 quantizer block size (quantizer.cpp)": CensusCase(
        values={"mixed_precision": "bf16_with_mxfp8_mixed", **TP2_SP}
    ),
    "NVFP4 quantizer block size": CensusCase(values={"mixed_precision": "bf16_with_nvfp4_mixed", **TP2_SP}),
    "FP8 row widths outside offline packs": CensusCase(
        "unpacked_cfg", values={"mixed_precision": "bf16_with_mxfp8_mixed", **TP2_SP}
    ),
    "userbuffer size (comm_gemm_overlap.cpp copy_into_buffer)": CensusCase(
        values={**TP2_SP, "model.tp_comm_overlap": True}
    ),
    "static-buffer copies of graphed inputs (Tensor.copy_)": CensusCase(change=_te_graphs),
    "host synchronization inside a stream capture (CUDA)": CensusCase(
        change=_full_iteration, env={"MBRIDGE_SEQPACK_MODE": "error"}
    ),
    "attention kernels (cuDNN / flash-attn)": CensusCase(
        proven_by="tests/analysis/test_attention_backend.py::test_no_declared_gpu_asks_each_generation"
    ),
    "HybridEP uneven token counts (DeepEP C++)": CensusCase(
        "unpacked_cfg",
        values={
            "model.num_moe_experts": 4,
            "model.moe_router_topk": 2,
            "model.expert_model_parallel_size": 2,
            "model.moe_token_dispatcher_type": "flex",
            "model.moe_flex_dispatcher_backend": "hybridep",
        },
    ),
    "dist.eval_context_parallel_size consumed nowhere": CensusCase(
        values={**CP2, "dist.eval_context_parallel_size": 4}
    ),
}
