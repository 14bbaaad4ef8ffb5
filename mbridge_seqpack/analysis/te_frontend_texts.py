"""cudnn-frontend reject conditions in TE's library that no fixed rule cites, each classified with why.

Every ``RETURN_CUDNN_FRONTEND_ERROR_IF(cond, ...)`` compiled into ``libtransformer_engine.so`` leaves ``#cond`` in
the binary as a string ending in ``") at "``. :func:`te_fused_rules.drift` reads every such string and fails on one
that a fixed rule neither cites (``FixedRule.condition``) nor this table classifies, so a new or changed cuDNN check
cannot pass unseen. The sources are nvidia-cudnn-frontend 1.30.0's headers, the release whose every SDPA condition
text the installed binary holds.
"""

from __future__ import annotations

__all__ = ["CLASSIFIED", "REASONS"]

OTHER_NODE = (
    "a node TE's attention graphs do not contain (norms, the RMSNorm+SiLU engine, block-scale quantize, reshape, "
    "paged cache load): outside the attention selection"
)
PLUMBING = (
    "graph, tensor, plan or execution plumbing (uids, shapes, strides, plans, kernel cache, variant pack, NVRTC): a "
    "builder invariant or a runtime failure, not a support rule over the config"
)
SUBNODE = (
    "a sub-node of the composite SDPA graph (softmax, RNG, reduction, diagonal band, pointwise), checked on "
    "attributes the SDPA node itself sets: an invariant of that node, not a rule over the config"
)
UNCONDITIONAL = (
    "an unconditional error branch: an MMA core mode other than FP16/BF16/FP8 (TE's selection refuses other data "
    "types first), a malformed CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT, an unexpected pass-by-value type"
)
STRUCTURE = (
    "the SDPA graph's own well-formedness (4-d Q/K/V/O with unit last stride, seq_len tensors exactly with a padding "
    "mask, one attn_scale, FP32 stats, intermediate type, a sink with its gradient, a non-boolean bias): set by TE's "
    "graph builder for every config it builds"
)
GQA = (
    "heads divisible by query groups: Megatron-Core's TransformerConfig requires num_attention_heads % "
    "num_query_groups == 0 before TE is reached"
)
MXFP8_DESCALE = (
    "MXFP8 descale tensors' type, reordering and shape: TE's FP8 graph builder creates them from Q/K/V/dO for every "
    "MXFP8 config"
)
UNUSED = (
    "a frontend feature TE's graphs do not use (score_mod, block mask, unified SDPA node, custom dropout mask, "
    "cu_seq_len inputs, ragged offset multiplier, max_total_seq_len, stats_use_log2, dynamic shapes)"
)
PAGED = (
    "paged KV cache: inference only; TE's training path passes no pages (FusedAttention with paged KV is refused by "
    "the v2 rules unless the page counts are set)"
)
DECODE = "decode-only (s_q == 1): a decode step; a training step's max_seqlen_q is the sequence length"
SHADOW_THD_MASK = "refused first by nvte_get_fused_attn_backend_v2 (thd_mask: THD needs a padding mask)"
SHADOW_FP8_BIAS = "refused first by nvte_get_fused_attn_backend_v2 (fp8_post_scale_bias, fp8_alibi: FP8 takes no bias)"
SHADOW_DROPOUT = "the backward's copy of fe_dropout_one's condition: the forward refuses the same config first"
MASK = (
    "reachable, not modelled: depends on how TE maps the mask type and window onto the frontend's diagonal band "
    "(bottom-right alignment, left/right bounds, ALiBi's right bound), which the rules do not carry"
)
DBIAS = (
    "reachable, not modelled: needs whether the bias takes a gradient (dBias), which the rules do not carry "
    "(Megatron-Core's attention passes no core_attention_bias)"
)
FP8_F16_OUT = (
    "reachable, not modelled: needs the O / dQ, dK, dV data types TE's FP8 graph declares, which the rules do not "
    "carry"
)
STATS = (
    "reachable, not modelled: needs the Stats (LSE) layout TE declares (ragged or packed BHSD), which the rules do "
    "not carry"
)

#: why each uncited condition is not a rule; the "reachable, not modelled" ones are real rejects the rules do not
#: carry yet (a config that meets one reaches cuDNN's query, which the plugin assumes accepts)
REASONS: tuple[str, ...] = (
    OTHER_NODE,
    PLUMBING,
    SUBNODE,
    UNCONDITIONAL,
    STRUCTURE,
    GQA,
    MXFP8_DESCALE,
    UNUSED,
    PAGED,
    DECODE,
    SHADOW_THD_MASK,
    SHADOW_FP8_BIAS,
    SHADOW_DROPOUT,
    MASK,
    DBIAS,
    FP8_F16_OUT,
    STATS,
)

