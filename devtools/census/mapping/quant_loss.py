"""FP8 / MXFP8 / NVFP4 (Megatron-Core helpers, TE quantization state, GEMM, quantized tensors) and the loss and
gradient checks."""

from __future__ import annotations

from devtools.census.mapping.common import (
    API_MISUSE,
    INFERENCE,
    INVARIANT,
    LOGGING,
    TE_PINNED,
    known_value,
)
from devtools.census.verdicts import gap, groups, guarded, harmless, site, unreachable, validated

MC = "megatron/core/"
TE = "transformer_engine/pytorch/"
MB = "megatron/bridge/"

FP8_PARAMS = unreachable(
    "FP8 / FP4 parameter storage (fp8_param_gather, distributed-optimizer shards, FSDP): weights, not the shape "
    "or values of packed data"
)
QTENSOR = unreachable(
    "quantized-tensor internals (views, usages, storage copies, FSDP2 transport) driven by TE's own modules with "
    "the quantizers the recipe built; no config value reaches them except through the GEMM input shapes, which "
    "the quantizers check in C++ (listed by hand)"
)
RECIPE = known_value("model.fp8", "model.fp8_recipe", "model.fp4_recipe")
#: TE recipe objects Megatron-Core built
TE_RECIPE_OBJECT = unreachable(
    "TE recipe state built from the recipe object Megatron-Core's get_fp8_recipe / get_fp4_recipe made (which "
    "refuses unknown names first)"
)
FP8_DIMS = guarded(
    "fp8.packed_tokens_per_rank",
    "TE's FP8 GEMM input check: the product of the leading (token) dimensions divisible by 8 and the hidden "
    "dimension by 16 on the rank-local input",
    ("mixed_precision", "dataset.offline_packing_specs.packed_sequence_size", "model.context_parallel_size"),
)
NAN_DETECTOR = harmless(
    "a detector, not a cause: raises (fatal) only when the forward / backward already produced NaN / Inf; the "
    "config mechanisms that produce NaN are mapped where they happen",
    ("rerun_state_machine.check_for_nan_in_loss", "ddp.check_for_nan_in_grad"),
)

