"""Where Megatron-Bridge 0.6.2 / Megatron-Core 0.19.2 consume, at run time, each config field the rules read.

A rule about a field nothing consumes would reject configs that run (the eval-CP lesson): every field the rules
read is listed here with the run-time code that uses it, and ``tests/devtools/test_field_uses.py`` checks that the
cited file really names the field in the installed packages. ``python -m devtools.field_uses`` prints
``docs/field-audit.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mbridge_seqpack.rules.context import SPECS


@dataclass(frozen=True)
class FieldUse:
    """One field: the installed file (under the ``megatron`` package) and function that consume it at run time,
    the identifier that file uses for it, or ``consumer=None`` with the reason it is consumed nowhere."""

    field: str
    consumer: str | None
    function: str
    needle: str = ""

    @property
    def used(self) -> bool:
        return self.consumer is not None


FIELD_USES: tuple[FieldUse, ...] = (
    FieldUse(
        "model.seq_length", "bridge/training/train.py", "train: forward_backward_func(seq_length=...)", "seq_length"
    ),
    FieldUse(
        "model.tensor_model_parallel_size",
        "bridge/training/initialize.py",
        "initialize_model_parallel",
        "tensor_model_parallel_size",
    ),
    FieldUse(
        "model.pipeline_model_parallel_size",
        "bridge/training/initialize.py",
        "initialize_model_parallel",
        "pipeline_model_parallel_size",
    ),
    FieldUse(
        "model.virtual_pipeline_model_parallel_size",
        "bridge/training/initialize.py",
        "initialize_model_parallel",
        "virtual_pipeline_model_parallel_size",
    ),
    FieldUse(
        "model.context_parallel_size",
        "bridge/training/initialize.py",
        "initialize_model_parallel",
        "context_parallel_size",
    ),
    FieldUse(
        "model.expert_model_parallel_size",
        "bridge/training/initialize.py",
        "initialize_model_parallel",
        "expert_model_parallel_size",
    ),
    FieldUse(
        "model.expert_tensor_parallel_size",
        "bridge/training/initialize.py",
        "initialize_model_parallel",
        "expert_tensor_parallel_size",
    ),
    FieldUse(
        "model.hierarchical_context_parallel_sizes",
        "bridge/training/initialize.py",
        "initialize_model_parallel",
        "hierarchical_context_parallel_sizes",
    ),
    FieldUse(
        "model.sequence_parallel",
        "core/tensor_parallel/layers.py",
        "ColumnParallelLinear / RowParallelLinear",
        "sequence_parallel",
    ),
    FieldUse(
        "model.calculate_per_token_loss",
        "core/pipeline_parallel/schedules.py",
        "forward_step: loss scaling",
        "calculate_per_token_loss",
    ),
    FieldUse(
        "model.cp_comm_type", "core/extensions/transformer_engine.py", "TEDotProductAttention.__init__", "cp_comm_type"
    ),
    FieldUse(
        "model.window_size", "core/extensions/transformer_engine.py", "TEDotProductAttention.__init__", "window_size"
    ),
    FieldUse(
        "model.num_attention_heads", "core/transformer/attention.py", "Attention.__init__", "num_attention_heads"
    ),
    FieldUse("model.num_query_groups", "core/transformer/attention.py", "Attention.__init__", "num_query_groups"),
    FieldUse(
        "model.softmax_type", "core/extensions/transformer_engine.py", "TEDotProductAttention.__init__", "softmax_type"
    ),
    FieldUse(
        "model.attention_backend",
        "core/models/common/language_module/language_module.py",
        "LanguageModule._set_attention_backend (NVTE_*_ATTN); GPTModelProvider.provide (local)",
        "attention_backend",
    ),
    FieldUse(
        "model.attention_dropout",
        "core/extensions/transformer_engine.py",
        "TEDotProductAttention.__init__: TE's attention_dropout",
        "attention_dropout",
    ),
    FieldUse(
        "model.fp8_dot_product_attention",
        "core/fp8_utils.py",
        "get_fp8_recipe: the recipe's fp8_dpa",
        "fp8_dot_product_attention",
    ),
    FieldUse(
        "model.fp8_multi_head_attention",
        "core/extensions/transformer_engine.py",
        "TEDelayedScaling: the recipe's fp8_mha",
        "fp8_multi_head_attention",
    ),
    FieldUse(
        "model.transformer_layer_spec",
        "bridge/models/gpt_provider.py",
        "GPTModelProvider.provide",
        "transformer_layer_spec",
    ),
    FieldUse(
        "model.deterministic_mode",
        "core/extensions/transformer_engine.py",
        "TEDotProductAttention.__init__",
        "deterministic_mode",
    ),
    FieldUse(
        "model.cuda_graph_impl",
        "core/transformer/transformer_layer.py",
        "TransformerLayer.__call__ / _te_cuda_graph_replay",
        "cuda_graph_impl",
    ),
    FieldUse(
        "model.cuda_graph_modules",
        "core/transformer/transformer_layer.py",
        "TransformerLayer._te_cuda_graph_replay",
        "cuda_graph_modules",
    ),
    FieldUse(
        "model.cuda_graph_scope",
        "bridge/training/train.py",
        "train: FullCudaGraphWrapper for full_iteration",
        "cuda_graph_scope",
    ),
    FieldUse("model.mtp_num_layers", "core/models/gpt/gpt_model.py", "GPTModel.__init__ / forward", "mtp_num_layers"),
    FieldUse(
        "model.moe_token_dispatcher_type",
        "core/transformer/moe/moe_layer.py",
        "MoELayer.__init__",
        "moe_token_dispatcher_type",
    ),
    FieldUse(
        "model.moe_flex_dispatcher_backend",
        "core/transformer/moe/token_dispatcher.py",
        "MoEFlexTokenDispatcher",
        "moe_flex_dispatcher_backend",
    ),
    FieldUse(
        "model.moe_hybridep_pad_uneven_dispatch_inputs",
        "core/transformer/moe/token_dispatcher.py",
        "_HybridEPManager.setup_metadata",
        "moe_hybridep_pad_uneven_dispatch_inputs",
    ),
    FieldUse(
        "model.variable_seq_lengths",
        "core/pipeline_parallel/p2p_communication.py",
        "P2PCommunicator._communicate",
        "variable_seq_lengths",
    ),
    FieldUse(
        "mixed_precision", "bridge/training/mixed_precision.py", "update_config_with_precision_overrides", "fp8_recipe"
    ),
    FieldUse(
        "ddp.average_in_collective",
        "core/distributed/param_and_grad_buffer.py",
        "gradient reduce-scatter / all-reduce",
        "average_in_collective",
    ),
    FieldUse("ddp.use_megatron_fsdp", "bridge/training/setup.py", "setup: model wrapping", "use_megatron_fsdp"),
    FieldUse("dist.use_megatron_fsdp", "bridge/training/setup.py", "setup: model wrapping", "use_megatron_fsdp"),
    FieldUse("dist.use_torch_fsdp2", "bridge/training/setup.py", "setup: model wrapping", "use_torch_fsdp2"),
    FieldUse(
        "optimizer.overlap_param_gather_with_optimizer_step",
        "bridge/training/setup.py",
        "setup: _build_distributed_model",
        "overlap_param_gather_with_optimizer_step",
    ),
    FieldUse(
        "rng.data_parallel_random_init",
        "bridge/training/setup.py",
        "setup: _build_distributed_model",
        "data_parallel_random_init",
    ),
    FieldUse("rng.te_rng_tracker", "bridge/training/initialize.py", "_set_random_seed", "te_rng_tracker"),
    FieldUse(
        "model.use_transformer_engine_full_layer_spec",
        "bridge/models/gpt_provider.py",
        "default_layer_spec",
        "use_transformer_engine_full_layer_spec",
    ),
    FieldUse(
        "dist.eval_context_parallel_size",
        None,
        "nothing assigns GlobalState._eval_pgs (training/state.py), so evaluation runs at the training CP",
    ),
    FieldUse(
        "train.micro_batch_size", "bridge/training/utils/train_utils.py", "micro-batch calculator", "micro_batch_size"
    ),
    FieldUse(
        "train.global_batch_size",
        "bridge/training/utils/train_utils.py",
        "micro-batch calculator",
        "global_batch_size",
    ),
    FieldUse("validation.eval_micro_batch_size", "bridge/training/eval.py", "evaluate", "eval_micro_batch_size"),
    FieldUse("validation.eval_global_batch_size", "bridge/training/eval.py", "evaluate", "eval_global_batch_size"),
    FieldUse(
        "env_vars",
        "bridge/training/config.py",
        "runtime_config_update: exports them before the model is built",
        "env_vars",
    ),
    FieldUse(
        "dataset.dataset_root", "bridge/data/builders/gpt_sft.py", "resolve_gpt_sft_dataset_root", "dataset_root"
    ),
    FieldUse(
        "dataset.seq_length", "bridge/data/builders/gpt_sft.py", "GPT SFT dataset build (max_seq_length)", "seq_length"
    ),
    FieldUse("dataset.seed", "bridge/data/builders/gpt_sft.py", "GPT SFT dataset build", "seed"),
    FieldUse(
        "dataset.max_train_samples", "bridge/data/builders/gpt_sft.py", "GPT SFT dataset build", "max_train_samples"
    ),
    FieldUse("dataset.dataloader_type", "bridge/data/loaders.py", "build_pretraining_data_loader", "dataloader_type"),
    FieldUse("dataset.micro_batch_size", "bridge/data/builders/energon.py", "Energon loader", "micro_batch_size"),
    FieldUse(
        "dataset.enable_offline_packing",
        "bridge/training/gpt_step.py",
        "get_batch / packed metadata",
        "enable_offline_packing",
    ),
    FieldUse(
        "dataset.enable_in_batch_packing",
        "bridge/training/vlm_step.py",
        "get_batch: in-batch packing",
        "enable_in_batch_packing",
    ),
    FieldUse(
        "dataset.defer_in_batch_packing_to_step",
        "bridge/training/vlm_step.py",
        "get_batch",
        "defer_in_batch_packing_to_step",
    ),
    FieldUse(
        "dataset.pad_to_max_length", "bridge/data/builders/mock_vlm_sft.py", "collate padding", "pad_to_max_length"
    ),
    FieldUse(
        "dataset.packing_buffer_size",
        "bridge/data/builders/energon.py",
        "Energon online packing",
        "packing_buffer_size",
    ),
    FieldUse(
        "dataset.dataset_kwargs['pad_to_max_length']",
        "bridge/data/datasets/gpt_sft.py",
        "GPTSFTDataset.collate_fn",
        "pad_to_max_length",
    ),
    FieldUse(
        "dataset.dataset_kwargs['pad_seq_length_to_mult']",
        "bridge/data/datasets/gpt_sft.py",
        "GPTSFTDataset.collate_fn",
        "pad_seq_length_to_mult",
    ),
    FieldUse(
        f"{SPECS}.packed_sequence_size",
        "bridge/data/builders/gpt_sft.py",
        "packed dataset build",
        "packed_sequence_size",
    ),
    FieldUse(
        f"{SPECS}.pad_seq_to_mult",
        "bridge/data/builders/gpt_sft.py",
        "packed dataset build / prep",
        "pad_seq_to_mult",
    ),
    FieldUse(
        f"{SPECS}.max_single_sequence_length",
        "bridge/data/builders/gpt_sft.py",
        "packed dataset prep",
        "max_single_sequence_length",
    ),
    FieldUse(
        f"{SPECS}.pad_cu_seqlens",
        "bridge/data/packing/gpt_sft.py",
        "GPTSFTPackedDataset.collate_fn",
        "pad_cu_seqlens",
    ),
    FieldUse(
        f"{SPECS}.packed_train_data_path",
        "bridge/data/builders/gpt_sft.py",
        "packed dataset paths",
        "packed_train_data_path",
    ),
    FieldUse(
        f"{SPECS}.packed_val_data_path",
        "bridge/data/builders/gpt_sft.py",
        "packed dataset paths",
        "packed_val_data_path",
    ),
    FieldUse(
        f"{SPECS}.packed_metadata_path",
        "bridge/data/builders/gpt_sft.py",
        "packed dataset paths",
        "packed_metadata_path",
    ),
    FieldUse(
        "dataset.inter_document_masking",
        "core/datasets/gpt_dataset.py",
        "GPTDataset.__getitem__: cu_seqlens per sample",
        "inter_document_masking",
    ),
    FieldUse(
        "dataset.reset_attention_mask",
        "core/datasets/gpt_dataset.py",
        "_get_ltor_masks_and_position_ids",
        "reset_attention_mask",
    ),
    FieldUse(
        "dataset.reset_position_ids",
        "core/datasets/gpt_dataset.py",
        "_get_ltor_masks_and_position_ids",
        "reset_position_ids",
    ),
    FieldUse(
        "dataset.create_attention_mask",
        "core/datasets/gpt_dataset.py",
        "_get_ltor_masks_and_position_ids",
        "create_attention_mask",
    ),
    FieldUse(
        "dataset.skip_getting_attention_mask_from_dataset",
        "bridge/training/gpt_step.py",
        "get_batch_from_iterator",
        "skip_getting_attention_mask_from_dataset",
    ),
    FieldUse("dataset.num_workers", "bridge/data/loaders.py", "build_train_valid_test_data_loaders", "num_workers"),
    FieldUse(
        "dataset.do_validation", "bridge/data/builders/gpt_sft.py", "GPTSFTDatasetBuilder.build", "do_validation"
    ),
    FieldUse("validation.eval_iters", "bridge/data/loaders.py", "build_train_valid_test_data_loaders", "eval_iters"),
    FieldUse(
        "model.position_embedding_type",
        "core/models/gpt/gpt_model.py",
        "GPTModel._preprocess: rotary embeddings",
        "position_embedding_type",
    ),
    FieldUse(
        "model.hybrid_context_parallel",
        "core/pipeline_parallel/schedules.py",
        "forward_backward_no_pipelining",
        "hybrid_context_parallel",
    ),
    FieldUse(
        "model.tp_comm_overlap",
        "bridge/training/initialize.py",
        "_initialize_tp_communicators",
        "tp_comm_overlap",
    ),
    FieldUse(
        "comm_overlap.tp_comm_overlap",
        "bridge/training/comm_overlap.py",
        "CommOverlapConfig.setup",
        "tp_comm_overlap",
    ),
    FieldUse("model.is_hybrid_model", "bridge/training/gpt_step.py", "_forward_step_common", "is_hybrid_model"),
    FieldUse(
        "model.experimental_attention_variant",
        "core/transformer/transformer_config.py",
        "TransformerConfig.__post_init__ (DSA CP)",
        "experimental_attention_variant",
    ),
    FieldUse("model.num_moe_experts", "core/transformer/moe/router.py", "TopKRouter", "num_moe_experts"),
    FieldUse("checkpoint.load", "bridge/training/checkpointing.py", "load_checkpoint: train state", "load"),
    FieldUse("checkpoint.finetune", "bridge/training/checkpointing.py", "load_checkpoint", "finetune"),
    FieldUse(
        "dataset.dataset_kwargs['virtual_tokens']",
        "bridge/data/packing/gpt_sft.py",
        "GPTSFTPackedDataset.__init__ (asserts 0)",
        "virtual_tokens",
    ),
    FieldUse(
        "dataset.pad_to_multiple_of",
        "bridge/data/builders/direct_hf_sft.py",
        "build_direct_hf_sft_split (collate padding)",
        "pad_to_multiple_of",
    ),
    FieldUse(
        "model.fused_single_qkv_rope",
        "core/transformer/attention.py",
        "Attention.forward (split_qkv)",
        "fused_single_qkv_rope",
    ),
    FieldUse(
        "model.flash_decode",
        "core/transformer/attention.py",
        "Attention.forward (split_qkv)",
        "flash_decode",
    ),
    FieldUse(
        "model.no_rope_freq",
        "core/transformer/attention.py",
        "Attention.forward (rotary_pos_emb per layer)",
        "no_rope_freq",
    ),
    FieldUse(
        "model.qk_layernorm",
        "core/models/gpt/gpt_layer_specs.py",
        "q_layernorm / k_layernorm in the layer spec",
        "qk_layernorm",
    ),
    FieldUse(
        "model.rotary_interleaved",
        "core/models/gpt/gpt_model.py",
        "GPTModel.__init__ (YarnRotaryEmbedding)",
        "rotary_interleaved",
    ),
    FieldUse(
        "model.mamba_num_heads",
        "core/ssm/mamba_mixer.py",
        "MambaMixer.__init__",
        "mamba_num_heads",
    ),
    FieldUse(
        "model.mamba_num_groups",
        "core/ssm/mamba_mixer.py",
        "MambaMixer.__init__",
        "mamba_num_groups",
    ),
    FieldUse(
        "model.use_mamba_mem_eff_path",
        "core/ssm/mamba_mixer.py",
        "MambaMixer.forward",
        "use_mamba_mem_eff_path",
    ),
    FieldUse(
        "model.moe_router_topk",
        "core/transformer/moe/router.py",
        "TopKRouter",
        "moe_router_topk",
    ),
    FieldUse(
        "model.moe_router_load_balancing_type",
        "core/transformer/moe/router.py",
        "TopKRouter.__init__ (routing_type)",
        "moe_router_load_balancing_type",
    ),
    FieldUse(
        "model.moe_aux_loss_coeff",
        "core/transformer/moe/router.py",
        "TopKRouter aux losses",
        "moe_aux_loss_coeff",
    ),
    FieldUse(
        "model.moe_router_fusion",
        "core/transformer/moe/router.py",
        "TopKRouter.routing",
        "moe_router_fusion",
    ),
    FieldUse(
        "model.moe_router_num_groups",
        "core/transformer/moe/router.py",
        "TopKRouter.routing (group-limited)",
        "moe_router_num_groups",
    ),
    FieldUse(
        "model.moe_router_group_topk",
        "core/transformer/moe/router.py",
        "TopKRouter.routing (group-limited)",
        "moe_router_group_topk",
    ),
    FieldUse(
        "model.moe_router_score_function",
        "core/transformer/moe/router.py",
        "TopKRouter.routing",
        "moe_router_score_function",
    ),
    FieldUse(
        "model.moe_token_drop_policy",
        "core/transformer/moe/router.py",
        "TopKRouter.routing (token dropping)",
        "moe_token_drop_policy",
    ),
    FieldUse(
        "model.moe_apply_probs_on_input",
        "core/transformer/moe/experts.py",
        "TEGroupedMLP / SequentialMLP forward",
        "moe_apply_probs_on_input",
    ),
    FieldUse(
        "model.normalization",
        "core/extensions/transformer_engine.py",
        "TENorm.__new__",
        "normalization",
    ),
    FieldUse(
        "model.pipeline_model_parallel_comm_backend",
        "bridge/training/initialize.py",
        "initialize_model_parallel",
        "pipeline_model_parallel_comm_backend",
    ),
    FieldUse(
        "model.microbatch_group_size_per_vp_stage",
        "core/pipeline_parallel/schedules.py",
        "forward_backward_pipelining_with_interleaving",
        "microbatch_group_size_per_vp_stage",
    ),
    FieldUse(
        "model.rmsnorm",
        "bridge/models/falcon_h1/modeling_falconh1/falconh1_block.py",
        "FalconH1Stack (MambaMixer rmsnorm)",
        "rmsnorm",
    ),
    FieldUse(
        "dataset.dataset_kwargs['prompt_template']",
        "bridge/data/datasets/gpt_sft.py",
        "GPTSFTDataset._maybe_validate_prompt_template / _truncation",
        "prompt_template",
    ),
    FieldUse(
        "dataset.dataset_kwargs['label_key']",
        "bridge/data/datasets/gpt_sft.py",
        "GPTSFTDataset._maybe_validate_prompt_template / _truncation",
        "label_key",
    ),
    FieldUse(
        "dataset.dataset_kwargs['truncation_field']",
        "bridge/data/datasets/gpt_sft.py",
        "GPTSFTDataset._maybe_validate_prompt_template / _truncation",
        "truncation_field",
    ),
    FieldUse(
        "dataset.dataset_kwargs['answer_only_loss']",
        "bridge/data/packing/gpt_sft.py",
        "GPTSFTPackedDataset._build_loss_mask",
        "answer_only_loss",
    ),
    FieldUse(
        "dataset.dataset_kwargs['truncation_method']",
        "bridge/data/datasets/gpt_sft.py",
        "GPTSFTDataset._maybe_validate_prompt_template / _truncation",
        "truncation_method",
    ),
    FieldUse(
        "model.recompute_granularity",
        "core/transformer/multi_token_prediction.py",
        "MultiTokenPredictionBlock.forward (full recompute)",
        "recompute_granularity",
    ),
    FieldUse(
        "model.recompute_method",
        "core/transformer/multi_token_prediction.py",
        "MultiTokenPredictionLayer._checkpointed_forward",
        "recompute_method",
    ),
    FieldUse(
        "model.recompute_num_layers",
        "core/transformer/multi_token_prediction.py",
        "MultiTokenPredictionLayer._checkpointed_forward",
        "recompute_num_layers",
    ),
    FieldUse(
        "model.apply_query_key_layer_scaling",
        "core/extensions/transformer_engine.py",
        "TEDotProductAttention.__init__",
        "apply_query_key_layer_scaling",
    ),
    FieldUse(
        "train.manual_gc_interval",
        "bridge/training/train.py",
        "train (asserts >= 0)",
        "manual_gc_interval",
    ),
    FieldUse(
        "model.apply_rope_fusion",
        "bridge/models/qwen_vl/modelling_qwen3_vl/rope.py",
        "apply_rotary_pos_emb_absolute",
        "apply_rope_fusion",
    ),
    FieldUse(
        "ddp.num_distributed_optimizer_instances",
        "bridge/training/initialize.py",
        "initialize_model_parallel",
        "num_distributed_optimizer_instances",
    ),
    FieldUse("dist.use_sharp", "bridge/training/initialize.py", "initialize_model_parallel", "use_sharp"),
    FieldUse(
        "dist.sharp_enabled_group",
        "bridge/training/initialize.py",
        "initialize_model_parallel",
        "sharp_enabled_group",
    ),
    FieldUse(
        "dataset.drop_last",
        "bridge/data/loaders.py",
        "build_train_valid_test_data_loaders",
        "drop_last",
    ),
    FieldUse(
        "model.kv_channels",
        "core/extensions/transformer_engine.py",
        "TEDotProductAttention.__init__ (k_channels / v_channels: the head dims)",
        "kv_channels",
    ),
    FieldUse(
        "model.moe_shared_expert_overlap",
        "core/transformer/moe/moe_layer.py",
        "MoELayer.preprocess (latent projections)",
        "moe_shared_expert_overlap",
    ),
    # read by cuda_graphs.capture_host_reads through mbridge_seqpack.capture.conditions (the probed features)
    FieldUse(
        "model.apply_rope_fusion",
        "core/models/common/embeddings/rope_utils.py",
        "apply_rotary_pos_emb: fused or unfused THD RoPE",
        "apply_rope_fusion",
    ),
    FieldUse(
        "ddp.check_for_nan_in_grad",
        "core/distributed/param_and_grad_buffer.py",
        "_ParamAndGradBucketGroup.start_grad_sync -> check_grads",
        "check_for_nan_in_grad",
    ),
    FieldUse(
        "ddp.check_for_large_grads",
        "core/distributed/param_and_grad_buffer.py",
        "_ParamAndGradBucketGroup.start_grad_sync -> check_grads",
        "check_for_large_grads",
    ),
    FieldUse(
        "ddp.overlap_grad_reduce",
        "core/distributed/distributed_data_parallel.py",
        "DistributedDataParallel: grad sync from backward hooks",
        "overlap_grad_reduce",
    ),
    FieldUse(
        "rerun_state_machine.check_for_spiky_loss",
        "bridge/training/gpt_step.py",
        "forward_step: masked_next_token_loss(check_for_spiky_loss=...)",
        "check_for_spiky_loss",
    ),
    FieldUse(
        "logger.timing_log_level",
        "bridge/training/state.py",
        "GlobalState.timers: Timers(timing_log_level, ...)",
        "timing_log_level",
    ),
    FieldUse(
        "model.moe_expert_capacity_factor",
        "core/transformer/moe/token_dispatcher.py",
        "MoEAlltoAllTokenDispatcher.preprocess: drop and pad",
        "moe_expert_capacity_factor",
    ),
    FieldUse(
        "model.overlap_moe_expert_parallel_comm",
        "core/pipeline_parallel/schedules.py",
        "forward_backward_no_pipelining: combined_1f1b_schedule_for_no_pipelining",
        "overlap_moe_expert_parallel_comm",
    ),
    FieldUse(
        "model.moe_pad_expert_input_to_capacity",
        "core/transformer/moe/token_dispatcher.py",
        "MoEAlltoAllTokenDispatcher: drop_and_pad",
        "moe_pad_expert_input_to_capacity",
    ),
    FieldUse(
        "model.hybrid_layer_pattern",
        "bridge/models/hybrid/hybrid_provider.py",
        "HybridModelProvider.finalize / provide: layer kinds",
        "hybrid_layer_pattern",
    ),
    FieldUse(
        "model.hybrid_override_pattern",
        "bridge/models/hybrid/hybrid_provider.py",
        "HybridModelProvider.finalize: the deprecated layer pattern",
        "hybrid_override_pattern",
    ),
    FieldUse(
        "mixed_precision.fp8_recipe",
        "bridge/training/mixed_precision.py",
        "update_config_with_precision_overrides: copied onto the model (the recipe TE runs)",
        "fp8_recipe",
    ),
    FieldUse(
        "model.multi_latent_attention",
        "core/models/gpt/gpt_layer_specs.py",
        "get_gpt_layer_*_spec: MLA attention (its own RoPE kernels)",
        "multi_latent_attention",
    ),
)


def render_markdown() -> str:
    lines = [
        "# Fields the rules read, and where they are consumed at run time",
        "",
        "Generated from `devtools/field_uses.py` (`python scripts/generate.py`);",
        "a test checks that every field a rule names is listed and that each cited file of the",
        "installed Megatron-Bridge 0.6.2 / Megatron-Core 0.19.2 names it. Paths are under the `megatron` package.",
        "",
        "| field | consumed in | where |",
        "|---|---|---|",
    ]
    for use in FIELD_USES:
        where = f"`{use.consumer}`" if use.consumer else "**nowhere**"
        lines.append(f"| `{use.field}` | {where} | {use.function} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
