"""Schedules and p2p, the decoder block and layer, full-iteration and per-layer CUDA graphs (Megatron-Core, TE)."""

from __future__ import annotations

from devtools.census.mapping.common import (
    API_MISUSE,
    CHECKPOINT,
    ENVIRONMENT,
    INFERENCE,
    INVARIANT,
    SPEC_BUILD,
    TE_PINNED,
)
from devtools.census.verdicts import gap, groups, guarded, harmless, site, unreachable, validated

MC = "megatron/core/"
TE = "transformer_engine/pytorch/"

SCHEDULE_CONTRACT = unreachable(
    "call contract: Megatron-Bridge's train / eval loops call get_forward_backward_func()'s schedule with one "
    "model chunk per virtual stage, one data iterator per chunk and a full process-group collection"
)
CG_HELPER_CONTRACT = unreachable(
    "call contract: Megatron-Core's TECudaGraphHelper builds make_graphed_callables' arguments (callables, "
    "sample args from get_layer_static_inputs, the PP order) consistently for every layer"
)
LOCAL_CG = unreachable(
    "Megatron-Core's local per-layer CudaGraphManager: Megatron-Bridge allows cuda_graph_impl='local' only for "
    "full-iteration graphs (utils/cuda_graph.py validate_cuda_graph_configuration, rule cuda_graphs.local_per_layer)"
)
TE_SCOPE_INPUTS = guarded(
    "cuda_graphs.te_scope_inputs",
    "a TE per-layer graph scope whose replay gets non-tensor or missing keyword inputs (e.g. the 'mamba' scope "
    "with packed_seq_params): the computed rule checks each scope's replay inputs for the config",
    ("model.cuda_graph_impl", "model.cuda_graph_modules"),
)
PIPELINE_LAYOUT = validated(
    "TransformerConfig.__post_init__ / Megatron-Bridge's provider finalize: num_layers divisible by PP (and VPP), "
    "uneven first / last stage sizes",
    "pipeline layout checked at config time",
    ("model.num_layers", "model.pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"),
)

