"""Transformer Engine's DotProductAttention: the module, backend selection, the backends, context parallelism."""

from __future__ import annotations

from devtools.census.mapping.common import API_MISUSE, ENVIRONMENT, INFERENCE, INVARIANT, LOGGING, TE_PINNED
from devtools.census.verdicts import groups, guarded, site, unreachable, validated

TE = "transformer_engine/pytorch/attention/dot_product_attention/"
CPP = "transformer_engine/pytorch/cpp_extensions/"

#: the contract between Megatron-Core's TEDotProductAttention and TE's module
MCORE_CONTRACT = unreachable(
    "call contract: Megatron-Core's TEDotProductAttention passes CUDA q/k/v of one dtype and one class, head "
    "dims and GQA groups from its own config, qkv_format 'sbhd' or 'thd', int32 cu_seqlens for THD and a "
    "padding mask type with them, and no attention bias, ALiBi, score_mod or KV cache in training"
)
BACKEND = guarded(
    "attention.backend_available",
    "the backend TE selects decides it (get_attention_backend filters flash / fused / unfused by dtype, "
    "format, mask, window, softmax type, FP8 recipe, CP and device); the computed rule runs the selection for "
    "the config's attention inputs and refuses a config with no backend",
    ("model.attention_backend", "mixed_precision", "model.context_parallel_size", "model.window_size"),
)
TE_HOST_READ = guarded(
    "cuda_graphs.capture_host_reads",
    "a host read when max_seqlen is not given (Megatron-Core passes the batch's host max_seqlen): a sync outside "
    "graphs, illegal inside a capture",
    ("model.cuda_graph_impl", "model.cuda_graph_scope"),
)
CP_SEQ_EVEN = guarded(
    ("cp.seq_length_divisible", "gpt_sft.row_width_alignment", "collate.seq_length_alignment"),
    "each rank's BSHD/SBHD sequence must split into two chunks: every row width must be a multiple of 2*CP "
    "(seq_length for fixed rows, the collate's padding multiple for variable rows)",
    ("model.seq_length", "model.context_parallel_size", "dataset.dataset_kwargs['pad_seq_length_to_mult']"),
)
NO_BIAS = unreachable(
    "Megatron-Core's GPT / VLM attention passes no attention bias (core_attention_bias_type no_bias)"
)
NO_LOAD_BALANCE = unreachable(
    "no-load-balance THD partitioning: Megatron-Core 0.19 passes TE's default (load-balanced) strategy"
)
TE_CP_HELPERS = unreachable(
    "TE's own Python CP helpers (padding, position ids, batch split, per-document indices): Megatron-Core "
    "partitions with its own get_batch_on_this_cp_rank over the C++ tex.thd_get_partitioned_indices"
)
MIXED_THD = unreachable("mixed THD attention policies: an argument Megatron-Core never passes")
FLEX = unreachable("flex attention score_mod: an argument Megatron-Core never passes")
FP8_ATTN_MXFP8_SEQ = guarded(
    "fp8.mxfp8_attention_sequence",
    "MXFP8 attention (fp8_dpa with the MXFP8 recipe, SM100, BSHD/SBHD) asserts s_q % 128 == 0 and s_kv % 128 == "
    "0 on the rank-local sequence (and head dims % 32); backend selection does not check the length",
    ("model.fp8_dot_product_attention", "mixed_precision", "model.seq_length", "model.context_parallel_size"),
)

