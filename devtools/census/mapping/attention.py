"""RoPE, Megatron-Core attention (TE wrapper, local, MLA) and the model-specific attention of Gemma and Qwen-VL."""

from __future__ import annotations

from devtools.census.mapping.common import (
    API_MISUSE,
    ARCHITECTURE,
    CHECKPOINT,
    ENVIRONMENT,
    INFERENCE,
    INVARIANT,
    enum_gap,
    known_value,
)
from devtools.census.verdicts import gap, groups, guarded, harmless, site, unreachable, validated

MB = "megatron/bridge/"
MC = "megatron/core/"
TE = "transformer_engine/pytorch/"

MODEL_HOST_READ = guarded(
    "cuda_graphs.capture_host_reads",
    "a host read of a device value in the model's forward (per micro batch): a sync outside graphs, illegal "
    "inside a full-iteration capture (the computed capture rule finds the reads the captured step makes)",
    ("model.cuda_graph_impl", "model.cuda_graph_scope"),
)
TRANSFORMER_CONFIG = validated(
    "TransformerConfig.__post_init__ (model.finalize() at validate()): heads and query groups divisible by TP, "
    "kv_channels / num_query_groups defaulted",
    "the division restates a bound the config already checked",
    ("model.num_attention_heads", "model.num_query_groups", "model.tensor_model_parallel_size"),
)
NON_TE_CP = guarded(
    "model.core_attention_cp",
    "a non-TE core attention (Megatron-Core's local DotProductAttention, Gemma-2's) built with CP>1",
    ("model.context_parallel_size", "model.transformer_layer_spec"),
)
NON_TE_PACKED = guarded(
    "model.core_attention_packing",
    "packed (THD) rows reaching a non-TE core attention at the first forward",
    ("dataset.enable_offline_packing", "dataset.enable_in_batch_packing", "model.transformer_layer_spec"),
)
STATIC_REPEAT = harmless("repeat_interleave by a Python int (heads per group): static shape, no host read")
FUSION_SHAPES = unreachable(
    "the Triton kernel's layout checks: Megatron-Core's MLA passes contiguous [t|s, h, d] tensors whose head "
    "dims come from the MLA config (qk_pos_emb_head_dim is 64 in every MLA provider)"
)

