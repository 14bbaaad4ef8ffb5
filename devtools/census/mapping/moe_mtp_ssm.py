"""MoE (router, dispatchers, experts, TE grouped GEMM / permute / router), MTP, Mamba / gated delta net, hybrid."""

from __future__ import annotations

from devtools.census.mapping.common import (
    API_MISUSE,
    ARCHITECTURE,
    CHECKPOINT,
    ENVIRONMENT,
    INFERENCE,
    INVARIANT,
    LOGGING,
    SPEC_BUILD,
    TE_PINNED,
    known_value,
)
from devtools.census.verdicts import gap, groups, guarded, harmless, site, unreachable, validated

MC = "megatron/core/"
TE = "transformer_engine/pytorch/"
MOE = MC + "transformer/moe/"

DROPLESS_HOST_READ = guarded(
    "cuda_graphs.capture_host_reads",
    "dropless MoE reads token counts per expert on the host (grouped-GEMM splits, all-to-all sizes): a sync per "
    "layer outside graphs, illegal inside a full-iteration capture (Megatron-Core's MoE graph support pads to "
    "capacity or captures partially)",
    ("model.cuda_graph_impl", "model.cuda_graph_scope", "model.moe_pad_expert_input_to_capacity"),
)
MOE_OPTIONS = gap(
    (
        "model.moe_router_load_balancing_type",
        "model.moe_aux_loss_coeff",
        "model.moe_router_fusion",
        "model.moe_apply_probs_on_input",
        "model.moe_flex_dispatcher_backend",
    ),
    "a MoE option combination asserted when the model is built or at its first forward (quantile balancing with "
    "aux loss / router fusion / group top-k, sinkhorn with aux loss, apply_probs_on_input with top-k > 1, NCCL-EP "
    "static shape / zero copy, fused shared-expert grouped GEMM requirements); TransformerConfig.__post_init__ "
    "checks other MoE combinations (flex backends, capacity factor, pre-softmax) but not these",
    general=True,
)
#: TE's attention load-balancing undo/redo divide the packed row by CP (both functions share the check)
CP_ROW_WIDTH = site(
    "total_tokens % cp_size",
    guarded(
        ("offline.alignment_multiple", "offline.row_width_alignment"),
        "the packed row width split over CP (each sequence padded to 2*CP)",
        ("dataset.offline_packing_specs.pad_seq_to_mult", "model.context_parallel_size"),
    ),
)
MOE_TE = unreachable(
    "TE fused MoE kernels called by Megatron-Core with CUDA tensors it built (routing map, probs, token counts) "
    "and the shapes the dispatcher computed"
)
MOE_TE_VERSION = TE_PINNED
ABSTRACT = API_MISUSE
MTP_LAYOUT = validated(
    "TransformerConfig.__post_init__ / the MTP block spec: MTP layers on the last (virtual) pipeline stage",
    "layout checked by the provider's spec",
    ("model.mtp_num_layers", "model.pipeline_model_parallel_layout"),
)
MAMBA_CONFIG = ARCHITECTURE
MAMBA_TP = guarded(
    "mamba.heads_divisible",
    "Mamba heads / groups not divisible by TP assert when the model is built (TransformerConfig checks attention "
    "heads, not Mamba's)",
    ("model.tensor_model_parallel_size", "model.mamba_num_heads", "model.mamba_num_groups"),
)
MAMBA_CP = guarded(
    "mamba.heads_divisible",
    "Mamba context parallel splits heads over TP*CP: nheads (and ngroups, or CP by ngroups) not divisible assert "
    "when the model is built",
    ("model.context_parallel_size", "model.mamba_num_heads", "model.mamba_num_groups"),
)
ROUTER_PAIRS = guarded(
    "moe.router_options",
    "a router / expert option pair Megatron-Core refuses when the model is built or at its first forward "
    "(quantile balancing with aux loss, router fusion or group-limited routing; sinkhorn with aux loss; "
    "moe_apply_probs_on_input with top-k > 1; shared-expert overlap with latent projections)",
    ("model.moe_router_load_balancing_type", "model.moe_aux_loss_coeff", "model.moe_apply_probs_on_input"),
)
PREFILL_OPS = unreachable(
    "Megatron-Core's own varlen SSD / conv kernels serve the inference prefill and the non-memory-efficient path "
    "(mamba_mixer._ssm_prefill); packed training takes mamba_ssm's fused kernel (_ssm_training)"
)
GDN_HOST_READ = guarded(
    "cuda_graphs.capture_host_reads",
    "gated delta net reads cu_seqlens[-1] on the host per layer over packed rows: a sync outside graphs, illegal "
    "in a capture",
    ("model.cuda_graph_impl", "model.cuda_graph_scope"),
)

