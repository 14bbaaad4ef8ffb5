"""The CP partition and process groups, hybrid CP, TP / SP mappings, TP comm overlap and TE's linear modules."""

from __future__ import annotations

from devtools.census.mapping.common import (
    API_MISUSE,
    CHECKPOINT,
    ENVIRONMENT,
    INVARIANT,
    SPEC_BUILD,
    TE_PINNED,
    known_value,
)
from devtools.census.verdicts import gap, groups, guarded, harmless, site, unreachable, validated

MB = "megatron/bridge/"
MC = "megatron/core/"
TE = "transformer_engine/pytorch/"

HYBRID_CP = guarded(
    "cp.hybrid_context_parallel",
    "hybrid context parallel (per-sample CP groups): Megatron-Core's schedule, data iterator and groups for it; "
    "Megatron-Bridge 0.6.2 does not wire the hybrid-CP data path through its steps",
    ("model.hybrid_context_parallel",),
)
NOT_BRIDGE_DATA_PATH = unreachable(
    "Megatron-LM's own data path (pretrain_gpt: TP-broadcast of batches, micro-batch merging of cu_seqlens); "
    "Megatron-Bridge's steps read the batch on every rank and never call it"
)
WORLD = guarded(
    "batch.world_size_divisible",
    "world size not divisible by TP*PP*CP (or by expert TP*EP*PP)",
    ("model.tensor_model_parallel_size", "model.pipeline_model_parallel_size", "model.context_parallel_size"),
)
ALREADY = unreachable("process groups are initialized once per process (initialize_model_parallel)")
PG_FEATURE = gap(
    ("ddp.num_distributed_optimizer_instances", "model.tensor_parallel_num_weight_shards"),
    "generalized-TP weight rematerialization with a partial distributed optimizer (more than one instance) "
    "asserts at setup after the GPUs are allocated; ConfigContainer.validate does not check it",
    general=True,
)
SHARP_GROUP = guarded(
    "process_groups.sharp_group",
    "a SHARP group without use_sharp, or 'dp_replica' with a single optimizer instance, asserts at setup",
    ("dist.use_sharp", "dist.sharp_enabled_group", "ddp.num_distributed_optimizer_instances"),
)
SP_SPLIT = guarded(
    ("offline.row_width_alignment", "gpt_sft.row_width_alignment", "collate.seq_length_alignment"),
    "sequence parallelism splits the rank's token dimension by TP: every row width must be a multiple of TP "
    "(CP*TP with CP) for packed rows, unpacked GPT SFT rows and the VLM collates",
    ("model.sequence_parallel", "model.tensor_model_parallel_size", "model.context_parallel_size"),
)
GROUP_GIVEN = unreachable("callers pass the layer's process group (never None in training)")
COMM_OVERLAP_SETUP = validated(
    "CommOverlapConfig.setup (runtime_config_update, before validate()): EP A2A overlap and delayed-wgrad checks",
    "Megatron-Bridge's own config-time check, before any GPU work",
)
FP8_DIMS = guarded(
    "fp8.packed_tokens_per_rank",
    "TE's FP8 GEMMs need the rank-local token count (row width / CP / TP under SP) divisible by 8 (16 for the "
    "wgrad GEMM in C++, 32 for MXFP8 blocks)",
    ("mixed_precision", "dataset.offline_packing_specs.packed_sequence_size", "model.context_parallel_size"),
)
UB_INIT = unreachable(
    "Megatron-Bridge calls TE's initialize_ub before building the model when tp_comm_overlap is on "
    "(training/initialize.py _initialize_tp_communicators) and Megatron-Core passes a ub_name per linear"
)
UB_CONFIG = validated(
    "CommOverlapConfig.setup builds the userbuffer config from Megatron-Bridge's own per-model tables "
    "(TransformerLayerTPOverlapCfg)",
    "the userbuffer methods per layer come from the shipped tables",
    ("comm_overlap.tp_comm_overlap_cfg",),
)
DELAYED_REDUCE_AMAX = unreachable("DelayedScaling.reduce_amax defaults to True and Megatron-Core never turns it off")
TE_LINEAR_CONTRACT = unreachable(
    "call contract: Megatron-Core's TE linears pass inputs whose last dimension is in_features, with the "
    "quantizers TE itself set up for the recipe"
)
ONNX = unreachable("ONNX export only")
DEBUG = unreachable("TE debug / nvdlfw-inspect mode: not enabled by Megatron-Bridge's training configs")
DELAY_WGRAD_UB = validated(
    "CommOverlapConfig.setup: delay_wgrad_compute with TP comm overlap is refused there (bulk wgrad overlap)",
    "config-time",
    ("model.delay_wgrad_compute", "comm_overlap.tp_comm_overlap"),
)
TP_SIZES = validated(
    "TransformerConfig.__post_init__ (model.finalize() at validate()): hidden, FFN and head sizes divisible by TP",
    "the division restates a bound the config already checked",
    ("model.tensor_model_parallel_size",),
)
SPLIT_PARAMS = unreachable(
    "parameter splits are passed by Megatron-Core's fused QKV / FC1 layouts with sizes divisible by TP"
)