MAPPING = (
    # -- RoPE --------------------------------------------------------------------------------------------------
    *groups(
        MC + "models/common/embeddings/rope_utils.py",
        {
            "get_pos_emb_on_this_cp_rank": unreachable("the callers always pass the layer's CP group"),
            "_apply_rotary_pos_emb_thd": (
                MODEL_HOST_READ,
                site("cp_group must be provided", unreachable("the attention layer always passes its CP group")),
            ),
            "apply_rotary_pos_emb": ENVIRONMENT,
        },
    ),
    *groups(
        MC + "models/common/embeddings/yarn_rotary_pos_embedding.py",
        {
            "YarnRotaryEmbedding.get_emb": guarded(
                "rope.yarn_not_interleaved",
                "YaRN with rotary_interleaved asserts at the first forward (TransformerConfig does not check "
                "the pair)",
                ("model.rotary_interleaved", "model.position_embedding_type"),
            ),
        },
    ),
    *groups(
        MC + "models/common/embeddings/language_model_embedding.py",
        {"LanguageModelEmbedding.forward": unreachable("GPT models pass no tokentype_ids; BERT-style only")},
    ),
    *groups(
        MC + "fusions/fused_mla_yarn_rope_apply.py",
        {
            "ApplyMLARotaryEmbQ.forward": (
                FUSION_SHAPES,
                site(
                    "rotary_interleaved",
                    unreachable("MLA's fused path is taken only when rotary_interleaved is off (MLASelfAttention)"),
                ),
            ),
            "ApplyMLARotaryEmbQ.backward": FUSION_SHAPES,
            "ApplyMLARotaryEmbKV.forward": (
                FUSION_SHAPES,
                site(
                    "rotary_interleaved",
                    unreachable("MLA's fused path is taken only when rotary_interleaved is off (MLASelfAttention)"),
                ),
            ),
            "ApplyMLARotaryEmbKV.backward": FUSION_SHAPES,
        },
    ),
    *groups(
        TE + "attention/rope.py",
        {
            "FusedRoPEFunc.forward": unreachable("Megatron-Core passes 'sbhd' or 'thd'"),
            "FusedQKVRoPEFunc.forward": unreachable(
                "Megatron-Core's fused single-QKV RoPE path (fused_single_qkv_rope) passes contiguous sbhd"
            ),
            "apply_rotary_pos_emb": unreachable(
                "Megatron-Core calls TE's RoPE with fused=True (extensions/transformer_engine.py "
                "fused_apply_rotary_pos_emb[_thd]) and cu_seqlens for thd; the unfused branches and "
                "start_positions (inference) are not taken"
            ),
            "apply_fused_qkv_rotary_pos_emb": unreachable(
                "Megatron-Core takes the fused-QKV RoPE path only without packed_seq_params, inference context or "
                "qk layernorm (attention.py Attention.forward: split_qkv is True otherwise), so neither 'thd' nor "
                "start_positions reaches it"
            ),
        },
    ),
    *groups(
        MB + "models/qwen_vl/modelling_qwen3_vl/rope.py",
        {
            "_get_flat_packed_ranges": MODEL_HOST_READ,
            "get_packed_seq_attention_mask": (
                MODEL_HOST_READ,
                site("does not match its padded cu-seqlens", INVARIANT),
            ),
            "Qwen3VLMultimodalRotaryEmbedding.__init__": ARCHITECTURE,
            "_build_llm_rope_positions": MODEL_HOST_READ,
            "get_rope_index": MODEL_HOST_READ,
            "apply_rotary_pos_emb_absolute": guarded(
                "rope.qwen3_vl_no_fusion",
                "apply_rope_fusion=True on Qwen3-VL / Qwen3.5-VL asserts at the first forward (the providers "
                "leave it False and their provide() does not reset an override)",
                ("model.apply_rope_fusion",),
            ),
        },
    ),
    # -- Megatron-Core attention -----------------------------------------------------------------------------------
    *groups(
        MC + "transformer/attention.py",
        {
            "Attention.__init__": (
                TRANSFORMER_CONFIG,
                site("pg_collection", unreachable("the model builders pass a full process-group collection")),
            ),
            "Attention._checkpointed_attention_forward.custom_forward": harmless(
                "attn_mask_type is a CPU scalar tensor used to carry an enum through activation checkpointing"
            ),
            "Attention._get_pp_layer_offset_for_inference": INFERENCE,
            "Attention._adjust_key_value_for_inference": INFERENCE,
            "Attention.flash_decode": INFERENCE,
            "Attention._get_inference_softmax_offset": INFERENCE,
            "Attention._flash_attention_3_forward_wrapper": INFERENCE,
            "Attention._resolve_flash_version": INFERENCE,
            "Attention.flash_decode_and_prefill": INFERENCE,
            "Attention.forward": (
                INFERENCE,
                site(
                    "fused_single_qkv_rope requested",
                    guarded(
                        "rope.fused_single_qkv",
                        "fused_single_qkv_rope over packed rows asserts at the first forward: Attention.forward "
                        "sets split_qkv=True whenever packed_seq_params is passed (also with qk layernorm, "
                        "flash decode or no RoPE) and then asserts the fused path was not requested",
                        ("model.fused_single_qkv_rope", "dataset.enable_offline_packing", "model.qk_layernorm"),
                    ),
                ),
                site(
                    "attention_output_gate is not supported for unsplit",
                    unreachable("gated attention always splits QKV (get_query_key_value_tensors)"),
                ),
            ),
            "Attention.set_for_recompute_input_layernorm": API_MISUSE,
            "Attention.clip_qk": API_MISUSE,
            "SelfAttention.__init__": validated(
                "the layer spec and TransformerConfig (qk_layernorm) are chosen together by the providers",
                "spec / config consistency of the model provider",
            ),
            "SelfAttention.run_realtime_tests._compare": harmless("opt-in debugging check (run_realtime_tests)"),
            "SelfAttention.get_query_key_value_tensors": (
                INVARIANT,
                site("split_qkv not supported for gated", unreachable("gated attention is built with split_qkv")),
            ),
            "SelfAttention.clip_qk": harmless(
                "QK-clip (MuonClip, opt-in qk_clip): called by the optimizer after the step, not in the forward"
            ),
            "CrossAttention.__init__": unreachable("cross attention: encoder-decoder models only (T5)"),
            "CrossAttention.get_query_key_value_tensors": unreachable("cross attention: encoder-decoder models only"),
        },
    ),
    *groups(
        MC + "transformer/dot_product_attention.py",
        {
            "DotProductAttention.__init__": (
                TRANSFORMER_CONFIG,
                site("Context parallelism is only supported", NON_TE_CP),
                site("Softmax type not supported", known_value("model.softmax_type")),
            ),
            "DotProductAttention.forward": (
                STATIC_REPEAT,
                site("packed_seq_params is None", NON_TE_PACKED),
                site(
                    "attention_bias is None",
                    unreachable("attention_bias is passed only by T5 / relative-position models"),
                ),
            ),
        },
    ),
    *groups(
        MC + "transformer/multi_latent_attention.py",
        {
            "MultiLatentAttention.__init__": enum_gap("model.rope_type"),
            "MultiLatentAttention.forward": (
                INFERENCE,
                site("Rotary position embeddings should not be passed", INVARIANT),
                site("Attention bias should not be passed", INVARIANT),
                site("qkv_up_checkpoint is not None", INVARIANT),
            ),
            "MLASelfAttention.__init__": API_MISUSE,
            "MLASelfAttention.get_query_key_value_tensors": (
                INVARIANT,
                site(
                    "hybrid_context_parallel is not supported with MLA",
                    guarded(
                        "cp.hybrid_context_parallel",
                        "hybrid context parallel reaching MLA (local_cp_size set in PackedSeqParams)",
                        ("model.hybrid_context_parallel", "model.multi_latent_attention"),
                    ),
                ),
                site("Inference with MLA RoPE fusion", INFERENCE),
                site("Fused MLA RoPE apply is not imported", ENVIRONMENT),
                site("Caching MLA latents", INFERENCE),
            ),
            "MLASelfAttention.get_query_key_value_tensors.qkv_up_proj_and_rope_apply": INVARIANT,
            "MLASelfAttention.clip_qk": harmless("QK-clip (opt-in), called by the optimizer after the step"),
            "FusedMLASelfAttention.__init__": validated(
                "the fused-MLA spec is chosen by the provider only with q_lora_rank set", "spec / config"
            ),
            "FusedMLASelfAttention._qkv_down_projection": gap(
                (
                    "model.q_lora_rank",
                    "model.kv_lora_rank",
                    "model.qk_pos_emb_head_dim",
                    "model.tensor_model_parallel_size",
                ),
                "fused MLA down projection with q_lora_rank or kv_lora_rank + qk_pos_emb_head_dim not divisible "
                "by TP asserts at the first forward",
                general=True,
            ),
            "FusedMLASelfAttention.sharded_state_dict": CHECKPOINT,
        },
    ),
    # -- model-specific attention ----------------------------------------------------------------------------------
    *groups(
        MB + "models/gemma/gemma2_provider.py",
        {
            "Gemma2DotProductAttention.__init__": (TRANSFORMER_CONFIG, site("Context parallelism", NON_TE_CP)),
            "Gemma2DotProductAttention.forward": (
                STATIC_REPEAT,
                site("Packed sequence is not supported", NON_TE_PACKED),
            ),
            "Gemma2FlexDotProductAttention.forward": NON_TE_PACKED,
        },
    ),
    *groups(
        MB + "models/gemma/gemma3_provider.py",
        {
            "Gemma3SelfAttention.forward": unreachable(
                "Gemma3RotaryEmbedding always returns the (local, global) pair and no cos/sin (training)"
            ),
            "Gemma3RotaryEmbedding.__init__": ARCHITECTURE,
        },
    ),
    *groups(
        MB + "models/qwen_vl/modelling_qwen3_vl/attention.py",
        {
            "Qwen3VLSelfAttention._local_causal_attention": (
                TRANSFORMER_CONFIG,
                site("repeat_interleave", STATIC_REPEAT),
            ),
            "Qwen3VLSelfAttention.forward": INFERENCE,
        },
    ),
    *groups(
        MB + "models/qwen_vl/modelling_qwen3_vl/model.py",
        {
            "_is_packed_input_pre_sharded": (
                MODEL_HOST_READ,
                site(
                    "raise",
                    unreachable(
                        "qwen3_vl_step pads every row to a multiple of 2*CP*TP (_pad_and_pack_qwen3_vl_step) and "
                        "builds cu_seqlens from 0"
                    ),
                    "raise",
                ),
            ),
            "_get_cp_local_vision_embed_indices": (
                MODEL_HOST_READ,
                site("raise", INVARIANT, "raise"),
            ),
            "Qwen3VLModel.__init__": (
                unreachable("the Qwen3-VL provider builds encoder and decoder together with a full pg_collection"),
                site(
                    "dist train does not support context parallelism",
                    unreachable("dist-train (separate encoder ranks) is not exposed by Megatron-Bridge's providers"),
                ),
                site("use_hf_vision_model", unreachable("the provider never sets use_hf_vision_model")),
                site(
                    "calculate_per_token_loss enabled",
                    guarded(
                        "cp.finetune_per_token_loss",
                        "Qwen3-VL with CP>1 without per-token loss (the providers turn it on themselves at CP>1)",
                        ("model.calculate_per_token_loss", "model.context_parallel_size"),
                    ),
                ),
            ),
            "Qwen3VLModel._expose_language_model_for_cuda_graph_helper": guarded(
                "in_batch.no_cuda_graphs",
                "variable_seq_lengths is on only for in-batch packing under PP; graphs over it are refused",
                ("dataset.enable_in_batch_packing", "model.cuda_graph_impl"),
            ),
            "Qwen3VLModel.set_dist_train_input_tensors": unreachable("dist-train mode only (not exposed)"),
            "Qwen3VLModel.set_input_tensor": INVARIANT,
            "Qwen3VLModel.forward": (
                unreachable(
                    "qwen3_vl_step always passes input_ids and, for pre-sharded CP rows, rank-local position ids and "
                    "vision masks it built"
                ),
                site("not support inference", INFERENCE),
            ),
        },
    ),
    *groups(
        MB + "models/qwen_vl/modelling_qwen3_vl/text_model.py",
        {"Qwen3VLGPTModel.__init__": ARCHITECTURE},
    ),
    *groups(
        MB + "models/qwen_vl/modelling_qwen3_vl/transformer_block.py",
        {
            "Qwen3VLVisionTransformerBlock.__init__": unreachable("the vision encoder is never pipeline-split"),
            "Qwen3VLVisionTransformerBlock._checkpointed_forward": validated(
                "TransformerConfig.__post_init__: recompute_method in (block, uniform) under full recompute", "config"
            ),
            "Qwen3VLVisionTransformerBlock.forward": INVARIANT,
            "Qwen3VLVisionTransformerBlock.sharded_state_dict": CHECKPOINT,
            "Qwen3VLTransformerBlock._checkpointed_forward": validated(
                "TransformerConfig.__post_init__: recompute_method in (block, uniform) under full recompute", "config"
            ),
            "Qwen3VLTransformerBlock.forward": (
                INVARIANT,
                site(
                    "deepstack_visual_embeds should on the first pp-stage",
                    gap(
                        ("model.pipeline_model_parallel_size", "model.num_layers"),
                        "Qwen3-VL with a first pipeline stage holding fewer decoder layers than the deepstack "
                        "visual indexes asserts at the first forward",
                        general=True,
                    ),
                ),
            ),
        },
    ),
    *groups(
        MB + "models/qwen_vl/modelling_qwen3_vl/utils.py",
        {
            "split_part_by_cp_tp": INVARIANT,
            "split_deepstack_embs": (MODEL_HOST_READ, site("assert", INVARIANT, "assert")),
            "find_vision_id_index": (MODEL_HOST_READ, site("assert", INVARIANT, "assert")),
            "reorganize_inputs": (
                MODEL_HOST_READ,
                site("assert", harmless("data content: image / video token counts against grid_thw"), "assert"),
                site("should not have token_id", INVARIANT),
            ),
            "split_data_cp_rank": unreachable(
                "called with CP>1 and rows padded to 2*CP by qwen3_vl_step (_pad_and_pack_qwen3_vl_step)"
            ),
            "expand_thw": (
                MODEL_HOST_READ,
                site("assert", harmless("data content: grid_thw from the processor"), "assert"),
            ),
            "collapse_thw": (MODEL_HOST_READ, site("assert", INVARIANT, "assert")),
            "qwen2vl_pad_and_split": (MODEL_HOST_READ, site("assert", INVARIANT, "assert")),
            "qwen3vl_cp_split": INVARIANT,
            "get_vision_cp_data": (MODEL_HOST_READ, site("assert", INVARIANT, "assert")),
            "preprocess_packed_seqs": MODEL_HOST_READ,
        },
    ),
    *groups(
        MB + "models/qwen_vl/modelling_qwen3_vl/vision_model.py",
        {
            "_maybe_pad_vision_sequence_for_cuda_graph": gap(
                ("model.max_vision_cuda_graph_seq_length",),
                "vision-encoder CUDA graphs: an image batch with more patches than "
                "max_vision_cuda_graph_seq_length raises at that batch (data-dependent bound, no rule)",
                general=True,
            ),
            "Qwen3VLVisionModel.__init__": unreachable(
                "the provider builds the vision model unsplit (no PP) with its own CP=1 config"
            ),
            "Qwen3VLVisionModel.set_input_tensor": API_MISUSE,
            "Qwen3VLVisionModel.rot_pos_emb": MODEL_HOST_READ,
            "Qwen3VLVisionModel.fast_pos_embed_interpolate": MODEL_HOST_READ,
            "Qwen3VLVisionModel.forward": (INVARIANT, site("tolist", MODEL_HOST_READ, "tolist")),
            "Qwen3VLVisionModel.build_packed_seq_params": MODEL_HOST_READ,
        },
    ),
    *groups(MB + "models/qwen_vl/modeling_qwen25_vl.py", {"Qwen25VLModel.__init__": ENVIRONMENT}),
)
