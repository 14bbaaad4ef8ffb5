"""Megatron-Core's Transformer Engine wrappers (extensions/transformer_engine.py)."""

from __future__ import annotations

from devtools.census.mapping.common import (
    API_MISUSE,
    CHECKPOINT,
    ENVIRONMENT,
    INVARIANT,
    SPEC_BUILD,
    TE_PINNED,
    config_class,
    known_value,
)
from devtools.census.verdicts import groups, guarded, harmless, site, unreachable, validated

F = "megatron/core/extensions/transformer_engine.py"

QUANT_FILE = harmless(
    "content of a per-module quantization config (model.quant_recipe, a YAML the MLM-compat path loads): "
    "raised with its message when the model is built; not packing-specific",
    ("model.quant_recipe",),
)
TE_LINEAR_TP = validated(
    "TransformerConfig.__post_init__ (model.finalize() at validate()): hidden / FFN / head sizes divisible by TP",
    "the division restates a bound the config already checked",
    ("model.tensor_model_parallel_size",),
)
UB_NAME = unreachable(
    "Megatron-Core's layer specs pass tp_comm_buffer_name for every linear when tp_comm_overlap is on "
    "(attention.py / mlp.py: 'qkv', 'proj', 'fc1', 'fc2')"
)
FUSED_HOOKS = unreachable(
    "fused TE modules refuse hooks on their submodules; Megatron-Bridge registers none on them (opt-in fused "
    "MLP / residual RMSNorm)"
)

