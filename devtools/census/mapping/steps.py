"""Steps (gpt_step, vlm_step, LLaVA, Qwen3-VL), PackedSeqParams, the train / eval loops, GPTModel, the loss."""

from __future__ import annotations

from devtools.census.mapping.common import ARCHITECTURE, CHECKPOINT, INFERENCE, INVARIANT, LOGGING
from devtools.census.verdicts import gap, groups, guarded, harmless, site, unreachable, validated

MB = "megatron/bridge/"
MC = "megatron/core/"
SPECS = "dataset.offline_packing_specs"

#: a per-step host read (.item() / .tolist() / .cpu() / a value-dependent shape) inside the forward pass
STEP_HOST_READ = guarded(
    ("cuda_graphs.capture_host_reads", "cuda_graphs.full_iteration_needs_injection"),
    "a host read of a device value in the step: a sync per micro batch outside graphs (cost only), illegal "
    "inside a full-iteration capture; the computed capture rule lists the host reads the captured step makes "
    "for the config",
    ("model.cuda_graph_impl", "model.cuda_graph_scope"),
)
#: the optional schedule-plan branch of every step (EP A2A overlap)
SCHEDULE_PLAN = validated(
    "CommOverlapConfig._get_model_comm_overlap_cfgs / the combined-1F1B schedule call the step with "
    "return_schedule_plan=True only when overlap_moe_expert_parallel_comm is set",
    "the assert restates its caller's condition",
)