MAPPING = (
    *groups(
        TE + "dot_product_attention.py",
        {
            "_validate_thd_policy_sequence_ids": MIXED_THD,
            "_unpack_packed_qkv": unreachable("packed qkv_layer / kv_layer inputs: Megatron-Core passes q, k, v"),
            "DotProductAttention.__init__": validated(
                "TransformerConfig.__post_init__ (num_attention_heads % num_query_groups)", "config"
            ),
            "DotProductAttention.set_context_parallel_group": API_MISUSE,
            "DotProductAttention.get_qkv_quantization_capabilities": (
                INVARIANT,
                site(
                    "Unsupported CustomRecipe quantizer",
                    unreachable("custom FP8 recipes: Megatron-Bridge's mixed-precision recipes never build one"),
                ),
            ),
            "DotProductAttention._forward_thd_mask_types_with_padding": MIXED_THD,
            "DotProductAttention._forward_thd_mask_types_grouped": MIXED_THD,
            "DotProductAttention._forward_thd_mask_types": MIXED_THD,
            "DotProductAttention.forward": (
                MCORE_CONTRACT,
                site("Mixed THD", MIXED_THD),
                site("thd_attention_polic", MIXED_THD),
                site("sequence_ids", MIXED_THD),
                site("bottom_right_diagonal must be a bool", MIXED_THD),
                site("mask_type must be a string", MIXED_THD),
                site("support only padding mask types", MIXED_THD),
                site("rng_states_tracker", unreachable("Megatron-Core passes its CudaRNGStatesTracker")),
                site("graph_safe_rng_available", TE_PINNED),
                site(
                    "DotProductAttention only",
                    unreachable("FP8 attention dtypes: TE's own FP8 recipes give E4M3 / E5M2 (checked by TE itself)"),
                    "assert",
                ),
                site("softcap must be finite", validated("softcap from the model config (Gemma-2 providers)", "cfg")),
                site(".item()", TE_HOST_READ),
                site("score_mod", FLEX),
                site("Flex Attention", FLEX),
                site("KV caching requires padding", INFERENCE),
                site("Layer number must be set", INVARIANT),
                site("alibi", NO_BIAS),
                site("No dot product attention backend is available", BACKEND),
            ),
        },
    ),
    *groups(
        TE + "utils.py",
        {
            "get_attention_backend": NO_BIAS,
            "get_padding_mask": unreachable(
                "padding masks built from cu_seqlens: the unfused backend's path for 'padding' with BSHD inputs "
                "and a mask, which Megatron-Core's THD path does not take (it passes cu_seqlens, no mask)"
            ),
            "get_alibi": NO_BIAS,
            "get_cu_seqlens_and_indices": unreachable(
                "THD conversion of a BSHD padding mask (the unfused / FA2 padding path): Megatron-Core passes THD "
                "tensors with cu_seqlens itself"
            ),
            "PackTensors.forward": INVARIANT,
            "get_qkv_layout": (
                MCORE_CONTRACT,
                site(
                    "cannot be detected under torch.compile",
                    unreachable("torch.compile of the attention module: not a Megatron-Bridge option"),
                ),
            ),
            "check_set_window_size": validated(
                "TransformerConfig.__post_init__ / TEDotProductAttention: window_size matches the mask type "
                "(causal layers get (w, 0))",
                "config",
                ("model.window_size",),
            ),
            "get_attention_quantizers": BACKEND,
            "print_quantizers": LOGGING,
            "mxfp8_quantize_only": BACKEND,
            "mxfp8_transpose_swizzle": BACKEND,
            "combine_and_quantize": (
                BACKEND,
                site("MXFP8 quantization requires s_q % 128", FP8_ATTN_MXFP8_SEQ),
                site("combined_qkv does not match", INVARIANT),
                site("combined_kv does not match", INVARIANT),
                site("Invalid qkv_layout", INVARIANT),
            ),
            "combine_and_dequantize": INVARIANT,
        },
    ),
    *groups(
        TE + "backends.py",
        {
            "<module>": ENVIRONMENT,
            "_qkv_quantizer_type": BACKEND,
            "FP8EmulationFunc.onnx_forward": unreachable("ONNX export only"),
            "UnfusedDotProductAttention._forward": (
                MCORE_CONTRACT,
                site("repeat_interleave", unreachable("repeat by a Python int (heads per group): static shape")),
                site("core_attention_bias", NO_BIAS),
            ),
            "FlashAttention.__init__": ENVIRONMENT,
            "FlashAttention.forward": (
                MCORE_CONTRACT,
                site("Padding mask not supported with context parallelism", BACKEND),
                site(".item()", TE_HOST_READ),
                site("Alibi", NO_BIAS),
                site("softcap is not supported", BACKEND),
            ),
            "_fused_attn_forward_impl": INVARIANT,
            "FusedAttention.forward": (
                MCORE_CONTRACT,
                site("No fused attention backend supports", BACKEND),
                site("Padding mask not supported with context parallelism", BACKEND),
                site("Please provide attention_mask or cu_seqlens", MCORE_CONTRACT),
                site("cuDNN attention sub-backend", BACKEND),
                site("fp8_meta is not None", INVARIANT),
                site(
                    "Amax reduction across TP+CP",
                    unreachable("DelayedScaling.reduce_amax defaults to True and Megatron-Core never turns it off"),
                ),
                site("does not work with context parallelism", BACKEND),
                site("is not supported with context parallelism", NO_BIAS),
            ),
        },
    ),
    *groups(
        TE + "softmax.py",
        {"FusedScaleMaskSoftmax.forward": MCORE_CONTRACT},
    ),
    *groups(
        CPP + "fused_attn.py",
        {
            "<module>": ENVIRONMENT,
            "fused_attn_fwd": (BACKEND, site("attn_bias", NO_BIAS)),
            "fused_attn_bwd": BACKEND,
        },
    ),
    *groups(
        TE + "context_parallel.py",
        {
            "_reject_custom_recipe_under_cp": unreachable(
                "custom FP8 recipes: Megatron-Bridge's mixed-precision recipes never build one"
            ),
            "get_thd_partitioned_indices": TE_CP_HELPERS,
            "validate_no_load_balance_thd_metadata": NO_LOAD_BALANCE,
            "get_no_load_balance_thd_causal_metadata": NO_LOAD_BALANCE,
            "thd_sequence_order_to_cp_rank_order": NO_LOAD_BALANCE,
            "thd_cp_rank_order_to_sequence_order": NO_LOAD_BALANCE,
            "flash_attn_a2a_communicate": (
                INVARIANT,
                site(
                    "requires cu_seqlens",
                    unreachable(
                        "attn_forward_func_with_cp asserts cu_seqlens_padded for THD first (mapped there); the "
                        "a2a helper is reached with them"
                    ),
                ),
            ),
            "AttnFuncWithCPAndKVP2P.forward": (
                MCORE_CONTRACT,
                site("FP8 is only supported with Fused Attention", BACKEND),
                site("Sequence length per GPU needs to be divisible by 2", CP_SEQ_EVEN),
                site("attn_bias", NO_BIAS),
                site("divisible requirements", NO_BIAS),
            ),
            "AttnFuncWithCPAndKVP2P.backward": BACKEND,
            "AttnFuncWithCPAndKVAllGather.forward": (
                MCORE_CONTRACT,
                site("THD format requires padding mask", MCORE_CONTRACT),
                site("padding' not in attn_mask_type", MCORE_CONTRACT),
                site("attn_bias_type == 'no_bias'", NO_BIAS),
                site("window_size == (-1, 0)", BACKEND),
                site("requires seq_len % 2 == 0", CP_SEQ_EVEN),
                site("Sequence length per GPU needs to be divisible by 2", CP_SEQ_EVEN),
                site("FP8 is only supported with FusedAttention", BACKEND),
            ),
            "AttnFuncWithCPAndKVAllGather.backward": BACKEND,
            "AttnFuncWithCPAndQKVOA2A.forward": (
                MCORE_CONTRACT,
                site("attn_bias_type == 'no_bias'", NO_BIAS),
                site("window_size == (-1, 0)", BACKEND),
                site("requires seq_len % 2 == 0", CP_SEQ_EVEN),
                site(
                    "num_heads % cp_size",
                    guarded(
                        "cp.a2a_heads_divisible",
                        "a2a CP scatters the rank-local heads (query and key/value groups) over the a2a group",
                        ("model.num_attention_heads", "model.num_query_groups", "model.cp_comm_type"),
                    ),
                ),
                site("FP8 is only supported with FusedAttention", BACKEND),
            ),
            "AttnFuncWithCPAndQKVOA2A.backward": BACKEND,
            "attn_forward_func_with_cp": (
                MCORE_CONTRACT,
                site(
                    "requires cp_group = [a2a_cp_group, p2p_cp_group]",
                    guarded(
                        ("cp.hierarchical_sizes_required", "cp.hierarchical_sizes_product"),
                        "a2a+p2p without hierarchical CP groups (hierarchical_context_parallel_sizes unset)",
                        ("model.cp_comm_type", "model.hierarchical_context_parallel_sizes"),
                    ),
                ),
                site("bias type is not supported with hierarchical", NO_BIAS),
                site("cp_group must be", unreachable("Megatron-Core passes its CP process group")),
                site("load_balancing_strategy", API_MISUSE),
                site("No-load-balance", NO_LOAD_BALANCE),
                site("is_graph_capturing", NO_LOAD_BALANCE),
                site("equal local Q/K/V", NO_LOAD_BALANCE),
                site("shared Q/KV sequence", NO_LOAD_BALANCE),
                site("FlashAttention backend with qkv_format = 'sbhd'", BACKEND),
                site("attention bias with FusedAtt", NO_BIAS),
                site(
                    "cu_seqlens_padded can not be None",
                    guarded(
                        "offline.alignment_multiple",
                        "THD under CP without padded cu_seqlens: the FusedAttention backend fills them from "
                        "cu_seqlens itself (backends.py FusedAttention.forward), FlashAttention does not; the "
                        "collates omit them only for packs aligned to 1 (pad_seq_to_mult=1), which the rule "
                        "refuses at CP>1 (in-batch packing aligns to lcm(2*CP, CP*TP) > 1)",
                        ("dataset.offline_packing_specs.pad_seq_to_mult", "model.context_parallel_size"),
                    ),
                ),
                site(
                    "sliding window attention with cp_comm_type",
                    guarded(
                        "cp.sliding_window_comm_type",
                        "windowed layers with p2p or a2a+p2p CP",
                        ("model.window_size", "model.cp_comm_type"),
                    ),
                ),
                site("softmax_type == 'vanilla' or use_fused_attention", BACKEND),
                site(
                    "with cp_comm_type = 'a2a'",
                    guarded(
                        "cp.softmax_type_comm_type",
                        "a non-vanilla softmax (sinks, off-by-one) under CP needs a2a",
                        ("model.softmax_type", "model.cp_comm_type"),
                    ),
                ),
                site("Before cuDNN 9.18.0", BACKEND),
                site(
                    "Unsupported communication type",
                    guarded(
                        "cp.comm_type_known",
                        "a cp_comm_type TE does not know ('p2p', 'all_gather', 'a2a', 'a2a+p2p')",
                        ("model.cp_comm_type",),
                    ),
                ),
            ),
            "pad_thd_sequences_for_cp": TE_CP_HELPERS,
            "generate_positional_ids_for_cp": TE_CP_HELPERS,
            "get_batch_on_this_cp_rank": TE_CP_HELPERS,
            "get_batch_on_this_cp_rank.process_tensor": TE_CP_HELPERS,
        },
    ),
)