MAPPING = groups(
    F,
    {
        "TEQuantizationRecipe.parse_from_config": QUANT_FILE,
        "TEQuantizationParams.parse_from_config": QUANT_FILE,
        "_get_fp8_model_init_for_quant_recipe": QUANT_FILE,
        "_get_fp8_autocast_for_quant_recipe": QUANT_FILE,
        "_gtp_pre_init": validated(
            "TransformerConfig.__post_init__: generalized-TP split sizes",
            "config",
            ("model.tensor_model_parallel_size",),
        ),
        "TEActivationOp.__new__": validated(
            "use_te_activation_func with an unsupported activation: TransformerConfig.__post_init__", "config"
        ),
        "TEFusedResidualRMSNorm._register_hooks_on_fused_impl.forward_pre_hook": FUSED_HOOKS,
        "TEFusedResidualRMSNorm._register_hooks_on_fused_impl.forward_post_hook": FUSED_HOOKS,
        "TEFusedResidualRMSNorm._register_hooks_on_fused_impl": FUSED_HOOKS,
        "TENorm.__new__": (
            known_value("model.normalization"),
            site(
                "Fused residual is only supported",
                config_class(
                    "TransformerConfig.__post_init__: fused_residual_rmsnorm needs RMSNorm", ("model.normalization",)
                ),
            ),
            site("Transformer Engine is not installed", ENVIRONMENT),
            site("hasattr(te.pytorch", TE_PINNED),
            site("TEFusedResidualRMSNorm is not None", TE_PINNED),
        ),
        "TELinear.__init__": (
            SPEC_BUILD,
            site("Transformer Engine is not installed", ENVIRONMENT),
            site("delay_wgrad_compute", TE_PINNED),
            site("Buffer name should be set", UB_NAME),
            site("is_torch_min_version", TE_PINNED),
            site("is_te_min_version", TE_PINNED),
            site("divide(", TE_LINEAR_TP),
        ),
        "TELinear.sharded_state_dict": CHECKPOINT,
        "TELayerNormColumnParallelLinear.__init__": (
            SPEC_BUILD,
            site("Transformer Engine is not installed", ENVIRONMENT),
            site("delay_wgrad_compute", TE_PINNED),
            site("does not support {self.config.normalization}", TE_PINNED),
            site("Buffer name should be set", UB_NAME),
            site("is_torch_min_version", TE_PINNED),
            site("is_te_min_version", TE_PINNED),
            site("divide(", TE_LINEAR_TP),
        ),
        "TEColumnParallelLinear.__init__": (
            SPEC_BUILD,
            site("Transformer Engine is not installed", ENVIRONMENT),
            site("divide(", TE_LINEAR_TP),
        ),
        "TELMHeadColumnParallelLinear.__init__": (
            validated("TransformerConfig.__post_init__: fp8_output_proj needs fp8 with the mxfp8 recipe", "config"),
            site("divide(", TE_LINEAR_TP),
        ),
        "TELMHeadColumnParallelLinear.forward": unreachable("GPTModel passes no runtime weight to the TE LM head"),
        "TERowParallelLinear.__init__": (
            SPEC_BUILD,
            site("Transformer Engine is not installed", ENVIRONMENT),
            site("divide(", TE_LINEAR_TP),
        ),
        "TEDotProductAttention.__init__": (
            TE_PINNED,
            site("Transformer Engine is not installed", ENVIRONMENT),
            site(
                "apply_query_key_layer_scaling",
                guarded(
                    "te.qk_layer_scaling_env",
                    "apply_query_key_layer_scaling must equal NVTE_APPLY_QK_LAYER_SCALING in the environment; a "
                    "mismatch raises when the model is built, after the GPUs are allocated",
                    ("model.apply_query_key_layer_scaling", "env_vars"),
                ),
            ),
            site("hasattr(pg_collection", unreachable("the model builders pass a full process-group collection")),
            site(
                "deterministic_mode is on",
                guarded(
                    "determinism.te_attention_env",
                    "deterministic_mode without NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 raises when the model is built",
                    ("model.deterministic_mode",),
                ),
            ),
        ),
        "TEDotProductAttention.forward": (
            TE_PINNED,
            site(
                "local_cp_size must be == 1",
                guarded(
                    "cp.hybrid_context_parallel",
                    "hybrid CP's per-sample local CP size reaching TE attention without its CP group",
                    ("model.hybrid_context_parallel",),
                ),
            ),
        ),
        "TEGroupedLinear.__init__": (
            SPEC_BUILD,
            site("delay_wgrad_compute", TE_PINNED),
            site("divide(", TE_LINEAR_TP),
        ),
        "TEGroupedLinear._split_grouped_checkpoint_tensor": CHECKPOINT,
        "TEGroupedLinear._encode_extra_state": CHECKPOINT,
        "TEGroupedLinear._decode_extra_state": CHECKPOINT,
        "TEGroupedLinear._sharded_state_dict_grouped.get_gemm_tensor": CHECKPOINT,
        "TEGroupedLinear._sharded_state_dict_grouped": CHECKPOINT,
        "TEFusedMLP._make_fused_impl": SPEC_BUILD,
        "TEFusedMLP._make_activation_op": validated(
            "TransformerConfig.__post_init__ (use_te_op_fuser / fused MLP activation)", "config"
        ),
        "TEFusedMLP._register_hooks_on_fused_impl.forward_pre_hook": FUSED_HOOKS,
        "TEFusedMLP._register_hooks_on_fused_impl.forward_post_hook": FUSED_HOOKS,
        "TEFusedMLP._register_hooks_on_fused_impl": FUSED_HOOKS,
        "TEFusedMLP.as_mlp_submodule": INVARIANT,
        "TEFusedMLPWithGroupedLinear.__init__": (
            TE_PINNED,
            site(
                "does not support add_bias_linear",
                validated("the CuTeGEMM fused-MLP spec is chosen only for bias-free SwiGLU experts", "spec"),
            ),
            site("requires SwiGLU", validated("the CuTeGEMM fused-MLP spec is chosen only for SwiGLU", "spec")),
        ),
        "TEFusedMLPWithGroupedLinear._make_fused_impl": SPEC_BUILD,
        "TEDelayedScaling.__init__": ENVIRONMENT,
        "TECudaRNGStatesTracker.__init__": ENVIRONMENT,
        "te_checkpoint": ENVIRONMENT,
        "fused_apply_rotary_pos_emb": TE_PINNED,
        "fused_apply_rotary_pos_emb_thd": TE_PINNED,
        "set_save_original_input": API_MISUSE,
    },
)