MAPPING = (
    *groups(
        MB + "training/gpt_step.py",
        {
            "_trim_padded_cu_seqlens_for_cp": (
                guarded(
                    "pretraining.inter_document_masking",
                    "legacy 'cu_seqlens' batches (GPTDataset with inter_document_masking) carry no "
                    "cu_seqlens_argmin and arrive on the device, so CP>1 raises 'Packed CP batches require "
                    "cu_seqlens_argmin' at the first step",
                    ("dataset.inter_document_masking", "model.context_parallel_size"),
                ),
                site(".item()", harmless("reads a host tensor (get_batch_from_iterator moves argmin keys to CPU)")),
                site("nonzero", harmless("reached only for a host cu_seqlens (the branch above raises otherwise)")),
            ),
            "_cu_seqlens_for_cp_partition": guarded(
                ("offline.micro_batch_one", "offline.eval_micro_batch_one"),
                "packed rows with a micro batch > 1 reach the THD CP split, which takes one row",
                ("train.micro_batch_size", "validation.eval_micro_batch_size", "model.context_parallel_size"),
            ),
            "get_batch_from_iterator": STEP_HOST_READ,
            "_forward_step_common": SCHEDULE_PLAN,
        },
    ),
    *groups(
        MB + "training/vlm_step.py",
        {
            "get_batch_from_iterator": STEP_HOST_READ,
            "forward_step": (
                SCHEDULE_PLAN,
                site(
                    "defer_in_batch_packing_to_step",
                    gap(
                        ("dataset.defer_in_batch_packing_to_step", "dataset.enable_in_batch_packing"),
                        "deferred in-batch packing under vlm_step (every VLM but the Qwen3-VL family, whose own "
                        "step packs) raises at the first step; the step is chosen by the launcher (recipe "
                        "registry / --step-func), not by a config field, so no rule decides it yet",
                    ),
                ),
            ),
        },
    ),
    *groups(
        MB + "training/llava_step.py",
        {
            "_expand_packed_metadata_for_visual_embeddings": STEP_HOST_READ,
            "_validate_packed_parallelism": gap(
                (
                    "model.pipeline_model_parallel_size",
                    "model.context_parallel_size",
                    "dataset.enable_in_batch_packing",
                ),
                "LLaVA (llava_step) over packed batches with PP>1 or CP>1 raises at the first step",
            ),
            "get_batch_from_iterator": STEP_HOST_READ,
            "get_batch": unreachable("every collate emits tokens or input_ids"),
            "forward_step": (SCHEDULE_PLAN, site(".item()", STEP_HOST_READ)),
        },
    ),
    *groups(
        MB + "models/qwen_vl/qwen3_vl_step.py",
        {
            "get_batch_from_iterator": (
                STEP_HOST_READ,
                site(
                    "does not support collate-time in-batch packing",
                    gap(
                        ("dataset.enable_in_batch_packing", "dataset.defer_in_batch_packing_to_step"),
                        "collate-time in-batch packing under qwen3_vl_step (Qwen3-VL / Qwen3.5-VL) raises at the "
                        "first step; model.in_batch_packing_opt_out advises it for Qwen3.5-VL only, and the step "
                        "is the launcher's choice",
                    ),
                ),
            ),
            "_pad_and_pack_qwen3_vl_step": STEP_HOST_READ,
            "forward_step": SCHEDULE_PLAN,
        },
    ),
    *groups(
        MB + "training/utils/packed_seq_utils.py",
        {
            "get_thd_cp_partition_indices": guarded(
                "cp.thd_mcore_version",
                "THD partitioning needs Megatron-Core >= 0.18 (the rule reads the installed version)",
                ("model.context_parallel_size",),
            ),
            "get_packed_seq_cp_partition_indices": unreachable(
                "called by Qwen3-VL's model with its CP group's own rank and size, and cu_seqlens_q from the step"
            ),
            "unpack_mcore_thd_tensor_for_position_ids": (
                unreachable("called by the Qwen2.5-VL / GLM-4.5V models with the step's [1, T] THD rows"),
                site("tolist", STEP_HOST_READ, "tolist"),
            ),
            "repack_mcore_thd_position_ids": INVARIANT,
            "_as_python_int": (
                unreachable("max_seqlen is one value per packed row and the THD micro batch is one row"),
                site(".item()", STEP_HOST_READ),
            ),
            "get_packed_seq_params": STEP_HOST_READ,
        },
    ),
    *groups(
        MB + "training/utils/padding_utils.py",
        {"pad_or_truncate_attn_to_len": unreachable("the collates emit 2D or 4D attention masks")},
    ),
    *groups(
        MC + "packed_seq_params.py",
        {
            "PackedSeqParams.__post_init__": guarded(
                ("cuda_graphs.capture_host_reads", "mamba.packing_needs_hybrid"),
                "seq_idx for Mamba layers: repeat_interleave without output_size syncs the host; the steps set "
                "total_tokens only when is_hybrid_model is on (without it Mamba layers get no seq_idx and "
                "attend across packed sequences), and inside a full-iteration capture the sync is illegal",
                ("model.is_hybrid_model", "model.cuda_graph_impl", "model.cuda_graph_scope"),
            ),
        },
    ),
    *groups(
        MB + "training/train.py",
        {
            "train": (
                harmless("train-loop bookkeeping asserts on values the loop itself maintains"),
                site(
                    "manual_gc_interval",
                    guarded(
                        "config.types",
                        "a negative manual_gc_interval asserts when training starts; the types rule asks for a "
                        "non-negative integer",
                        ("train.manual_gc_interval",),
                    ),
                ),
                site(
                    "check_param_hashes_across_dp_replicas",
                    harmless("opt-in debugging check (check_weight_hash_across_dp_replicas_interval)"),
                ),
                site(
                    "graphs_created",
                    unreachable(
                        "TE graphs are created by TECudaGraphHelper before this point when warmup steps are 0"
                    ),
                ),
                site("get_loss_scale", LOGGING),
            ),
            "train_step": INVARIANT,
            "maybe_synchronize_training_step": harmless("opt-in sync between steps (train_sync_interval)"),
            "maybe_check_weight_hash_across_dp_replicas": harmless("opt-in debugging check"),
            "enable_forward_pre_hook": INVARIANT,
            "disable_forward_pre_hook": INVARIANT,
            "force_param_sync": INVARIANT,
            "get_start_time_from_progress_log": LOGGING,
            "checkpoint_and_decide_exit": harmless("one host read of the exit flag per step, between steps"),
        },
    ),
    *groups(
        MB + "training/eval.py",
        {
            "evaluate": (
                harmless("evaluation bookkeeping between the forward-only steps"),
                site("MegatronMIMO", unreachable("MIMO models only")),
                site("Invalid value shape", INVARIANT),
            ),
            "evaluate_and_print_results": LOGGING,
        },
    ),
    *groups(
        MC + "models/gpt/gpt_model.py",
        {
            "GPTModel.__init__": ARCHITECTURE,
            "GPTModel.set_input_tensor": INVARIANT,
            "GPTModel._preprocess": (
                INFERENCE,
                site(
                    "padding_mask.shape",
                    unreachable("the training steps pass no padding_mask (only inference and MoE-padding paths)"),
                ),
            ),
            "GPTModel._postprocess": (
                INFERENCE,
                site("assert self.config.mtp_num_layers > 0", INVARIANT),
            ),
            "GPTModel.sharded_state_dict": CHECKPOINT,
        },
    ),
    *groups(
        MB + "training/losses.py",
        {
            "masked_next_token_loss": (
                harmless(
                    "a detector, not a cause: the local loss here is a masked sum (never 0/0), so it is NaN / Inf "
                    "only when the forward pass already produced NaN / Inf; the configs that do that are mapped "
                    "where they happen (attention backends, FP8, packed metadata)",
                    ("rerun_state_machine.check_for_nan_in_loss",),
                ),
                site(
                    "Spiky loss",
                    harmless("non-fatal: logs and continues (rerun_state_machine.check_for_spiky_loss, opt-in)"),
                ),
            ),
        },
    ),
)