MAPPING = (
    *groups(
        MC + "fp8_utils.py",
        {
            "get_grouped_quantized_members": FP8_PARAMS,
            "copy_tensor_to_quantized_param": FP8_PARAMS,
            "modify_grouped_tensor_rowwise_storage": FP8_PARAMS,
            "_resolve_callable_from_python_import_path": harmless(
                "custom FP8 quantizer factory path (fp8_quantizer_factory): an import error with its message when "
                "the model is built; not packing-specific",
                ("model.fp8_quantizer_factory",),
            ),
            "_get_custom_recipe": TE_PINNED,
            "_quantize_param_shard_impl": FP8_PARAMS,
            "_modify_underlying_storage_impl": FP8_PARAMS,
            "get_fp8_recipe": (
                RECIPE,
                site("fp8_quantizer_factory is not None", validated("TransformerConfig: custom recipe", "config")),
                site("Please make sure to use TransformerEngine version", TE_PINNED),
            ),
            "get_fp8_context": validated(
                "TransformerConfig.__post_init__: 'Delayed scaling does not support first / last layer in BF16' "
                "(model.finalize() at validate())",
                "the same condition, refused at config time",
                ("model.first_last_layers_bf16", "mixed_precision"),
            ),
            "prepare_model_for_fp8_inference": INFERENCE,
        },
    ),
    *groups(
        MC + "fp4_utils.py",
        {
            "get_nvfp4_rowwise_packed_shape": FP8_PARAMS,
            "modify_nvfp4_rowwise_storage": FP8_PARAMS,
            "modify_grouped_nvfp4_rowwise_storage": FP8_PARAMS,
            "quantize_nvfp4_param_shard": FP8_PARAMS,
            "dequantize_fp4_tensor": FP8_PARAMS,
            "get_fp4_recipe": (RECIPE, site("TE version", TE_PINNED), site("TransformerEngine version", TE_PINNED)),
        },
    ),
    *groups(
        TE + "utils.py",
        {
            "interleave_glu_tensor": unreachable("GLU weight interleaving for fused MoE kernels: weights, not data"),
            "all_close": harmless("test helper, not called on the training path"),
            "ensure_divisibility": unreachable(
                "the helper behind divide(): each call site is listed as a check_call site with its own verdict"
            ),
            "divide": unreachable("the helper behind divide() call sites (mapped at each call)"),
            "mark_grouped_tensor": INVARIANT,
            "split_tensor_along_dim": INVARIANT,
            "SplitAlongDim.backward": INVARIANT,
            "validate_ctx_manager": API_MISUSE,
            "validate_rng_states_func": API_MISUSE,
            "assert_viewless_tensor": INVARIANT,
            "safely_set_viewless_tensor_data": INVARIANT,
            "assert_dim_for_fp8_exec": FP8_DIMS,
            "ceil_div": INVARIANT,
            "round_up_to_nearest_multiple": INVARIANT,
            "nvtx_range_pop": LOGGING,
            "_WeakRefTensor.torch_dtype_to_np_typestr": INFERENCE,
            "make_weak_ref.convert_to_torch_tensor": INFERENCE,
            "make_weak_ref": INFERENCE,
        },
    ),
    *groups(
        TE + "quantization.py",
        {
            "check_recipe_support": (
                unreachable("torch.compile: not a Megatron-Bridge option"),
                site(
                    "unsupported_reason",
                    gap(
                        ("mixed_precision",),
                        "an FP8 / MXFP8 / NVFP4 recipe the GPU does not support (MXFP8 / NVFP4 before Blackwell, "
                        "FP8 before Hopper) raises when the first autocast is entered, after the model is built",
                        general=True,
                    ),
                ),
            ),
            "get_default_fp8_recipe": unreachable("torch.compile: not a Megatron-Bridge option"),
            "get_fp4_te_dtype": TE_RECIPE_OBJECT,
            "FP8GlobalStateManager.fp8_graph_capturing": INVARIANT,
            "FP8GlobalStateManager.autocast_enter": gap(
                ("mixed_precision",),
                "an FP8 / MXFP8 / FP8-block / NVFP4 recipe the GPU does not support asserts at the first autocast",
                general=True,
            ),
            "autocast.__enter__": INVARIANT,
            "RecipeState._validate_roles": INVARIANT,
            "RecipeState.create": TE_RECIPE_OBJECT,
            "MXFP8BlockScalingRecipeState.make_quantizers": INVARIANT,
            "Float8BlockScalingRecipeState.make_quantizers": INVARIANT,
            "NVFP4BlockScalingRecipeState.make_quantizers._make": TE_RECIPE_OBJECT,
            "NVFP4BlockScalingRecipeState.make_quantizers": INVARIANT,
            "_handle_delayed_scaling_requests": unreachable("custom FP8 recipes: not built by Megatron-Bridge"),
            "CustomRecipeState.__init__": unreachable("custom FP8 recipes: not built by Megatron-Bridge"),
            "CustomRecipeState.make_quantizers": unreachable("custom FP8 recipes: not built by Megatron-Bridge"),
        },
    ),
    *groups(
        TE + "cpp_extensions/gemm.py",
        {
            "get_cublas_workspace": INVARIANT,
            "validate_gemm_scale": INVARIANT,
            "_nvfp4_row_scaled_gemm_inputs": INVARIANT,
            "_unwrap_tensor": INVARIANT,
            "_validate_native_gemm_output_quantizer": unreachable("custom quantizers: not built by Megatron-Bridge"),
            "general_gemm": unreachable(
                "call contract of TE's own modules (layouts, userbuffer arguments, row-scaled NVFP4 operands); the "
                "operand-shape requirements of FP8 / FP4 GEMMs are C++ checks (listed by hand)"
            ),
            "general_grouped_gemm": INVARIANT,
            "_get_grouped_cublas_workspace": INVARIANT,
            "general_grouped_gemm_for_grouped_tensor": INVARIANT,
        },
    ),
    *groups(TE + "tensor/float8_tensor.py", {"*": QTENSOR}),
    *groups(TE + "tensor/mxfp8_tensor.py", {"*": QTENSOR}),
    *groups(TE + "tensor/nvfp4_tensor.py", {"*": QTENSOR}),
    *groups(TE + "tensor/float8_blockwise_tensor.py", {"*": QTENSOR}),
    *groups(TE + "tensor/storage/float8_tensor_storage.py", {"*": QTENSOR}),
    *groups(TE + "tensor/storage/mxfp8_tensor_storage.py", {"*": QTENSOR}),
    *groups(TE + "tensor/storage/nvfp4_tensor_storage.py", {"*": QTENSOR}),
    *groups(TE + "tensor/storage/float8_blockwise_tensor_storage.py", {"*": QTENSOR}),
    # -- loss and gradient checks ------------------------------------------------------------------------------
    *groups(
        MC + "tensor_parallel/cross_entropy.py",
        {
            "_VocabParallelCrossEntropy.forward": validated(
                "TransformerConfig / the loss config: label_smoothing in (0, 1) when set", "config"
            )
        },
    ),
    *groups(
        MC + "rerun_state_machine.py",
        {
            "RerunStateMachine.validate_result": (
                NAN_DETECTOR,
                site("outside of the forward-backward pass", INVARIANT),
                site("initial_result is not None", INVARIANT),
                site("Should not be here", INVARIANT),
            ),
            "RerunStateMachine.is_unexpectedly_large": guarded(
                "cuda_graphs.capture_host_reads",
                "the spiky-loss / large-grad checks read the value on the host (once per step outside graphs); "
                "ConfigContainer.validate turns off only check_for_nan_in_loss under full-iteration graphs, so a "
                "spiky-loss check inside the captured loss is a host read in the capture",
                ("rerun_state_machine.check_for_spiky_loss", "model.cuda_graph_scope"),
            ),
        },
    ),
    *groups(
        MC + "distributed/param_and_grad_buffer.py",
        {
            "_ParamAndGradBucketGroup.check_grads": guarded(
                "cuda_graphs.capture_host_reads",
                "a NaN / large-gradient detector (raises only on values the step already produced), but "
                "validate_result reads the gradient norm on the host (Tensor.__bool__) per bucket: a sync outside "
                "graphs, illegal inside a full-iteration capture; the computed capture rule finds the read and "
                "names the flag to turn off",
                ("ddp.check_for_nan_in_grad", "ddp.check_for_large_grads", "model.cuda_graph_scope"),
            ),
        },
    ),
)