MAPPING = (
    # -- the CP partition --------------------------------------------------------------------------------------
    *groups(
        MC + "utils.py",
        {
            "get_batch_on_this_tp_rank": NOT_BRIDGE_DATA_PATH,
            "_merge_cu_seqlens_across_micro_batch": NOT_BRIDGE_DATA_PATH,
            "flatten_batch_for_packed_sequences": NOT_BRIDGE_DATA_PATH,
            "get_batch_on_this_cp_rank": HYBRID_CP,
        },
    ),
    *groups(
        MC + "parallel_state.py",
        {
            "create_hierarchical_groups": (
                guarded(
                    "cp.hierarchical_sizes_product",
                    "hierarchical CP groups whose sizes do not multiply to CP",
                    ("model.hierarchical_context_parallel_sizes", "model.context_parallel_size"),
                ),
                site("einops", ENVIRONMENT, "raise"),
                site("int(np.prod", harmless("NumPy arithmetic on Python lists: no tensor"), "scalar"),
                site("tolist", harmless("NumPy arithmetic on Python lists: no tensor"), "tolist"),
            ),
            "create_hybrid_dp_cp_groups": HYBRID_CP,
            "initialize_model_parallel": (
                ALREADY,
                site("is not divisible by", WORLD),
                site(
                    "should be greater than 1 with interleaved schedule",
                    validated("ModelParallelConfig / TransformerConfig: VPP needs PP > 1", "config"),
                ),
                site("Invalid sharp_enabled_group", known_value("dist.sharp_enabled_group")),
                site("sharp_enabled_group is only valid", SHARP_GROUP),
                site("dp_replica group requires", SHARP_GROUP),
                site(
                    "partial DistOpt shard factor",
                    guarded(
                        "process_groups.optimizer_instances",
                        "the partial distributed optimizer's instance count must divide DP*CP and the expert DP size",
                        ("ddp.num_distributed_optimizer_instances",),
                    ),
                ),
                site("GTP_remat", PG_FEATURE),
                site("torch.distributed.is_initialized", INVARIANT),
                site("yaml", ENVIRONMENT),
                site("order.endswith('pp')", INVARIANT),
                site("get_ranks('pp')", INVARIANT),
                site("torch.cuda.synchronize", harmless("once, at setup"), "sync"),
                site("Hybrid context parallel requires an even number", HYBRID_CP),
                site(
                    "np.prod(hierarchical_context_parallel_sizes)",
                    guarded(
                        "cp.hierarchical_sizes_product",
                        "hierarchical CP sizes must multiply to CP",
                        ("model.hierarchical_context_parallel_sizes", "model.context_parallel_size"),
                    ),
                ),
                site("CUDA_DEVICE_MAX_CONNECTIONS", ENVIRONMENT),
                site(
                    "pipeline_model_parallel_comm_backend",
                    known_value("model.pipeline_model_parallel_comm_backend"),
                ),
            ),
            "get_context_parallel_group": INVARIANT,
            "get_hierarchical_context_parallel_groups": guarded(
                "cp.hierarchical_sizes_required",
                "a2a+p2p reaches for the hierarchical groups, which exist only with hierarchical sizes",
                ("model.cp_comm_type", "model.hierarchical_context_parallel_sizes"),
            ),
            "get_hybrid_data_context_parallel_groups": HYBRID_CP,
        },
    ),
    *groups(
        MC + "pipeline_parallel/hybrid_cp_schedule.py",
        {
            "BalancedCPScheduler.next_hdp_group.fill_empty_gpus": HYBRID_CP,
            "BalancedCPScheduler.next_hdp_group": HYBRID_CP,
            "hybrid_context_parallel_forward_backward._broadcast_num_samples_this_group": HYBRID_CP,
            "hybrid_context_parallel_forward_backward._get_new_data_iterator": HYBRID_CP,
            "hybrid_context_parallel_forward_backward": HYBRID_CP,
        },
    ),
    *groups(
        MC + "models/multimodal/context_parallel.py",
        {
            "get_padding": unreachable("Megatron-Core LLaVA model only: Megatron-Bridge's VLMs use their own models"),
            "_reduce_scatter_along_second_dim": unreachable("Megatron-Core LLaVA / RADIO vision CP only"),
            "split_to_context_parallel_ranks_dynamic_res": unreachable("Megatron-Core LLaVA / RADIO vision CP only"),
        },
    ),
    # -- TP / SP -----------------------------------------------------------------------------------------------
    *groups(
        MC + "tensor_parallel/mappings.py",
        {
            "_reduce": GROUP_GIVEN,
            "_split_along_last_dim": GROUP_GIVEN,
            "_split_along_first_dim": (GROUP_GIVEN, site("should be divisible by tensor parallel size", SP_SPLIT)),
            "_gather_along_first_dim": GROUP_GIVEN,
            "_reduce_scatter_along_first_dim": (
                GROUP_GIVEN,
                site("should be divisible by tensor parallel size", SP_SPLIT),
            ),
            "_GatherFromSequenceParallelRegion.backward": INVARIANT,
            "all_to_all": GROUP_GIVEN,
        },
    ),
    *groups(MB + "training/comm_overlap.py", {"CommOverlapConfig._get_model_comm_overlap_cfgs": COMM_OVERLAP_SETUP}),
    *groups(
        TE + "module/base.py",
        {
            "initialize_ub": (UB_CONFIG, site("CUDA Multicast", ENVIRONMENT), site("MPI", ENVIRONMENT)),
            "initialize_ub.get_method": UB_CONFIG,
            "initialize_ub.add_ub": UB_CONFIG,
            "get_ub": UB_INIT,
            "fill_userbuffers_buffer_for_all_gather": (
                unreachable(
                    "the userbuffer's kind (FP8 or not) follows the recipe it was initialized with "
                    "(_initialize_tp_communicators passes the FP8 flag)"
                ),
                site("Invalid local tensor", INVARIANT),
                site(
                    "divisible by 128",
                    guarded(
                        "tp_comm_overlap.mxfp8_tokens",
                        "TP comm overlap with MXFP8: the rank-local token count (seq_length * micro batch / CP / TP) "
                        "must be a multiple of 128 for the userbuffer's scale all-gather, else ValueError at the "
                        "first forward",
                        ("comm_overlap.tp_comm_overlap", "mixed_precision", "model.seq_length"),
                    ),
                ),
                site("unswizzled scales", INVARIANT),
                site("Unsupported quantizer for Userbuffers", UB_CONFIG),
            ),
            "quantize_weight": INVARIANT,
            "TransformerEngineBaseModule.__init__": ENVIRONMENT,
            "TransformerEngineBaseModule._apply": API_MISUSE,
            "TransformerEngineBaseModule.adjust_amax_history_length": INVARIANT,
            "TransformerEngineBaseModule.set_meta_tensor": INVARIANT,
            "TransformerEngineBaseModule._update_weight_quantizers": INVARIANT,
            "TransformerEngineBaseModule._get_weight_tensors": API_MISUSE,
            "TransformerEngineBaseModule._get_weight_quantizers": API_MISUSE,
            "TransformerEngineBaseModule.reset_fp8_meta_tensors.reset": INVARIANT,
            "TransformerEngineBaseModule.get_extra_state": CHECKPOINT,
            "TransformerEngineBaseModule.set_extra_state": CHECKPOINT,
            "TransformerEngineBaseModule.set_activation_dtype": unreachable(
                "Megatron-Core casts parameters and inputs to the model dtype (Float16Module) before TE modules"
            ),
            "TransformerEngineBaseModule.prepare_forward": (
                INVARIANT,
                site("Amax reduction across tensor parallel group", DELAYED_REDUCE_AMAX),
                site("needs CUDA", ENVIRONMENT),
            ),
            "TransformerEngineBaseModule.reset_parameters": (INVARIANT, site(".cpu()", harmless("at init"), "cpu")),
            "TransformerEngineBaseModule.is_debug_iter": DEBUG,
            "TransformerEngineBaseModule._check_weight_tensor_recipe_correspondence": unreachable(
                "quantized weights are created with the run's recipe (fp8_model_init); a checkpoint of another "
                "recipe is a conversion question"
            ),
        },
    ),
    *groups(
        TE + "module/linear.py",
        {
            "_linear_forward_impl": (
                TE_LINEAR_CONTRACT,
                site("assert_dim_for_fp8_exec", FP8_DIMS),
                site("save_original_input", unreachable("save_original_input is set only for non-delayed recipes")),
            ),
            "_linear_forward_fake": unreachable("torch.compile fake tensors: not a Megatron-Bridge option"),
            "_linear_backward_impl": (INVARIANT, site("Userbuffers", DELAY_WGRAD_UB)),
            "_linear_backward_fake": unreachable("torch.compile fake tensors: not a Megatron-Bridge option"),
            "Linear.__init__": (
                SPEC_BUILD,
                site("divide(", TP_SIZES),
                site("is_ub_initialized", UB_INIT),
                site("ub_name is not None", UB_INIT),
                site("torch_version", TE_PINNED),
                site("split", SPLIT_PARAMS),
                site("between {self.tp_size} tensor-parallel", SPLIT_PARAMS),
            ),
            "Linear._get_debug_quantizers": DEBUG,
            "Linear._get_weight_tensors": SPLIT_PARAMS,
            "Linear.onnx_forward": ONNX,
            "Linear._customize_quantizers_float8_current_scaling": INVARIANT,
        },
    ),
    *groups(
        TE + "module/layernorm_linear.py",
        {
            "_LayerNormLinear.forward": (TE_LINEAR_CONTRACT, site("assert_dim_for_fp8_exec", FP8_DIMS)),
            "_LayerNormLinear.backward": (INVARIANT, site("Userbuffers", DELAY_WGRAD_UB)),
            "LayerNormLinear.__init__": (
                SPEC_BUILD,
                site("divide(", TP_SIZES),
                site("is_ub_initialized", UB_INIT),
                site("Userbuffer name", UB_INIT),
                site("torch_version", TE_PINNED),
                site("split", SPLIT_PARAMS),
                site("between {self.tp_size} tensor-parallel", SPLIT_PARAMS),
            ),
            "LayerNormLinear._get_debug_quantizers": DEBUG,
            "LayerNormLinear.onnx_forward": ONNX,
            "LayerNormLinear._customize_quantizers_float8_current_scaling": INVARIANT,
            "LayerNormLinear._get_weight_tensors": SPLIT_PARAMS,
        },
    ),
    *groups(
        TE + "module/layernorm_mlp.py",
        {
            "_get_act_func_supported_list": INVARIANT,
            "_act_func": validated("TransformerConfig activation / TE LayerNormMLP activation names", "spec"),
            "_LayerNormMLP._forward": (
                TE_LINEAR_CONTRACT,
                site("assert_dim_for_fp8_exec", FP8_DIMS),
                site("NVTE_BACKWARD_OVERRIDE", ENVIRONMENT),
                site("bias_gelu_fusion", INVARIANT),
            ),
            "_LayerNormMLP.backward": (INVARIANT, site("Userbuffers", DELAY_WGRAD_UB)),
            "LayerNormMLP.__init__": (
                SPEC_BUILD,
                site("divide(", TP_SIZES),
                site("is_ub_initialized", UB_INIT),
                site("torch_version", TE_PINNED),
            ),
            "LayerNormMLP.onnx_forward": ONNX,
            "LayerNormMLP._get_debug_quantizers": DEBUG,
            "LayerNormMLP._customize_quantizers_float8_current_scaling": INVARIANT,
        },
    ),
    *groups(
        TE + "module/_common.py",
        {
            "_NoopCatFunc.forward": INVARIANT,
            "noop_cat": INVARIANT,
            "WeightGradStore.__init__": DELAY_WGRAD_UB,
            "WeightGradStore.put": INVARIANT,
            "WeightGradStore.pop": INVARIANT,
            "WeightGradStore.assert_empty": INVARIANT,
        },
    ),
    *groups(
        TE + "distributed.py",
        {
            "reduce_scatter_along_first_dim": SP_SPLIT,
            "_all_gather_fp8": INVARIANT,
            "_start_all_gather_fp8_blockwise": INVARIANT,
            "_swap_first_dims": (INVARIANT, site("is not divisible by world_size", SP_SPLIT)),
            "_all_gather_nvfp4": INVARIANT,
            "_all_gather_mxfp8": INVARIANT,
            "gather_along_first_dim": INVARIANT,
        },
    ),
)
