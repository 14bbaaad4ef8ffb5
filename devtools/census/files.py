"""The installed files the census scans, and why each is on the path packed, variable-length or CP-split data
takes (data -> loader -> step -> model -> schedule -> loss). Paths are relative to ``site-packages``.

A file listed with ``only`` is on the path through those functions (qualname prefixes) alone; the rest of such a
file (version probes, checkpoint helpers, process-group getters) is left out, and :data:`LEFT_OUT` says what else
was left out of the path and why.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PathFile", "PATH_FILES", "LEFT_OUT", "site_packages", "package_of"]


@dataclass(frozen=True)
class PathFile:
    """One scanned file: its path under site-packages, the stage of the path it serves, and why."""

    path: str
    stage: str
    why: str
    only: tuple[str, ...] = ()


def _f(path: str, stage: str, why: str, only: tuple[str, ...] = ()) -> PathFile:
    return PathFile(path, stage, why, only)


MB = "megatron/bridge/"
MC = "megatron/core/"
TE = "transformer_engine/pytorch/"

#: the stages, in the order data flows through them (the doc's sections)
STAGES = (
    "data",
    "loader",
    "step",
    "rope",
    "attention",
    "cp",
    "tp",
    "moe",
    "mtp",
    "ssm",
    "schedule",
    "graphs",
    "quant",
    "loss",
)

PATH_FILES: tuple[PathFile, ...] = (
    # -- dataset builders and collates -----------------------------------------------------------------------
    _f(MB + "data/builders/gpt_sft.py", "data", "GPT SFT builder: packed prep, packed / JSONL split build"),
    _f(MB + "data/datasets/gpt_sft.py", "data", "GPTSFTDataset / GPTSFTChatDataset: unpacked variable-length rows"),
    _f(MB + "data/datasets/utils.py", "data", "the GPT SFT memmap reader, samples mapping and chat preprocessing"),
    _f(MB + "data/packing/gpt_sft.py", "data", "GPTSFTPackedDataset: packed rows, cu_seqlens, collate"),
    _f(MB + "data/packing/parquet.py", "data", "GPTSFTPackedParquetDataset: the packed Parquet reader"),
    _f(MB + "data/packing/offline.py", "data", "offline prep: tokenize, pack, write the packed split"),
    _f(MB + "data/packing/algorithms.py", "data", "offline packing algorithms (first-fit, histogram)"),
    _f(MB + "data/packing/paths.py", "data", "packed path resolution (directory, glob, file)"),
    _f(MB + "data/packing/config.py", "data", "PackedSequenceSpecs (offline_packing_specs)"),
    _f(MB + "data/packing/in_batch.py", "data", "in-batch packing of VLM micro batches (collate or step)"),
    _f(MB + "data/builders/direct_hf_sft.py", "data", "VLM: DirectHF SFT builder (collate padding, packing)"),
    _f(MB + "data/builders/mock_vlm_sft.py", "data", "VLM: mock VLM builder (collate padding)"),
    _f(MB + "data/builders/energon.py", "data", "Energon builder (online packing buffer)"),
    _f(MB + "data/datasets/direct_sft.py", "data", "VLM: DirectHF dataset"),
    _f(MB + "data/collators/registry.py", "data", "VLM: the collate registry (family -> collate)"),
    _f(MB + "data/collators/sequence_padding.py", "data", "VLM: CP/SP padding of collated rows"),
    _f(MB + "data/collators/sft.py", "data", "VLM / text SFT collate"),
    _f(MB + "data/sft_processing.py", "data", "VLM: per-family sample processing before collate"),
    _f(MB + "data/conversation_processing.py", "data", "VLM: conversation tokenization and label masks"),
    _f(MB + "data/energon/base_energon_datamodule.py", "data", "Energon data module"),
    _f(MB + "data/energon/hf_task_encoder.py", "data", "Energon HF task encoder (packing hooks)"),
    _f(MB + "data/energon/task_encoder_utils.py", "data", "Energon task-encoder helpers"),
    _f(MB + "models/qwen_vl/data/energon.py", "data", "Qwen-VL Energon task encoder"),
    _f(MB + "models/qwen_vl/data/collate_fn.py", "data", "VLM collate: Qwen2.5-VL / Qwen3-VL (registry)"),
    _f(MB + "models/qwen_omni/data/collate_fn.py", "data", "VLM collate: Qwen3-Omni (registry)"),
    _f(MB + "models/nemotron_vl/data/collate_fn.py", "data", "VLM collate: Nemotron Nano VL v2 (registry)"),
    _f(MB + "models/nemotron_omni/data/collate_fn.py", "data", "VLM collate: Nemotron Omni (registry)"),
    _f(MB + "models/ministral3/data/collate_fn.py", "data", "VLM collate: Ministral-3 / Pixtral (registry)"),
    _f(MB + "models/gemma_vl/data/collate_fn.py", "data", "VLM collate: Gemma-3 / Gemma-4 VL (registry)"),
    _f(MB + "models/qwen_audio/data/collate_fn.py", "data", "audio-LM collate: Qwen2-Audio (registry)"),
    _f(MB + "models/glm_vl/data/collate_fn.py", "data", "VLM collate: GLM-4.5V (registry)"),
    _f(MB + "models/kimi_vl/data/collate_fn.py", "data", "VLM collate: Kimi-K2.5-VL (registry)"),
    _f(MC + "datasets/gpt_dataset.py", "data", "pretraining GPTDataset: document masking, reset ids, masks"),
    _f(MC + "datasets/data_schedule.py", "data", "hybrid-CP data iterator (rerouted samples)"),
    # -- loaders and samplers ----------------------------------------------------------------------------------
    _f(MB + "data/loaders.py", "loader", "data loaders and iterators for train / valid"),
    _f(MB + "data/samplers.py", "loader", "Megatron samplers (single, batch, cyclic)"),
    _f(MB + "data/batch_utils.py", "loader", "finetuning batch preparation (global-batch width)"),
    _f(MB + "data/utils.py", "loader", "dataset-provider dispatch"),
    _f(MB + "data/base.py", "loader", "dataloader / provider base configs"),
    # -- steps -------------------------------------------------------------------------------------------------
    _f(MB + "training/gpt_step.py", "step", "gpt_step: batch, PackedSeqParams, CP split, loss function"),
    _f(MB + "training/vlm_step.py", "step", "vlm_step: VLM batch, in-batch packing at the step, CP split"),
    _f(MB + "training/llava_step.py", "step", "LLaVA step"),
    _f(MB + "models/qwen_vl/qwen3_vl_step.py", "step", "Qwen3-VL / Qwen3.5-VL step"),
    _f(MB + "training/utils/packed_seq_utils.py", "step", "PackedSeqParams from a packed batch"),
    _f(MB + "training/utils/padding_utils.py", "step", "padding helpers of the steps"),
    _f(MC + "packed_seq_params.py", "step", "PackedSeqParams"),
    _f(MB + "training/train.py", "step", "train loop: forward_backward_func(seq_length), full-iteration graphs"),
    _f(MB + "training/eval.py", "step", "evaluation loop over the validation split"),
    _f(MC + "models/gpt/gpt_model.py", "step", "GPTModel.forward: embeddings, RoPE, decoder, loss"),
    # -- RoPE --------------------------------------------------------------------------------------------------
    _f(MC + "models/common/embeddings/rope_utils.py", "rope", "RoPE application, THD and CP paths"),
    _f(MC + "models/common/embeddings/rotary_pos_embedding.py", "rope", "rotary / multimodal rotary embeddings"),
    _f(MC + "models/common/embeddings/yarn_rotary_pos_embedding.py", "rope", "YaRN RoPE"),
    _f(MC + "models/common/embeddings/language_model_embedding.py", "rope", "token / position embeddings"),
    _f(MC + "fusions/fused_mla_yarn_rope_apply.py", "rope", "MLA fused YaRN RoPE (THD)"),
    _f(TE + "attention/rope.py", "rope", "TE fused RoPE (sbhd / bshd / thd, CP)"),
    _f(MB + "models/qwen_vl/modelling_qwen3_vl/rope.py", "rope", "Qwen3-VL mRoPE position ids (packed)"),
    # -- attention ---------------------------------------------------------------------------------------------
    _f(MC + "transformer/attention.py", "attention", "Megatron-Core Attention / SelfAttention forward"),
    _f(MC + "transformer/dot_product_attention.py", "attention", "Megatron-Core local core attention"),
    _f(MC + "transformer/multi_latent_attention.py", "attention", "MLA (DeepSeek) attention, THD"),
    _f(MC + "extensions/transformer_engine.py", "attention", "TE wrappers: TEDotProductAttention, TE linears"),
    _f(TE + "attention/dot_product_attention/dot_product_attention.py", "attention", "TE DotProductAttention"),
    _f(TE + "attention/dot_product_attention/utils.py", "attention", "TE backend selection, THD helpers"),
    _f(TE + "attention/dot_product_attention/backends.py", "attention", "TE flash / fused / unfused backends"),
    _f(TE + "attention/dot_product_attention/softmax.py", "attention", "TE unfused-backend softmax"),
    _f(TE + "cpp_extensions/fused_attn.py", "attention", "TE fused_attn_fwd / bwd Python wrappers"),
    _f(MB + "models/gemma/gemma2_provider.py", "attention", "Gemma-2 core attention (model-specific)"),
    _f(MB + "models/gemma/gemma3_provider.py", "attention", "Gemma-3 provider (sliding-window layers, RoPE)"),
    _f(MB + "models/qwen_vl/modelling_qwen3_vl/attention.py", "attention", "Qwen3-VL attention (model-specific)"),
    _f(MB + "models/qwen_vl/modelling_qwen3_vl/model.py", "attention", "Qwen3-VL model forward (packed, CP)"),
    _f(MB + "models/qwen_vl/modelling_qwen3_vl/text_model.py", "attention", "Qwen3-VL text model"),
    _f(MB + "models/qwen_vl/modelling_qwen3_vl/transformer_block.py", "attention", "Qwen3-VL decoder block"),
    _f(MB + "models/qwen_vl/modelling_qwen3_vl/utils.py", "attention", "Qwen3-VL packing / CP helpers"),
    _f(MB + "models/qwen_vl/modelling_qwen3_vl/vision_model.py", "attention", "Qwen3-VL vision encoder"),
    _f(MB + "models/qwen_vl/modeling_qwen25_vl.py", "attention", "Qwen2.5-VL model"),
    # -- CP ----------------------------------------------------------------------------------------------------
    _f(
        MC + "utils.py",
        "cp",
        "the CP partition (THD and BSHD) and the TP broadcast of packed batches",
        (
            "get_batch_on_this_tp_rank",
            "_get_batch_on_this_cp_rank_per_document_balancing",
            "_get_batch_on_this_cp_rank_per_sequence_balancing",
            "_merge_cu_seqlens_across_micro_batch",
            "flatten_batch_for_packed_sequences",
            "get_batch_on_this_cp_rank",
        ),
    ),
    _f(TE + "attention/dot_product_attention/context_parallel.py", "cp", "TE context parallel (p2p, a2a, ag)"),
    _f(
        MC + "parallel_state.py",
        "cp",
        "CP / hierarchical-CP / hybrid-DP-CP groups the CP path runs on",
        (
            "initialize_model_parallel",
            "create_hierarchical_groups",
            "create_hybrid_dp_cp_groups",
            "get_context_parallel_group",
            "get_hierarchical_context_parallel_groups",
            "get_hybrid_data_context_parallel_groups",
        ),
    ),
    _f(MC + "pipeline_parallel/hybrid_cp_schedule.py", "cp", "hybrid context parallel: balanced CP scheduler"),
    _f(MC + "models/multimodal/context_parallel.py", "cp", "multimodal (LLaVA) CP padding"),
    # -- TP / SP -----------------------------------------------------------------------------------------------
    _f(MC + "tensor_parallel/mappings.py", "tp", "SP scatter / gather along the sequence dimension"),
    _f(MB + "training/comm_overlap.py", "tp", "TP comm overlap (userbuffers) configuration"),
    _f(TE + "module/base.py", "tp", "TE userbuffers init, module forward preparation"),
    _f(TE + "module/linear.py", "tp", "TE Linear (SP gathers, userbuffers, FP8 inputs)"),
    _f(TE + "module/layernorm_linear.py", "tp", "TE LayerNormLinear (SP, userbuffers, FP8 inputs)"),
    _f(TE + "module/layernorm_mlp.py", "tp", "TE LayerNormMLP (SP, userbuffers, FP8 inputs)"),
    _f(TE + "module/_common.py", "tp", "TE module helpers"),
    _f(
        TE + "distributed.py",
        "tp",
        "TE SP all-gather / reduce-scatter (FP8, MXFP8, NVFP4 inputs)",
        (
            "reduce_scatter_along_first_dim",
            "_all_gather_fp8",
            "_start_all_gather_fp8_blockwise",
            "_swap_first_dims",
            "_all_gather_nvfp4",
            "_all_gather_mxfp8",
            "gather_along_first_dim",
        ),
    ),
    # -- MoE ---------------------------------------------------------------------------------------------------
    _f(MC + "transformer/moe/router.py", "moe", "MoE router: scores, aux losses over the tokens"),
    _f(MC + "transformer/moe/moe_utils.py", "moe", "MoE permute / routing / aux-loss helpers"),
    _f(MC + "transformer/moe/token_dispatcher.py", "moe", "MoE token dispatchers (allgather, alltoall, flex)"),
    _f(MC + "transformer/moe/moe_layer.py", "moe", "MoE layer forward"),
    _f(MC + "transformer/moe/experts.py", "moe", "MoE experts (grouped GEMM over token counts)"),
    _f(MC + "transformer/moe/fused_a2a.py", "moe", "DeepEP / HybridEP fused all-to-all"),
    _f(MC + "transformer/moe/shared_experts.py", "moe", "shared experts (overlap)"),
    _f(TE + "module/grouped_linear.py", "moe", "TE GroupedLinear (expert GEMMs over m_splits)"),
    _f(TE + "module/fp8_padding.py", "moe", "TE FP8 padding of expert token counts"),
    _f(TE + "module/fp8_unpadding.py", "moe", "TE FP8 unpadding of expert token counts"),
    _f(TE + "permutation.py", "moe", "TE fused MoE permute / unpermute"),
    _f(TE + "router.py", "moe", "TE fused router top-k / aux loss"),
    # -- MTP ---------------------------------------------------------------------------------------------------
    _f(MC + "transformer/multi_token_prediction.py", "mtp", "multi-token prediction (packed label roll)"),
    # -- Mamba / hybrid ----------------------------------------------------------------------------------------
    _f(MC + "ssm/mamba_mixer.py", "ssm", "Mamba mixer (packed cu_seqlens, CP)"),
    _f(MC + "ssm/mamba_layer.py", "ssm", "Mamba layer"),
    _f(MC + "ssm/mamba_context_parallel.py", "ssm", "Mamba context parallel"),
    _f(MC + "ssm/ops/ssd_combined.py", "ssm", "Mamba SSD kernel wrapper (varlen)"),
    _f(MC + "ssm/ops/ssd_chunk_scan.py", "ssm", "Mamba SSD chunk scan"),
    _f(MC + "ssm/ops/ssd_chunk_state.py", "ssm", "Mamba SSD chunk state (varlen)"),
    _f(MC + "ssm/ops/ssd_bmm.py", "ssm", "Mamba SSD bmm"),
    _f(MC + "ssm/ops/ssd_state_passing.py", "ssm", "Mamba SSD state passing"),
    _f(MC + "ssm/ops/causal_conv1d_varlen.py", "ssm", "Mamba causal conv1d over packed sequences"),
    _f(MC + "ssm/gated_delta_net/gdn.py", "ssm", "gated delta net (Qwen3-Next), THD"),
    _f(MC + "ssm/gated_delta_net/common.py", "ssm", "gated delta net helpers (cu_seqlens, CP)"),
    _f(MC + "models/hybrid/hybrid_model.py", "ssm", "hybrid (Mamba) model forward"),
    _f(MC + "models/hybrid/hybrid_block.py", "ssm", "hybrid block"),
    # -- schedules and p2p -------------------------------------------------------------------------------------
    _f(MC + "pipeline_parallel/schedules.py", "schedule", "forward / backward schedules, tensor shapes"),
    _f(MC + "pipeline_parallel/p2p_communication.py", "schedule", "p2p of activations (variable shapes)"),
    _f(MC + "pipeline_parallel/utils.py", "schedule", "schedule helpers"),
    _f(MC + "pipeline_parallel/combined_1f1b.py", "schedule", "combined 1F1B (EP a2a overlap) schedule"),
    _f(MC + "transformer/transformer_block.py", "schedule", "decoder block (per-layer graphs, recompute)"),
    _f(MC + "transformer/transformer_layer.py", "schedule", "transformer layer (TE graph replay)"),
    # -- CUDA graphs -------------------------------------------------------------------------------------------
    _f(MC + "full_cuda_graph.py", "graphs", "FullCudaGraphWrapper: static buffers, capture, replay"),
    _f(MC + "transformer/cuda_graphs.py", "graphs", "per-layer graphs: local CudaGraphManager, TE helper"),
    _f(TE + "graph.py", "graphs", "TE make_graphed_callables, Graphed replay"),
    # -- FP8 / MXFP8 / NVFP4 -----------------------------------------------------------------------------------
    _f(MC + "fp8_utils.py", "quant", "Megatron-Core FP8 context, padding helpers"),
    _f(MC + "fp4_utils.py", "quant", "Megatron-Core FP4 context"),
    _f(TE + "utils.py", "quant", "TE utils: FP8 dim checks, divisibility"),
    _f(TE + "quantization.py", "quant", "TE quantization state, recipes, autocast"),
    _f(TE + "cpp_extensions/gemm.py", "quant", "TE general_gemm (FP8 / MXFP8 / NVFP4 operands)"),
    _f(TE + "tensor/float8_tensor.py", "quant", "FP8 quantizer / tensor"),
    _f(TE + "tensor/mxfp8_tensor.py", "quant", "MXFP8 quantizer / tensor"),
    _f(TE + "tensor/nvfp4_tensor.py", "quant", "NVFP4 quantizer / tensor"),
    _f(TE + "tensor/float8_blockwise_tensor.py", "quant", "FP8 blockwise quantizer / tensor"),
    _f(TE + "tensor/storage/float8_tensor_storage.py", "quant", "FP8 tensor storage"),
    _f(TE + "tensor/storage/mxfp8_tensor_storage.py", "quant", "MXFP8 tensor storage"),
    _f(TE + "tensor/storage/nvfp4_tensor_storage.py", "quant", "NVFP4 tensor storage"),
    _f(TE + "tensor/storage/float8_blockwise_tensor_storage.py", "quant", "FP8 blockwise tensor storage"),
    # -- loss and gradient checks ------------------------------------------------------------------------------
    _f(MB + "training/losses.py", "loss", "masked next-token loss and its NaN / spike checks"),
    _f(MC + "tensor_parallel/cross_entropy.py", "loss", "vocab-parallel cross entropy"),
    _f(
        MC + "rerun_state_machine.py",
        "loss",
        "the NaN / Inf / spike checks the loss and gradient validations raise through",
        ("RerunStateMachine.validate_result", "RerunStateMachine.is_unexpectedly_large"),
    ),
    _f(
        MC + "distributed/param_and_grad_buffer.py",
        "loss",
        "gradient NaN / Inf / large checks before the DP collective",
        ("_ParamAndGradBucketGroup.check_grads",),
    ),
)

#: what stayed out of the path, and why (the doc's last section)
LEFT_OUT: tuple[tuple[str, str], ...] = (
    (
        MB + "training/config.py",
        "the config-time checks themselves (ConfigContainer.validate / finalize): a failure there is what the "
        "census calls `megatron_validates` for the run-time site it protects, raised before any GPU work",
    ),
    (
        MB + "diffusion/, models/*/ model code other than Qwen3-VL's and Gemma's (omni, audio, ASR, Step, "
        "ERNIE-VL, EXAONE, Kimi, MiniMax, GLM-V modelling; their own steps)",
        "model families with their own forward passes and steps; the census scans every registered VLM collate, "
        "and the model code of the GPT, Qwen-VL, LLaVA and Gemma paths the packed recipes run",
    ),
    (
        MB + "data/datasets/fim_dataset.py",
        "fill-in-the-middle pretraining transform: no packing, CP or variable-length option",
    ),
    (
        MC + "inference/, models/*/inference, transformer/moe/token_dispatcher_inference.py, "
        "TE attention/inference.py",
        "inference only: training passes no inference context",
    ),
    (
        MC + "pipeline_parallel/{bridge_communicator,multimodule_communicator,fine_grained_activation_offload}.py",
        "MIMO multi-module pipelines and activation offloading: no packing- or CP-specific input",
    ),
    (
        MC + "transformer/moe/{paged_stash,router_trace,router_replay,upcycling_utils,moe_logging}.py",
        "MoE activation stash, routing traces / replays, checkpoint upcycling and logging: no packed-data input",
    ),
    (
        MC + "ssm/ops/intermediate_extraction.py, ssm/triton_cache_manager.py",
        "Mamba inference state extraction and the Triton cache: not on the training path",
    ),
    (
        MC + "transformer/experimental_attention_variant/ (DSA, absorbed MLA)",
        "experimental attention variants (DeepSeek sparse attention) no Megatron-Bridge 0.6.2 recipe selects",
    ),
    (
        TE + "tensor/utils.py, tensor/{grouped,hybrid,identity}_tensor.py and their storage",
        "master-weight casting and grouped / hybrid / identity tensors: weights and optimizer state, not the "
        "shape or values of packed data",
    ),
    (
        TE + "attention/multi_head_attention.py, attention/dot_product_attention/flex_attention.py",
        "TE's own MultiheadAttention and flex attention: Megatron-Core builds TEDotProductAttention only",
    ),
    (
        "compiled code: transformer_engine_torch (C++ / CUDA), Triton kernels, cuDNN, NCCL",
        "not Python: their checks (NVTE_CHECK, tl.device_assert) are invisible to the AST; the ones the rules "
        "depend on are listed by hand in the doc",
    ),
)


def site_packages() -> Path:
    """The site-packages directory holding the installed Megatron and TE (found without importing them)."""
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("megatron is not installed: the census scans the installed Megatron-Bridge and -Core")
    for location in spec.submodule_search_locations:
        if (Path(location) / "bridge").is_dir():
            return Path(location).parent
    raise RuntimeError("megatron.bridge is not installed next to megatron.core")


def package_of(path: str) -> str:
    """``megatron-bridge``, ``megatron-core`` or ``transformer-engine``: the package a path belongs to."""
    if path.startswith(MB):
        return "megatron-bridge"
    if path.startswith(MC):
        return "megatron-core"
    return "transformer-engine"