#: condition text as the binary holds it (before ``") at "``) -> why no fixed rule cites it
CLASSIFIED: dict[str, str] = {
    **dict.fromkeys(
        (
            "!(Y->get_is_virtual())",
            "!attributes.block_size.has_value()",
            "!built_",
            "!detail::nvrtc_is_loaded()",
            "!eps_ptr",
            "!is_block_table_packed && (s_kv + (block_size - 1)) / block_size != block_table_size",
            "!oss_rms_norm_silu_built_",
            "!oss_rms_norm_silu_supported_",
            "!support_checked_ || knobs_ == nullptr",
            "!swish_output",
            "!x_ptr || !y_ptr || !scale_ptr",
            "attributes.block_size.empty()",
            "attributes.forward_phase == NormFwdPhase_t::NOT_SET",
            "attributes.get_reshape_mode() == ReshapeMode_t::LOGICAL",
            "attributes.use_dbias.has_value() == false",
            "ctx.num_tokens <= 0 || ctx.C <= 0",
            "ctx.x_slot < 0 || ctx.y_slot < 0 || ctx.scale_slot < 0 || ctx.epsilon_slot < 0",
            "cuda_err != cudaSuccess",
            "detail::get_backend_version() < 90500 || detail::get_compiled_version() < 90500",
            "eps_it == rmsnorm_attrs->inputs.end() || !eps_it->second",
            "knobs_ == nullptr",
            "memset_err != cudaSuccess",
            "nvrtc_err != NVRTC_SUCCESS",
            "rmsnorm_attrs == nullptr || swish_attrs == nullptr",
            "rmsnorm_attrs->forward_phase != NormFwdPhase_t::INFERENCE",
            "scale_it == rmsnorm_attrs->inputs.end() || !scale_it->second",
            "scale_it->second->get_data_type() != DataType_t::BFLOAT16",
            "shape.output_dtype == RmsNormSiluDtype::FP8 && sm_version < 89",
            "shape.output_dtype == RmsNormSiluDtype::NVFP4 && sm_version < 100",
            "sm_version < 80",
            "x_dim.size() < 2",
            "x_dtype != DataType_t::BFLOAT16",
            "x_it == rmsnorm_attrs->inputs.end() || !x_it->second",
            "y_tensor->get_data_type() != input_data_type",
        ),
        OTHER_NODE,
    ),
    **dict.fromkeys(
        (
            "!has_t",
            "((context.get_dynamic_shape_enabled() == false) && (kernel_cache != nullptr))",
            "(context.get_dynamic_shape_enabled() || kernel_cache != nullptr) && detail::get_backend_version() < "
            "90400",
            "(index < 0) || (static_cast<int64_t>(barred_indices.size()) <= index)",
            "(index < 0) || (static_cast<int64_t>(execution_plans.size()) <= index)",
            "(shape[shape_idx] != 1) && (common_shape[common_idx] != shape[shape_idx])",
            "(status != CUDNN_STATUS_SUCCESS)",
            "barred_indices[index] == true",
            "candidate == -1",
            "detail::get_backend_version() < 90400",
            "detail::get_backend_version() < 90500",
            "device_ptrs == nullptr && !uids.empty()",
            "device_ptrs.size() != uids.size()",
            "dim.empty()",
            "dim.size() != stride.size()",
            "do_multithreaded_builds",
            "e.getCudnnStatus() != CUDNN_STATUS_SUCCESS",
            "engine.get_status() != CUDNN_STATUS_SUCCESS",
            "engine_id >= count || engine_id < 0",
            "execution_plans[index] == nullptr",
            "has_compile_time_constant && !is_pass_by_value",
            "has_compile_time_constant && is_virtual",
            "has_compile_time_constant && pass_by_value.has_value()",
            "has_ragged_offset_multiplier() && !ragged_offset",
            "is_virtual && is_pass_by_value",
            "it == tensor_uid_to_pointer_map.end()",
            "knob_choice.get_status() != CUDNN_STATUS_SUCCESS",
            "n_user != static_cast<int>(varpack_template.user_slots.size())",
            "n_user > 0 && sorted_user_ptrs == nullptr",
            "operation_graph == nullptr",
            "pass_by_value.has_value() & (!is_pass_by_value)",
            "props->has_uid() == false",
            "ragged_offset_multiplier <= 0",
            "shapes.empty()",
            "stride.empty()",
            "used_uids.find(uid) != used_uids.end()",
            "variant_pack_descriptor.get_status() != CUDNN_STATUS_SUCCESS",
        ),
        PLUMBING,
    ),
    **dict.fromkeys(
        (
            "!((!has_stats() && !has_max() && !has_sum_exp()) || (has_stats() && !has_max() && !has_sum_exp()) || "
            "(!has_stats() && has_max() && has_sum_exp()))",
            "attributes.get_distribution() != RngDistribution_t::BERNOULLI",
            "attributes.stats_use_log2 && has_stats()",
            "detail::get_backend_version() < 92400",
            "has_cu_seq_len_q() || has_cu_seq_len_kv()",
            "has_left_bound() && has_shift_right_bound()",
            "has_seq_len_kv() && has_cu_seq_len_kv()",
            "has_seq_len_q() && has_cu_seq_len_q()",
            "out_0_tensor->get_stride().empty()",
        ),
        SUBNODE,
    ),
    **dict.fromkeys(
        ("true",),
        UNCONDITIONAL,
    ),
    **dict.fromkeys(
        (
            "(!attributes.padding_mask && !attributes.attention_score_modifier) && (has_seq_len_q || has_seq_len_kv)",
            "(!attributes.padding_mask) && (has_seq_len_q || has_seq_len_kv)",
            "(!padding_mask && !attention_score_modifier) && (has_any_seq_len_q || has_any_seq_len_kv)",
            "attributes.outputs.find(output_names::DSINK_TOKEN) != attributes.outputs.end() && "
            "attributes.inputs.find(input_names::SINK_TOKEN) == attributes.inputs.end()",
            "attributes.padding_mask && (!has_seq_len_q || !has_seq_len_kv)",
            "context.get_intermediate_data_type() == DataType_t::NOT_SET",
            "has_any_seq_len_q != has_any_seq_len_kv",
            "has_attn_scale && attn_scale_value.has_value()",
            "has_attn_scale && attributes.attn_scale_value.has_value()",
            "has_dsink_token && !has_sink_token",
            "has_stats && stats_out->second->get_data_type() != DataType_t::FLOAT && "
            "stats_out->second->get_data_type() != DataType_t::NOT_SET",
            "is_bias && (bias_mask->second->get_data_type() == DataType_t::BOOLEAN)",
            "padding_mask && !(has_any_seq_len_q && has_any_seq_len_kv)",
            "t->second->get_stride().back() != 1",
            "tensor_ptr->get_dim().size() != 4",
            "tensor_ptr->get_stride().size() != 4",
            "tensor_ptr->get_stride()[3] != 1",
            "this->context.get_intermediate_data_type() == DataType_t::NOT_SET",
        ),
        STRUCTURE,
    ),
    **dict.fromkeys(
        ("(h_q % h_k != 0) || (h_q % h_v != 0)",),
        GQA,
    ),
    **dict.fromkeys(
        (
            "descale_do->get_data_type() != DataType_t::FP8_E8M0",
            "descale_do->get_reordering_type() != TensorReordering_t::F8_128x4",
            "descale_do_T->get_data_type() != DataType_t::FP8_E8M0",
            "descale_do_T->get_reordering_type() != TensorReordering_t::F8_128x4",
            "descale_k->get_data_type() != DataType_t::FP8_E8M0",
            "descale_k->get_reordering_type() != TensorReordering_t::F8_128x4",
            "descale_k->get_stride()[3] != 1",
            "descale_k_T->get_data_type() != DataType_t::FP8_E8M0",
            "descale_k_T->get_reordering_type() != TensorReordering_t::F8_128x4",
            "descale_q->get_data_type() != DataType_t::FP8_E8M0",
            "descale_q->get_reordering_type() != TensorReordering_t::F8_128x4",
            "descale_q->get_stride()[3] != 1",
            "descale_q_T->get_data_type() != DataType_t::FP8_E8M0",
            "descale_q_T->get_reordering_type() != TensorReordering_t::F8_128x4",
            "descale_v->get_data_type() != DataType_t::FP8_E8M0",
            "descale_v->get_reordering_type() != TensorReordering_t::F8_128x4",
            "sf_do_T_dim[0] != b || sf_do_T_dim[1] != h_q",
            "sf_do_T_dim[2] < s_q_scale",
            "sf_do_dim[0] != b || sf_do_dim[1] != h_q",
            "sf_do_dim[3] < d_v_scale",
            "sf_k_T_dim[0] != b || sf_k_T_dim[1] != h_k",
            "sf_k_T_dim[2] < s_kv_scale",
            "sf_k_dim[0] != b || sf_k_dim[1] != h_k",
            "sf_k_dim[3] < d_qk_scale",
            "sf_k_dim[3] < d_scale",
            "sf_q_T_dim[0] != b || sf_q_T_dim[1] != h_q",
            "sf_q_T_dim[2] < s_q_scale",
            "sf_q_dim[0] != b || sf_q_dim[1] != h_q",
            "sf_q_dim[3] < d_qk_scale",
            "sf_q_dim[3] < d_scale",
            "sf_v_dim[0] != b || sf_v_dim[1] != h_v",
            "sf_v_dim[2] < s_kv_scale",
            "sf_v_dim[2] < s_scale",
        ),
        MXFP8_DESCALE,
    ),
    **dict.fromkeys(
        (
            "!io_dtypes_within({DataType_t::HALF, DataType_t::BFLOAT16, DataType_t::FP8_E4M3, DataType_t::FP8_E5M2, "
            "DataType_t::FLOAT})",
            "!io_dtypes_within({DataType_t::HALF, DataType_t::BFLOAT16, DataType_t::FP8_E4M3, DataType_t::FP8_E5M2})",
            "(attention_score_modifier != nullptr) && (alibi_mask || has_causal_like_masking() || padding_mask || "
            "left_bound.has_value())",
            "(attributes.attention_score_modifier != nullptr) && (attributes.alibi_mask || attributes.padding_mask "
            "|| attributes.has_causal_like_masking() || attributes.left_bound.has_value())",
            "(attributes.max_total_seq_len_q.has_value() || attributes.max_total_seq_len_kv.has_value()) && "
            "!is_ragged",
            "attributes.dropout_probability.has_value() && is_dropout_custom",
            "context.get_dynamic_shape_enabled()",
            "dropout_probability.has_value() && is_dropout_custom",
            "effective_cudnn_ver < 91301",
            "has_input(input_names::Block_mask)",
            "has_input(input_names::CU_SEQ_LEN_Q) != has_input(input_names::CU_SEQ_LEN_KV)",
            "has_input(input_names::CU_SEQ_LEN_Q) || has_input(input_names::CU_SEQ_LEN_KV)",
            "has_seq_len_kv && has_cu_seq_len_kv",
            "has_seq_len_q && has_cu_seq_len_q",
            "implementation == AttentionImplementation_t::UNIFIED && prop_major == 10 && block_mask != inputs.end() "
            "&& block_mask->second != nullptr && detail::get_backend_version() < 92600",
            "stats_use_log2 && generate_stats.value_or(false) && std::min(detail::get_compiled_version(), "
            "detail::get_backend_version()) < 92700",
            "value != nullptr && value->has_ragged_offset_multiplier()",
        ),
        UNUSED,
    ),
    **dict.fromkeys(
        (
            "!is_paged && max_seq_kv_explicit",
            "((is_paged_k && inputs.at(SDPA_attributes::input_names::Page_table_K)->get_ragged_offset()) || "
            "(is_paged_v && inputs.at(SDPA_attributes::input_names::Page_table_V)->get_ragged_offset())) && "
            "detail::get_backend_version() < 91002",
            "detail::get_backend_version() < 90500 && is_paged",
            "is_bias && (bias_mask->second->get_dim()[3] != max_seq_kv)",
            "is_paged && !(has_any_seq_len_q && has_any_seq_len_kv)",
            "is_paged && (d_qk > 128 || d_v > 128) && detail::get_backend_version() <= 90900",
            "is_paged && is_ragged && detail::get_backend_version() < 90700",
            "is_rng && rng_tensor->second->get_dim()[3] != max_seq_kv",
        ),
        PAGED,
    ),
    **dict.fromkeys(
        (
            "is_decode_only && (detail::get_backend_version() <= 90900) && (right_bound.has_value())",
            "is_decode_only && (prop_major == 10) && (d_qk > 128 || d_v > 128) && (detail::get_backend_version() <= "
            "90900)",
            "is_decode_only && has_sink_token()",
        ),
        DECODE,
    ),
    **dict.fromkeys(
        ("is_ragged && ((padding_mask == false) && (attention_score_modifier == nullptr))",),
        SHADOW_THD_MASK,
    ),
    **dict.fromkeys(
        ("is_bias",),
        SHADOW_FP8_BIAS,
    ),
    **dict.fromkeys(
        ("attributes.dropout_probability.has_value() && attributes.dropout_probability.value() == 1.0",),
        SHADOW_DROPOUT,
    ),
    **dict.fromkeys(
        (
            "(attributes.left_bound.has_value() || attributes.right_bound.has_value()) && ((is_ragged && "
            "!attributes.padding_mask))",
            "alibi_mask && !(right_bound.has_value() && right_bound.value() == 0)",
            "attributes.alibi_mask && !(attributes.right_bound.has_value() && attributes.right_bound.value() == 0)",
            "attributes.has_causal_mask_bottom_right() && (!attributes.padding_mask) && s_q > s_kv",
            "attributes.has_causal_mask_bottom_right() && ((s_q % 64 != 0) || (s_kv % 64 != 0))",
            "attributes.has_causal_mask_bottom_right() && (detail::get_backend_version() < 90600) && ((s_q % 64 != "
            "0) || (s_kv % 64 != 0))",
            "attributes.has_causal_mask_bottom_right() && (is_bias || attributes.alibi_mask || (is_ragged && "
            "!attributes.padding_mask) || is_dropout)",
            "attributes.has_causal_mask_bottom_right() && (is_bias || is_dropout)",
            "attributes.has_causal_mask_bottom_right() && detail::get_backend_version() < 90700",
            "attributes.has_causal_mask_bottom_right() && prop_major < 10",
            "attributes.has_causal_mask_bottom_right() && s_q > s_kv",
            "attributes.left_bound.has_value() && (! attributes.has_causal_like_masking() || is_dropout || is_bias "
            "|| (is_ragged && !attributes.padding_mask))",
            "attributes.left_bound.has_value() && (!attributes.padding_mask) && s_q > s_kv",
            "attributes.left_bound.has_value() && (s_q * attributes.left_bound.value() == s_kv * "
            "attributes.left_bound.value()) && (detail::get_backend_version() <= 90900) && (prop_major == 9) && "
            "attributes.has_causal_mask_bottom_right()",
            "attributes.left_bound.has_value() && attributes.left_bound.value() <= 0",
            "attributes.right_bound.has_value() && attributes.right_bound.value() < 0",
            "detail::get_backend_version() < 90600 && left_bound.has_value() && has_causal_mask_bottom_right() && "
            "s_q != s_kv",
            "detail::get_backend_version() == 91400 && s_kv > 1024 && attributes.left_bound.has_value() && "
            "!attributes.has_causal_like_masking()",
            "detail::get_backend_version() == 91400 && s_kv > 1024 && left_bound.has_value() && "
            "!has_causal_like_masking()",
            "has_causal_mask_bottom_right() && (!padding_mask) && s_q > s_kv",
            "has_causal_mask_bottom_right() && (detail::get_backend_version() < 90600) && ((s_q % 64 != 0) || (s_kv "
            "% 64 != 0))",
            "has_causal_mask_bottom_right() && (is_bias || alibi_mask || is_dropout)",
            "has_causal_mask_bottom_right() && detail::get_backend_version() < 90700",
            "has_causal_mask_bottom_right() && prop_major < 10",
            "left_bound.has_value() && (!has_causal_like_masking() || is_dropout || is_bias)",
            "left_bound.has_value() && (!padding_mask) && s_q > s_kv",
            "left_bound.has_value() && (s_q * left_bound.value() == s_kv * left_bound.value()) && "
            "(detail::get_backend_version() <= 90900) && (prop_major == 9) && has_causal_mask_bottom_right()",
            "left_bound.has_value() && left_bound.value() <= 0 && detail::get_backend_version() < 91000",
            "right_bound.has_value() && right_bound.value() < 0",
        ),
        MASK,
    ),
    **dict.fromkeys(
        (
            "detail::get_backend_version() < 90500 && is_dbias && ((s_q % 64 != 0) || (s_kv % 64 != 0))",
            "detail::get_backend_version() < 90500 && is_dbias && attributes.padding_mask",
            "prop_major == 10 && is_ragged && is_dbias",
        ),
        DBIAS,
    ),
    **dict.fromkeys(
        (
            "(dq_data_type == DataType_t::HALF || dq_data_type == DataType_t::BFLOAT16 || dk_data_type == "
            "DataType_t::HALF || dk_data_type == DataType_t::BFLOAT16 || dv_data_type == DataType_t::HALF || "
            "dv_data_type == DataType_t::BFLOAT16) && (detail::get_backend_version() < 91300 || prop_major < 10)",
            "(output_data_type == DataType_t::HALF || output_data_type == DataType_t::BFLOAT16) && "
            "(detail::get_backend_version() < 91300 || prop_major < 10)",
        ),
        FP8_F16_OUT,
    ),
    **dict.fromkeys(
        (
            "!stats_is_packed_bhsd",
            "is_ragged && (8 == prop_major || 12 == prop_major) && "
            "attributes.inputs[input_names::Stats]->get_ragged_offset()",
        ),
        STATS,
    ),
}