MAPPING = (
    *groups(
        MC + "pipeline_parallel/schedules.py",
        {
            "deallocate_output_tensor": INVARIANT,
            "custom_backward": INVARIANT,
            "_normalize_loss_scale": unreachable(
                "the loss scale comes from the optimizer's grad scaler (a scalar tensor)"
            ),
            "forward_step_calc_loss": INVARIANT,
            "backward_step_multimodule._unwrap_single_tensor_list": unreachable("multi-module (MIMO) pipelines only"),
            "forward_backward_no_pipelining": SCHEDULE_CONTRACT,
            "forward_backward_pipelining_with_interleaving": (
                SCHEDULE_CONTRACT,
                site(
                    "Can not use both overlap_p2p_comm and batch_p2p_comm",
                    validated("TransformerConfig / Megatron-Bridge comm-overlap setup", "config"),
                ),
                site(
                    "raise ValueError(msg)",
                    guarded(
                        "pipeline.interleaved_micro_batches",
                        "the interleaved (VPP) schedule needs microbatch_group_size_per_vp_stage (default PP) <= the "
                        "number of micro batches: fewer micro batches than PP per step raise at the first training "
                        "or evaluation step",
                        ("train.global_batch_size", "train.micro_batch_size", "model.pipeline_model_parallel_size"),
                    ),
                ),
                site(
                    "raise RuntimeError(msg)",
                    guarded(
                        "pipeline.interleaved_micro_batches",
                        "the interleaved schedule raises when the micro batches leave a final group smaller than PP "
                        "(M % group size in (0, PP)) at the first step",
                        ("train.global_batch_size", "train.micro_batch_size", "model.pipeline_model_parallel_size"),
                    ),
                ),
                site("wait_handles", INVARIANT),
            ),
            "forward_backward_pipelining_with_interleaving.get_microbatch_id_in_model_chunk": INVARIANT,
            "forward_backward_pipelining_with_interleaving.pp_pre_forward": INVARIANT,
            "forward_backward_pipelining_with_interleaving.pp_pre_backward": INVARIANT,
            "forward_backward_pipelining_without_interleaving": (
                SCHEDULE_CONTRACT,
                site(
                    "does not support overlapping p2p communication",
                    validated("TransformerConfig: overlap_p2p_comm needs the interleaved schedule", "config"),
                ),
                site("multi-module pipelines", unreachable("multi-module (MIMO) pipelines only")),
            ),
        },
    ),
    *groups(
        MC + "pipeline_parallel/p2p_communication.py",
        {
            "P2PCommunicator._communicate_shapes": guarded(
                "pipeline.variable_shapes_interleaved_pp2",
                "variable-shape p2p (variable_seq_lengths, set by in-batch packing under PP) exchanges shapes on "
                "the host (a sync per micro batch); at PP=2 the interleaved schedule pairs them crosswise",
                ("dataset.enable_in_batch_packing", "model.pipeline_model_parallel_size"),
            ),
            "P2PCommunicator._communicate": (
                SCHEDULE_CONTRACT,
                site(
                    "torch.cuda.synchronize", harmless("opt-in debug sync (use_ring_exchange_p2p / batch p2p)"), "sync"
                ),
            ),
        },
    ),
    *groups(
        MC + "pipeline_parallel/utils.py",
        {
            "StageDispatchBwdGrad.backward": INVARIANT,
            "is_vp_first_stage": INVARIANT,
            "is_vp_last_stage": INVARIANT,
            "set_ideal_affinity_for_current_gpu": ENVIRONMENT,
            "ScheduleNode._backward": INVARIANT,
        },
    ),
    *groups(
        MC + "pipeline_parallel/combined_1f1b.py",
        {
            "combined_1f1b_schedule_for_interleaved_pipelining": (
                INVARIANT,
                site(
                    "EP overlap 1F1B with FSDP",
                    gap(
                        ("model.overlap_moe_expert_parallel_comm", "ddp.use_megatron_fsdp"),
                        "EP A2A overlap with Megatron-FSDP under VPP asserts at the first step; CommOverlapConfig "
                        "does not check FSDP",
                        general=True,
                    ),
                ),
            ),
            "combined_forward_backward_step": INVARIANT,
        },
    ),
    *groups(
        MC + "transformer/transformer_block.py",
        {
            "get_num_layers_to_build": PIPELINE_LAYOUT,
            "_get_block_submodules": SPEC_BUILD,
            "TransformerBlock.__init__": ENVIRONMENT,
            "TransformerBlock.sharded_state_dict": CHECKPOINT,
        },
    ),
    *groups(
        MC + "transformer/transformer_layer.py",
        {
            "get_transformer_layer_offset": INVARIANT,
            "TransformerLayer.__init__": INVARIANT,
            "TransformerLayer.create_mcore_cudagraph_manager": LOCAL_CG,
            "TransformerLayer._forward_attention": INVARIANT,
            "TransformerLayer._forward_mlp": INVARIANT,
            "TransformerLayer._te_cuda_graph_replay": guarded(
                "cuda_graphs.te_attention_over_packed",
                "TE per-layer graphs replayed with packed_seq_params: only when cuda_graph_modules leaves attention "
                "out does the layer run attention eagerly and replay hidden states only",
                ("model.cuda_graph_impl", "model.cuda_graph_modules", "dataset.enable_offline_packing"),
            ),
            "TransformerLayer._te_cuda_graph_replay_impl": (
                INVARIANT,
                site(
                    "not self.config.overlap_moe_expert_parallel_comm",
                    gap(
                        ("model.overlap_moe_expert_parallel_comm", "model.cuda_graph_modules"),
                        "TE whole-layer graphs (cuda_graph_modules empty) of MoE layers with EP A2A overlap assert "
                        "at the first replay; TransformerConfig refuses the 'moe' / 'mlp' scopes with the overlap, "
                        "not the whole-layer capture",
                        general=True,
                    ),
                ),
                site("When the output of pre_mlp_layernorm", INVARIANT),
            ),
            "TransformerLayer._get_te_cuda_graph_replay_args": (
                TE_SCOPE_INPUTS,
                site("Exactly one positional argument", INVARIANT),
                site("CUDAGraph requires TransformerEngine", ENVIRONMENT),
            ),
            "TransformerLayer._set_offload_modules": (
                TE_PINNED,
                site(
                    "cuda_graph_warmup_steps > 0",
                    validated(
                        "TransformerConfig.__post_init__: fine-grained activation offloading under CUDA graphs "
                        "asserts cuda_graph_warmup_steps > 0 (model.finalize() at validate())",
                        "the same condition, refused at config time",
                        ("model.fine_grained_activation_offloading", "model.cuda_graph_warmup_steps"),
                    ),
                ),
            ),
            "MoETransformerLayer.transition_cudagraph_scope": INVARIANT,
            "MoETransformerLayer.create_mcore_cudagraph_manager": LOCAL_CG,
            "MoETransformerLayer._restore_token_dispatcher_attrs": INVARIANT,
            "MoETransformerLayer._forward_mlp_router": INVARIANT,
            "MoETransformerLayer._forward_mlp": INFERENCE,
            "MoETransformerLayer._forward_mlp._forward_mlp_partial_cudagraphs": guarded(
                "cuda_graphs.capture_host_reads",
                "partial MoE graphs wait on the router's device-to-host event between the captured router and the "
                "eager dispatcher (by design outside the captured region)",
                ("model.cuda_graph_modules",),
            ),
        },
    ),
    *groups(
        MC + "full_cuda_graph.py",
        {
            "clone_tensors_in_struct": unreachable(
                "the shipped collates emit batch values that are tensors, lists, None or dataclasses (no tuple "
                "values: checked in data/collators, data/packing and models/*/data), and StaticBufferLoader passes "
                "a dict"
            ),
            "StaticBufferLoader.__call__": INVARIANT,
            "FullCudaGraphWrapper.data_read": INVARIANT,
            "FullCudaGraphWrapper.__call__": (
                INVARIANT,
                site(
                    "torch.cuda.synchronize",
                    harmless("around capture, once per graph (outside the captured region)"),
                    "sync",
                ),
            ),
        },
    ),
    *groups(
        MC + "transformer/cuda_graphs.py",
        {
            "ArgMetadata.zeros_like": LOCAL_CG,
            "_check_supported_type": LOCAL_CG,
            "_clone_nested_tensors": LOCAL_CG,
            "_CudagraphGlobalRecord._create_cudagraphs": LOCAL_CG,
            "delete_cuda_graphs": LOCAL_CG,
            "_CudagraphRecordNode.forward": LOCAL_CG,
            "_CudagraphRecordNode.backward": LOCAL_CG,
            "_CudagraphReplayNode.forward": LOCAL_CG,
            "_CudagraphReplayNode.backward": LOCAL_CG,
            "_CudaGraphRunner.*": LOCAL_CG,
            "CudaGraphManager.*": LOCAL_CG,
            "TECudaGraphHelper.__init__": (
                INVARIANT,
                site("HAVE_TE_GRAPHS", ENVIRONMENT),
                site(
                    "expandable_segments",
                    gap(
                        ("model.cuda_graph_impl", "env_vars"),
                        "TE per-layer graphs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and "
                        "NCCL_GRAPH_REGISTER not 0 assert when the graph helper is built",
                        general=True,
                    ),
                ),
            ),
            "TECudaGraphHelper._get_sample_arguments": CG_HELPER_CONTRACT,
            "TECudaGraphHelper._get_sample_arguments._get_layer_static_inputs": CG_HELPER_CONTRACT,
            "TECudaGraphHelper._get_amax_reduction_group": INVARIANT,
            "TECudaGraphHelper._get_cuda_graph_input_data": INVARIANT,
            "TECudaGraphHelper._start_capturing": (
                INVARIANT,
                site("synchronize", harmless("once, before capture"), "sync"),
            ),
            "TECudaGraphHelper._finish_capturing": harmless("once, after capture"),
            "TECudaGraphHelper.delete_cuda_graphs": INVARIANT,
            "set_current_microbatch": INVARIANT,
        },
    ),
    *groups(
        TE + "graph.py",
        {
            "_canonicalize_capture_time_hooks": CG_HELPER_CONTRACT,
            "_run_capture_time_hooks": CG_HELPER_CONTRACT,
            "_make_graphed_callables": (
                CG_HELPER_CONTRACT,
                site("sample_args ' + 'for each callable must contain only Tensors", TE_SCOPE_INPUTS),
                site(
                    "Modules must not have hooks registered",
                    unreachable("TECudaGraphHelper graphs layers before the DDP hooks are attached to them"),
                ),
                site("torch.cuda.synchronize", harmless("at capture, outside the captured region"), "sync"),
            ),
            "_make_graphed_callables._run_warmup_forward.hook_fn": INVARIANT,
            "_make_graphed_callables._run_warmup_backward": INVARIANT,
            "_make_graphed_callables.make_graphed_autograd_function.ensure_not_reset": INVARIANT,
            "_make_graphed_callables.make_graphed_autograd_function.Graphed.forward": INVARIANT,
            "_make_graphed_callables.make_graphed_autograd_function.Graphed.backward": INVARIANT,
            "_make_graphed_callables.make_graphed_autograd_function.functionalized": (
                TE_SCOPE_INPUTS,
                site("is_first_microbatch", INVARIANT),
            ),
            "restore_fp8_tensors": INVARIANT,
            "make_graphed_callables": (CG_HELPER_CONTRACT, site("Graphing for", API_MISUSE)),
        },
    ),
)