MAPPING = (
    # -- MoE ---------------------------------------------------------------------------------------------------
    *groups(
        MOE + "router.py",
        {
            "Router.routing": ABSTRACT,
            "Router.forward": ABSTRACT,
            "TopKRouter.__init__": ROUTER_PAIRS,
            "TopKRouter.sinkhorn_load_balancing": ROUTER_PAIRS,
            "TopKRouter.quantile_balancing": ROUTER_PAIRS,
            "TopKRouter.routing": unreachable(
                "the training steps pass no padding_mask to the model, so the router never gets one (it counts "
                "padding tokens instead: moe.router_counts_padding, listed with the silent mechanisms)"
            ),
            "InferenceTopKRouter.__init__": INFERENCE,
        },
    ),
    *groups(
        MOE + "moe_utils.py",
        {
            "switch_load_balancing_loss_func": MOE_TE_VERSION,
            "qb_dual_update": guarded(
                "moe.quantile_balancing_tokens",
                "quantile balancing asserts tokens * top-k divisible by the number of experts at every update; the "
                "rule checks every width the collate can emit (packed, unpacked, collate-packed rows) against "
                "num_experts / gcd(k, num_experts)",
                ("model.moe_router_load_balancing_type", "model.num_moe_experts", "model.moe_router_topk"),
            ),
            "permute": (MOE_TE_VERSION, site("assert", INVARIANT, "assert")),
            "unpermute": (
                MOE_TE_VERSION,
                site("assert", INVARIANT, "assert"),
                site("masked_select", DROPLESS_HOST_READ),
            ),
            "sort_chunks_by_idxs": (MOE_TE_VERSION, site("tolist", DROPLESS_HOST_READ, "tolist")),
            "topk_routing_with_score_function": (
                MOE_TE_VERSION,
                site("logits.dim() == 2", INVARIANT),
                site("precomputed_indices", unreachable("router replay only (precomputed indices)")),
                site("Invalid score_function", known_value("model.moe_router_score_function")),
            ),
            "compute_routing_scores_for_aux_loss": (
                MOE_TE_VERSION,
                site("Invalid score_function", known_value("model.moe_router_score_function")),
            ),
            "apply_router_token_dropping": (
                INVARIANT,
                site("Invalid drop_policy", known_value("model.moe_token_drop_policy")),
            ),
            "maybe_move_tensor_to_cpu": LOGGING,
            "MoECudaGraphPartialCaptureSignal.get_early_return_outputs": INVARIANT,
            "MoECudaGraphTensorStore.set": INVARIANT,
            "maybe_skip_or_early_return_by_cudagraph.maybe_raise_signal": harmless(
                "control flow: the partial-capture signal is raised and caught by Megatron-Core's MoE CUDA-graph "
                "helper by design"
            ),
            "maybe_skip_or_early_return_by_cudagraph.decorator.wrapped_func": INVARIANT,
        },
    ),
    *groups(
        MOE + "token_dispatcher.py",
        {
            "MoETokenDispatcher.dispatch_preprocess": ABSTRACT,
            "MoETokenDispatcher.token_dispatch": ABSTRACT,
            "MoETokenDispatcher.dispatch_postprocess": ABSTRACT,
            "MoETokenDispatcher.combine_preprocess": ABSTRACT,
            "MoETokenDispatcher.token_combine": ABSTRACT,
            "MoETokenDispatcher.combine_postprocess": ABSTRACT,
            "MoETokenDispatcher.set_shared_experts": INVARIANT,
            "MoEAllGatherTokenDispatcher.__init__": INVARIANT,
            "MoEAllGatherTokenDispatcher.dispatch_postprocess": DROPLESS_HOST_READ,
            "MoEAlltoAllTokenDispatcher.__init__": (
                INVARIANT,
                site(
                    "moe_expert_capacity_factor is not None",
                    validated(
                        "TransformerConfig.__post_init__: moe_pad_expert_input_to_capacity needs the capacity factor",
                        "config",
                    ),
                ),
            ),
            "MoEAlltoAllTokenDispatcher.preprocess": INVARIANT,
            "MoEAlltoAllTokenDispatcher.dispatch_preprocess": INVARIANT,
            "MoEAlltoAllTokenDispatcher.dispatch_postprocess": DROPLESS_HOST_READ,
            "MoEAlltoAllTokenDispatcher.combine_preprocess": DROPLESS_HOST_READ,
            "MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize": DROPLESS_HOST_READ,
            "_HybridEPManager.__init__": (
                validated("TransformerConfig.__post_init__: HybridEP capacity factor", "config"),
                site("HybridEP is not installed", ENVIRONMENT),
            ),
            "_HybridEPManager.setup_metadata": guarded(
                ("moe.hybridep_uneven_inputs", "cuda_graphs.capture_host_reads"),
                "HybridEP pads uneven per-rank token counts only with moe_hybridep_pad_uneven_dispatch_inputs, "
                "reading the group maximum on the host (a sync; illegal in a capture)",
                ("model.moe_flex_dispatcher_backend", "model.moe_hybridep_pad_uneven_dispatch_inputs"),
            ),
            "_DeepepManager.__init__": ENVIRONMENT,
            "_DeepepManager._indices_to_multihot": DROPLESS_HOST_READ,
            "_DeepepManager.get_permuted_hidden_states_by_experts": (
                DROPLESS_HOST_READ,
                site("float32 probs", INVARIANT),
            ),
            "_NCCLEPManager.__init__": (MOE_OPTIONS, site("ImportError", ENVIRONMENT, "raise")),
            "_NCCLEPManager._ensure_bootstrap": MOE_OPTIONS,
            "_NCCLEPManager.get_permuted_hidden_states_by_experts": DROPLESS_HOST_READ,
            "MoEFlexTokenDispatcher.__init__": (
                guarded(
                    "moe.flex_dispatcher_parallel",
                    "the flex dispatcher (DeepEP / NCCL-EP) with expert TP * EP == 1 asserts when the model is built",
                    ("model.moe_token_dispatcher_type", "model.expert_model_parallel_size"),
                ),
                site("Invalid backend", known_value("model.moe_flex_dispatcher_backend")),
            ),
        },
    ),
    *groups(
        MOE + "moe_layer.py",
        {
            "BaseMoELayer.__init__": guarded(
                "batch.world_size_divisible",
                "experts must divide over EP; initialize_model_parallel and the rule check the EP layout "
                "(num_moe_experts % EP is TransformerConfig's)",
                ("model.num_moe_experts", "model.expert_model_parallel_size"),
            ),
            "MoELayer.__init__": (
                INFERENCE,
                site("MoE latent projections", ENVIRONMENT),
                site("Unsupported token dispatcher type", known_value("model.moe_token_dispatcher_type")),
                site("Shared experts builder", SPEC_BUILD),
            ),
            "MoELayer.preprocess": ROUTER_PAIRS,
            "MoELayer.routed_experts_compute": unreachable(
                "TE grouped experts have no mlp bias in Megatron-Core's specs"
            ),
            "MoELayer.forward": guarded(
                "moe.tp_needs_sequence_parallel",
                "MoE with TP > 1 and sequence_parallel off raises at the first training forward (a ValueError, "
                "despite its 'performance may degrade' wording)",
                ("model.tensor_model_parallel_size", "model.sequence_parallel", "model.num_moe_experts"),
            ),
            "MoELayer.forward.custom_forward": unreachable(
                "TE grouped experts have no mlp bias in Megatron-Core's specs"
            ),
        },
    ),
    *groups(
        MOE + "experts.py",
        {
            "TEGroupedMLP.__init__": (SPEC_BUILD, site("HAVE_TE", ENVIRONMENT)),
            "TEGroupedMLP._make_fused_ops": SPEC_BUILD,
            "TEGroupedMLP._make_fused_impl_pre_forward_hook.forward_pre_hook": SPEC_BUILD,
            "TEGroupedMLP._fused_forward": DROPLESS_HOST_READ,
            "TEGroupedMLP.forward": (
                DROPLESS_HOST_READ,
                site("output_buffer is None", INVARIANT),
                site("moe_apply_probs_on_input", ROUTER_PAIRS),
            ),
            "TEGroupedMLP.forward.bias_act_func": SPEC_BUILD,
            "TEGroupedMLP.backward_dw": INVARIANT,
            "InferenceGroupedMLP.*": INFERENCE,
            "SequentialMLP.forward": (DROPLESS_HOST_READ, site("moe_apply_probs_on_input", ROUTER_PAIRS)),
            "SequentialMLP.sharded_state_dict": CHECKPOINT,
        },
    ),
    *groups(
        MOE + "fused_a2a.py",
        {
            "init_hybrid_ep_buffer": unreachable(
                "its only caller (HybridEPDispatch.forward) passes fp8_dispatch=False ('Currently, we do not "
                "support fp8 dispatch'), whatever the precision"
            ),
            "ensure_nccl_ep_bootstrapped": ENVIRONMENT,
        },
    ),
    *groups(
        MOE + "shared_experts.py",
        {
            "overlap_state_check.decorator.wrapper": INVARIANT,
            "SharedExpertMLP.__init__": SPEC_BUILD,
            "SharedExpertMLP.linear_fc1_forward_and_act": SPEC_BUILD,
            "SharedExpertMLP.linear_fc2_forward": INVARIANT,
            "SharedExpertMLP.get_output": INVARIANT,
            "FusedSharedExpertMLP._validate_fused_grouped_swiglu": MOE_OPTIONS,
            "FusedSharedExpertMLP._get_fused_grouped_swiglu_recipe": MOE_OPTIONS,
            "FusedSharedExpertMLP._make_fused_grouped_swiglu_ops.forward_pre_hook": SPEC_BUILD,
            "FusedSharedExpertMLP.linear_fc2_forward": INVARIANT,
            "FusedSharedExpertMLP.backward_dw": INVARIANT,
        },
    ),
    *groups(
        TE + "module/grouped_linear.py",
        {
            "_GroupedLinear._prepare_weights_for_grouped_tensor_gemm": SPEC_BUILD,
            "_GroupedLinear._validate_or_alloc_output": INVARIANT,
            "_GroupedLinear._prepare_bias_for_grouped_tensor_gemm": SPEC_BUILD,
            "_GroupedLinear.forward": (
                unreachable("Megatron-Core's grouped experts pass m_splits and inputs that match the weights"),
                site("save_original_input", unreachable("set only for non-delayed recipes")),
                site(
                    "FP8 block-scaling recipe on Blackwell",
                    gap(
                        ("mixed_precision", "model.moe_grouped_gemm"),
                        "grouped-tensor GEMM with the FP8 block-scaling recipe on Blackwell raises at the first "
                        "expert forward",
                        general=True,
                    ),
                ),
                site("native grouped-tensor path", SPEC_BUILD),
                site("CUDA m_splits", INVARIANT),
                site("tolist", DROPLESS_HOST_READ, "tolist"),
            ),
            "_GroupedLinear._backward_grouped_tensor": INVARIANT,
            "_GroupedLinear.backward": INVARIANT,
            "GroupedLinear.__init__": SPEC_BUILD,
            "GroupedLinear.make_grouped_weights": SPEC_BUILD,
            "GroupedLinear.forward": (
                INVARIANT,
                site("doesn't support input tensor in FP8", unreachable("Megatron-Core passes high-precision inputs")),
                site("TE debug features", unreachable("TE debug mode: not enabled by Megatron-Bridge")),
            ),
            "GroupedLinear.backward_dw": INVARIANT,
            "GroupedLinear._customize_quantizers_float8_current_scaling": gap(
                ("mixed_precision", "model.expert_tensor_parallel_size"),
                "grouped experts with expert TP > 1 under FP8 current scaling raise when the quantizers are set up "
                "(first forward)",
                general=True,
            ),
            "GroupedLinear._get_debug_quantizers": unreachable("TE debug mode: not enabled by Megatron-Bridge"),
        },
    ),
    *groups(TE + "module/fp8_padding.py", {"Fp8Padding.forward": INVARIANT}),
    *groups(TE + "module/fp8_unpadding.py", {"Fp8Unpadding.forward": INVARIANT}),
    *groups(
        TE + "permutation.py",
        {
            "moe_permute_index_map_forward": MOE_TE,
            "_moe_permute_index_map_fake": unreachable("torch.compile fake tensors: not a Megatron-Bridge option"),
            "moe_permute_mask_map_forward": MOE_TE,
            "_moe_permute_mask_map_forward_fake": unreachable("torch.compile fake tensors"),
            "_moe_permute_mask_map_backward_wrapper": MOE_TE,
            "moe_unpermute_mask_map_forward": MOE_TE,
            "moe_unpermute_mask_map_backward_no_probs": MOE_TE,
            "_moe_unpermute_mask_map_backward_wrapper": MOE_TE,
            "moe_permute": MOE_TE,
            "moe_permute_with_probs": MOE_TE,
            "moe_permute_and_pad_with_probs": (
                MOE_TE,
                site("", DROPLESS_HOST_READ, "item"),
                site("", DROPLESS_HOST_READ, "tensor_bool"),
            ),
            "moe_unpermute": MOE_TE,
        },
    ),
    *groups(
        TE + "router.py",
        {
            "mark_qb_bin_bounds_validated": MOE_OPTIONS,
            "_validate_qb_bin_bounds": MOE_OPTIONS,
            "_validate_routing_map_format": MOE_TE,
            "fused_topk_with_score_function": (
                MOE_TE,
                site("Quantile Balancing", MOE_OPTIONS),
                site("qb_", MOE_OPTIONS),
            ),
        },
    ),
    # -- MTP ---------------------------------------------------------------------------------------------------
    *groups(
        MC + "transformer/multi_token_prediction.py",
        {
            "tie_word_embeddings_state_dict": CHECKPOINT,
            "tie_output_layer_state_dict": CHECKPOINT,
            "_roll_tensor_packed_seq": unreachable(
                "called by roll_tensor with dims=-1, shifts=-1 and the packed params' cu_seqlens_q (the CP "
                "mis-roll it performs silently is mtp.packed_context_parallel, listed with the silent mechanisms)"
            ),
            "_compute_mtp_acceptance_counts": INFERENCE,
            "mtp_on_this_rank": INVARIANT,
            "get_mtp_num_layers_to_build": MTP_LAYOUT,
            "MultiTokenPredictionLayer.__init__": (
                SPEC_BUILD,
                site(
                    "SUPPORTED_ATTN_MASK",
                    unreachable("GPT / hybrid MTP layers use causal (padding_causal for THD) masks"),
                ),
            ),
            "MultiTokenPredictionLayer._checkpointed_forward": (
                guarded(
                    "mtp.full_recompute_layers",
                    "MTP under uniform full recompute with recompute_num_layers != 1 asserts at the first forward",
                    ("model.recompute_granularity", "model.recompute_num_layers", "model.mtp_num_layers"),
                ),
                site(
                    "Invalid activation recompute method",
                    validated(
                        "TransformerConfig.__post_init__: recompute_method in (block, uniform) under full recompute",
                        "config",
                    ),
                ),
            ),
            "MultiTokenPredictionLayer.forward": unreachable("decoder-only models pass no cross-attention context"),
            "_get_mtp_block_submodules": SPEC_BUILD,
            "MultiTokenPredictionBlock.__init__": (
                MTP_LAYOUT,
                site("Cannot specify both hybrid_submodules", SPEC_BUILD),
                site("pg_collection", INVARIANT),
                site("at least one layer", INVARIANT),
            ),
        },
    ),
    # -- Mamba / hybrid ----------------------------------------------------------------------------------------
    *groups(
        MC + "ssm/mamba_mixer.py",
        {
            "MambaMixer.__init__": (
                MAMBA_CONFIG,
                site("ImportError", ENVIRONMENT, "raise"),
                site("mamba_training_ssm_states_dtype", ENVIRONMENT),
                site("pg_collection", INVARIANT),
                site("% tp_size", MAMBA_TP),
                site(
                    "For FP8, the innermost dimension",
                    guarded(
                        "fp8.packed_tokens_per_rank",
                        "Mamba's in_proj output width must be a multiple of 16 under FP8 (the same TE FP8 GEMM "
                        "alignment; a model-shape bound the Nemotron-H providers meet)",
                        ("mixed_precision",),
                    ),
                ),
                site("RMSNormGated", ENVIRONMENT),
            ),
            "MambaMixer.forward": (
                INFERENCE,
                site(
                    "Training with packed sequences is not supported in the non-memory-efficient",
                    guarded(
                        "mamba.packing_needs_mem_eff_path",
                        "packed rows with use_mamba_mem_eff_path=False assert in every Mamba layer at the first "
                        "forward",
                        ("model.use_mamba_mem_eff_path", "dataset.enable_offline_packing"),
                    ),
                ),
                site("assert ssm_state is None", INVARIANT),
            ),
            "MambaMixer._dynamic_inference": INFERENCE,
            "MambaMixer._decode": INFERENCE,
            "MambaMixer._ssm_training": unreachable(
                "environment: packed training needs mamba-ssm / causal-conv1d builds with varlen support "
                "(_check_mamba_sequence_packing_support); the pinned stack decides it, no config value"
            ),
            "MambaMixer._ssm_prefill": (
                PREFILL_OPS,
                site(
                    "Context parallel not supported for use_mem_eff_path==False",
                    guarded(
                        "mamba.cp_needs_rmsnorm_off_mem_eff_path",
                        "Mamba with use_mamba_mem_eff_path=False, CP>1 and no rmsnorm (Falcon-H1's rmsnorm=False) "
                        "asserts at the first forward",
                        ("model.use_mamba_mem_eff_path", "model.context_parallel_size", "model.rmsnorm"),
                    ),
                ),
            ),
            "MambaMixer._ssm_decode": INFERENCE,
            "MambaMixer._get_states_from_cache": INFERENCE,
            "MambaMixer.sharded_state_dict": CHECKPOINT,
        },
    ),
    *groups(
        MC + "ssm/mamba_layer.py",
        {
            "MambaLayer.__init__": INVARIANT,
            "MambaLayer.create_mcore_cudagraph_manager": INVARIANT,
            "MambaLayer._te_cuda_graph_replay": INFERENCE,
        },
    ),
    *groups(
        MC + "ssm/mamba_context_parallel.py",
        {
            "MambaContextParallel.__init__": (MAMBA_CP, site("einops", ENVIRONMENT)),
            "_all_to_all_cp2hp": INVARIANT,
            "_all_to_all_hp2cp": INVARIANT,
            "_undo_attention_load_balancing": (
                TE_PINNED,
                CP_ROW_WIDTH,
            ),
            "_redo_attention_load_balancing": (
                TE_PINNED,
                CP_ROW_WIDTH,
            ),
        },
    ),
    *groups(MC + "ssm/ops/ssd_combined.py", {"*": PREFILL_OPS}),
    *groups(MC + "ssm/ops/ssd_chunk_scan.py", {"*": PREFILL_OPS}),
    *groups(MC + "ssm/ops/ssd_chunk_state.py", {"*": PREFILL_OPS, "<module>": ENVIRONMENT}),
    *groups(MC + "ssm/ops/ssd_bmm.py", {"*": PREFILL_OPS}),
    *groups(MC + "ssm/ops/ssd_state_passing.py", {"*": PREFILL_OPS}),
    *groups(MC + "ssm/ops/causal_conv1d_varlen.py", {"*": PREFILL_OPS}),
    *groups(
        MC + "ssm/gated_delta_net/gdn.py",
        {
            "GatedDeltaNet.forward": (
                INFERENCE,
                site(
                    "Packed sequence expects batch dimension to be 1",
                    guarded(
                        ("offline.micro_batch_one",), "packed rows with a micro batch > 1", ("train.micro_batch_size",)
                    ),
                ),
                site(
                    "Packed sequence does not support deterministic mode",
                    guarded(
                        "gdn.packing_deterministic",
                        "gated delta net (Qwen3-Next, Qwen3.5, hybrid 'G' layers) over packed rows with "
                        "deterministic_mode asserts at the first forward",
                        ("model.deterministic_mode", "dataset.enable_offline_packing"),
                    ),
                ),
                site("torch.equal(cu_seqlens_q, cu_seqlens_kv)", INVARIANT),
                site("num_packed_seqs > 0", INVARIANT),
                site("self.activation in", SPEC_BUILD),
            ),
        },
    ),
    *groups(
        MC + "ssm/gated_delta_net/common.py",
        {
            "_GDNBase.__init__": (
                SPEC_BUILD,
                site("FLA is not installed", ENVIRONMENT),
                site(
                    "For FP8, the innermost dimension",
                    guarded(
                        "fp8.packed_tokens_per_rank",
                        "a model-shape FP8 alignment the Qwen3-Next provider meets (same TE FP8 GEMM bound)",
                        ("mixed_precision",),
                    ),
                ),
            ),
            "_GDNBase._setup_variant_attrs": ABSTRACT,
            "_GDNBase.forward": ABSTRACT,
            "_GDNBase._prepare_input_for_gated_delta_rule": unreachable(
                "repeat by a Python int (heads per group): static shape"
            ),
            "_GDNBase._resolve_cu_seqlens": (
                GDN_HOST_READ,
                site(
                    "does not match total_sequence_length",
                    unreachable(
                        "the collates end cu_seqlens at the row width (GPTSFTPackedDataset appends max_length; "
                        "in-batch packing pads the tail)"
                    ),
                ),
                site(
                    "must be divisible by cp_size",
                    guarded(
                        "offline.alignment_multiple",
                        "each packed sequence padded to a multiple of 2*CP",
                        ("dataset.offline_packing_specs.pad_seq_to_mult", "model.context_parallel_size"),
                    ),
                ),
            ),
            "_GDNBase.sharded_state_dict": CHECKPOINT,
            "_build_head_perm_for_split_sections": validated(
                "TransformerConfig.__post_init__: linear_num_key_heads and linear_num_value_heads multiples of TP*CP "
                "(model.finalize() at validate())",
                "the head sections split over CP are those heads",
                ("model.linear_num_key_heads", "model.linear_num_value_heads", "model.context_parallel_size"),
            ),
            "tensor_a2a_cp2hp": INVARIANT,
            "tensor_a2a_hp2cp": INVARIANT,
            "torch_chunk_gated_delta_rule": unreachable(
                "the torch fallback runs only without FLA, which packed training requires (FLA import above)"
            ),
        },
    ),
    *groups(
        MC + "models/hybrid/hybrid_model.py",
        {
            "_hybrid_logging_pg_kwargs": INVARIANT,
            "HybridModel.__init__": (
                unreachable(
                    "Megatron-Bridge's HybridModelProvider.provide passes hybrid_layer_pattern alone (no override "
                    "pattern, no ratios); its finalize() moves hybrid_override_pattern there and asserts the two are "
                    "not both set, at validate()"
                ),
                site("mtp_block_spec is not None", SPEC_BUILD),
            ),
            "HybridModel.set_input_tensor": INVARIANT,
            "HybridModel.forward": (INFERENCE, site("assert self.config.mtp_num_layers > 0", INVARIANT)),
        },
    ),
    *groups(
        MC + "models/hybrid/hybrid_block.py",
        {"HybridStack.__init__": INVARIANT},
    ),
)
