"""What the AST scan cannot see, listed by hand: silent discards (a field read nowhere, or read and thrown away),
silent wrong training (no assert, no raise: the numbers are just wrong), and checks in compiled code (C++ / CUDA /
cuBLAS / NCCL) that decide a config's fate. Each names the installed function that shows it (``needle`` is text
that function's file holds, checked by ``tests/devtools/test_census.py``) and the verdict.

The fields that ``devtools/field_uses.py`` records as consumed nowhere are pulled in here too (one table of
"fields -> consumers" for the project), each with the rule that guards it (:data:`UNCONSUMED_FIELD_RULES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from devtools.census.verdicts import CensusVerdict, guarded
from devtools.field_uses import FIELD_USES

__all__ = ["Mechanism", "MECHANISMS", "UNCONSUMED_FIELD_RULES", "all_mechanisms"]

Kind = Literal["discard", "silent", "compiled"]
KINDS: dict[Kind, str] = {
    "discard": "silent discard (a field read nowhere, or read and thrown away)",
    "silent": "silent wrong training (no error: the numbers are wrong)",
    "compiled": "a check in compiled code (C++ / CUDA / cuBLAS / NCCL), invisible to the AST scan",
}


@dataclass(frozen=True)
class Mechanism:
    """One failure the scan cannot list: its kind, the installed file and function that show it, what happens."""

    name: str
    kind: Kind
    file: str
    function: str
    needle: str
    what: str
    verdict: CensusVerdict


MB = "megatron/bridge/"
MC = "megatron/core/"
TE = "transformer_engine/pytorch/"

#: every field ``FIELD_USES`` records as consumed nowhere, with the rule that reports it
UNCONSUMED_FIELD_RULES: dict[str, str] = {"dist.eval_context_parallel_size": "cp.eval_cp_has_no_effect"}

MECHANISMS: tuple[Mechanism, ...] = (
    # -- silent discards ---------------------------------------------------------------------------------------
    Mechanism(
        "reset_attention_mask dropped",
        "discard",
        MB + "training/gpt_step.py",
        "get_batch_from_iterator",
        "skip_getting_attention_mask_from_dataset",
        "GPTDataset builds the per-document attention mask reset_attention_mask asks for "
        "(gpt_dataset.py _get_ltor_masks_and_position_ids), and gpt_step drops every batch's attention_mask while "
        "skip_getting_attention_mask_from_dataset is True (its default): documents attend to each other",
        guarded(
            "pretraining.reset_attention_mask",
            "the mask is built and thrown away",
            ("dataset.reset_attention_mask", "dataset.skip_getting_attention_mask_from_dataset"),
        ),
    ),
    Mechanism(
        "reset_position_ids ignored by RoPE",
        "discard",
        MC + "models/gpt/gpt_model.py",
        "GPTModel._preprocess",
        "get_rotary_seq_len",
        "RoPE / YaRN position embeddings are computed from the sequence length (rotary_pos_emb(rotary_seq_len)), "
        "not from position_ids; only learned absolute embeddings and mRoPE read position_ids, so the per-document "
        "position reset does nothing for RoPE models",
        guarded(
            "pretraining.reset_position_ids",
            "read into position_ids, which RoPE never reads",
            ("dataset.reset_position_ids", "model.position_embedding_type"),
        ),
    ),
    Mechanism(
        "create_attention_mask built and dropped",
        "discard",
        MC + "datasets/gpt_dataset.py",
        "GPTDataset.__getitem__",
        "self.config.create_attention_mask",
        "create_attention_mask (default True) makes every sample carry an S x S boolean mask built on the host "
        "(memory and data-loader time quadratic in seq_length), which gpt_step discards unless "
        "skip_getting_attention_mask_from_dataset is False",
        guarded(
            "dataset.create_attention_mask",
            "an S x S host mask per sample, thrown away by the step",
            ("dataset.create_attention_mask", "dataset.seq_length"),
        ),
    ),
    # -- silent wrong training ---------------------------------------------------------------------------------
    Mechanism(
        "inter_document_masking through the legacy cu_seqlens path",
        "silent",
        MB + "training/utils/packed_seq_utils.py",
        "get_packed_seq_params",
        "torch.argmin(cu_seqlens_padded)",
        "GPTDataset with inter_document_masking emits the legacy 'cu_seqlens' key padded with sequence_length "
        "(not -1) and no cu_seqlens_argmin; get_packed_seq_params trims it at torch.argmin, index 0 for those "
        "values, and under CP gpt_step raises (cu_seqlens_argmin missing); Megatron-Core's own merge helper "
        "(_merge_cu_seqlens_across_micro_batch) is never called by Megatron-Bridge",
        guarded(
            "pretraining.inter_document_masking",
            "document boundaries do not reach attention intact",
            ("dataset.inter_document_masking", "model.context_parallel_size"),
        ),
    ),
    Mechanism(
        "MoE router counts padding tokens",
        "silent",
        MC + "transformer/moe/router.py",
        "TopKRouter.routing",
        "padding_mask",
        "the steps pass no padding_mask, so the router's load-balancing / z-loss statistics and the token counts "
        "include the pad tokens of packed rows (all routed, all counted): the aux loss and the expert load are "
        "skewed by padding",
        guarded(
            ("equivalence.router_padding", "moe.router_counts_padding"),
            "aux losses computed over padding (packed rows: measured by the equivalence check; full-width unpacked "
            "rows: the advisory)",
            ("model.num_moe_experts", "model.moe_aux_loss_coeff", "dataset.enable_offline_packing"),
        ),
    ),
    Mechanism(
        "MTP labels rolled on the logical cu_seqlens of padded packs",
        "silent",
        MC + "transformer/multi_token_prediction.py",
        "_roll_tensor_packed_seq",
        "cu_seqlens_q",
        "found by the equivalence check (issue #38): the packed roll works on packed_seq_params.cu_seqlens_q, which "
        "get_packed_seq_params sets to the logical offsets when the batch carries padded ones "
        "(pad_seq_to_mult > 1), so at CP 1 MTP targets cross sequence boundaries and land on padding",
        guarded(
            "equivalence.mtp_labels",
            "MTP trains on the neighbouring sequence's tokens",
            ("model.mtp_num_layers", "dataset.offline_packing_specs.pad_seq_to_mult"),
        ),
    ),
    Mechanism(
        "Mamba over packed rows without seq_idx",
        "silent",
        MB + "training/gpt_step.py",
        "_forward_step_common",
        "is_hybrid_model",
        "the steps set PackedSeqParams.total_tokens (hence seq_idx) only when is_hybrid_model is on; Mamba's "
        "training kernel (mamba_mixer._ssm_training -> mamba_split_conv1d_scan_combined) takes seq_idx=None and "
        "carries the SSM state across packed sequences without an error",
        guarded(
            "mamba.packing_needs_hybrid",
            "SSM state leaks across packed sequences",
            ("model.is_hybrid_model", "dataset.enable_offline_packing"),
        ),
    ),
    Mechanism(
        "MTP labels rolled across sequences under CP",
        "silent",
        MC + "transformer/multi_token_prediction.py",
        "_roll_tensor_packed_seq",
        "cu_seqlens",
        "with CP>1 the packed roll locates each rank's chunks with the logical cu_seqlens // cp_size while the "
        "THD split cuts the padded ones",
        guarded(
            "mtp.packed_context_parallel",
            "MTP labels roll across sequences",
            ("model.mtp_num_layers", "model.context_parallel_size"),
        ),
    ),
    Mechanism(
        "resume after re-packing",
        "silent",
        MB + "data/loaders.py",
        "build_train_valid_test_data_loaders",
        "consumed_train_samples",
        "the samplers resume at train_state.consumed_train_samples, an index into the rows of the pack in use; a "
        "pack rebuilt with another size, alignment or data has other rows, so the resumed run skips or repeats "
        "data (or asserts 'no samples left to consume' when the new pack is shorter)",
        guarded(
            "resume.repacked_data",
            "consumed samples index a different pack",
            ("checkpoint.load", "dataset.offline_packing_specs.packed_sequence_size"),
        ),
    ),
    Mechanism(
        "a stale or foreign pack at the builder's default path",
        "silent",
        MB + "data/builders/gpt_sft.py",
        "GPTSFTDatasetBuilder.prepare_packed_data",
        "packed_sequence_size",
        "the builder skips its prep when the default pack path holds a file (keyed by tokenizer name and config, "
        "not the data), and trains on it as found",
        guarded(
            "artifact.fingerprint_mismatch",
            "training on a pack of other data or settings",
            ("dataset.dataset_root", "dataset.offline_packing_specs.packed_train_data_path"),
        ),
    ),
    # -- compiled checks ---------------------------------------------------------------------------------------
    Mechanism(
        "THD CP partition (tex.thd_get_partitioned_indices)",
        "compiled",
        MC + "utils.py",
        "_get_batch_on_this_cp_rank_per_document_balancing",
        "thd_get_partitioned_indices",
        "TE's C++ THD partition needs every sequence length in cu_seqlens_padded divisible by 2*CP; otherwise it "
        "drops tokens (TE #1930)",
        guarded(
            "offline.alignment_multiple",
            "packs aligned to 2*CP",
            ("dataset.offline_packing_specs.pad_seq_to_mult", "model.context_parallel_size"),
        ),
    ),
    Mechanism(
        "FP8 GEMM operand alignment (cuBLASLt)",
        "compiled",
        TE + "module/linear.py",
        "_linear_forward_impl",
        "assert_dim_for_fp8_exec",
        "the FP8 wgrad GEMM reduces over the rank-local tokens and cuBLASLt asserts 'lda % 16 == 0'",
        guarded(
            "fp8.packed_tokens_per_rank",
            "rank-local tokens a multiple of 16",
            ("mixed_precision", "dataset.offline_packing_specs.packed_sequence_size"),
        ),
    ),
    Mechanism(
        "MXFP8 quantizer block size (quantizer.cpp)",
        "compiled",
        TE + "tensor/mxfp8_tensor.py",
        "MXFP8Quantizer.is_quantizable",
        "MXFP8_BLOCK_SCALING_SIZE",
        "MXFP8 quantizes the token dimension in blocks of 32 ('flat_first_dim % MXFP8_BLOCK_SIZE == 0' in C++)",
        guarded(
            "fp8.packed_tokens_per_rank",
            "rank-local tokens a multiple of 32 under MXFP8",
            ("mixed_precision", "dataset.offline_packing_specs.packed_sequence_size"),
        ),
    ),
    Mechanism(
        "NVFP4 quantizer block size",
        "compiled",
        TE + "tensor/nvfp4_tensor.py",
        "NVFP4Quantizer.is_quantizable",
        "NVFP4_BLOCK_SCALING_SIZE",
        "NVFP4 quantizes the token dimension in blocks of 16 (is_quantizable: prod(leading dims) % 16; the C++ "
        "quantizer asserts it, and the random Hadamard transform / 2D scaling paths need more); "
        "fp8.packed_tokens_per_rank and fp8.row_tokens_per_rank read the FP4 recipe too",
        guarded(
            ("fp8.packed_tokens_per_rank", "fp8.row_tokens_per_rank"),
            "rank-local tokens a multiple of 16 under NVFP4",
            ("mixed_precision", "dataset.offline_packing_specs.packed_sequence_size", "model.context_parallel_size"),
        ),
    ),
    Mechanism(
        "FP8 row widths outside offline packs",
        "compiled",
        TE + "utils.py",
        "assert_dim_for_fp8_exec",
        "divisible by 8",
        "fp8.packed_tokens_per_rank applies to offline packs only (packed_sequence_size > 0); in-batch packed "
        "rows and unpacked GPT SFT rows under FP8 reach the same TE / cuBLASLt checks with the collate's width",
        guarded(
            "fp8.row_tokens_per_rank",
            "FP8 / MXFP8 / NVFP4 token alignment of collate-packed, unpacked GPT SFT and Hugging Face / VLM rows: "
            "every width the collate can emit, times the micro batch, over CP (and TP under SP)",
            ("mixed_precision", "dataset.enable_in_batch_packing", "dataset.dataset_kwargs['pad_seq_length_to_mult']"),
        ),
    ),
    Mechanism(
        "userbuffer size (comm_gemm_overlap.cpp copy_into_buffer)",
        "compiled",
        TE + "module/base.py",
        "fill_userbuffers_buffer_for_all_gather",
        "copy_into_buffer",
        "TP comm overlap userbuffers are sized at initialization from seq_length * micro_batch_size / CP "
        "(training/initialize.py _initialize_tp_communicators); the C++ copy checks the local tensor fits exactly",
        guarded(
            "tp_comm_overlap.token_count",
            "packed / variable-width rows give another token count than the buffer",
            ("comm_overlap.tp_comm_overlap", "model.seq_length", "dataset.offline_packing_specs.packed_sequence_size"),
        ),
    ),
    Mechanism(
        "static-buffer copies of graphed inputs (Tensor.copy_)",
        "compiled",
        MC + "full_cuda_graph.py",
        "clone_tensors_in_struct",
        "tgt.copy_(src",
        "full-iteration graphs copy each batch into the first batch's static buffers and TE per-layer graphs copy "
        "each input into the captured surface (graph.py Graphed.forward); torch's copy_ fails (or broadcasts) on a "
        "shape that differs",
        guarded(
            (
                "in_batch.no_cuda_graphs",
                "cuda_graphs.attention_graphs_need_pad_cu_seqlens",
                "cuda_graphs.training_graphs_need_fixed_width",
                "cuda_graphs.te_capture_width",
            ),
            "variable widths or cu_seqlens lengths under graphs",
            ("model.cuda_graph_impl", "model.cuda_graph_scope", "dataset.offline_packing_specs.pad_cu_seqlens"),
        ),
    ),
    Mechanism(
        "host synchronization inside a stream capture (CUDA)",
        "compiled",
        MC + "full_cuda_graph.py",
        "FullCudaGraphWrapper.__call__",
        "torch.cuda.graph",
        "any .item() / .tolist() / .cpu() / value-dependent shape inside the captured step fails the capture "
        "(cudaErrorStreamCaptureUnsupported) or freezes a value; the scanned host-read sites are mapped one by one",
        guarded(
            ("cuda_graphs.capture_host_reads", "cuda_graphs.full_iteration_needs_injection"),
            "the computed rule finds the host reads of the captured step",
            ("model.cuda_graph_impl", "model.cuda_graph_scope"),
        ),
    ),
    Mechanism(
        "attention kernels (cuDNN / flash-attn)",
        "compiled",
        TE + "attention/dot_product_attention/utils.py",
        "get_attention_backend",
        "def get_attention_backend",
        "cuDNN fused attention and flash-attn reject head dims, sequence layouts, masks and dtypes they do not "
        "support; TE's get_attention_backend filters those before the call",
        guarded(
            "attention.backend_available",
            "backend selection run for the config",
            ("model.attention_backend", "mixed_precision", "model.kv_channels"),
        ),
    ),
    Mechanism(
        "HybridEP uneven token counts (DeepEP C++)",
        "compiled",
        MC + "transformer/moe/token_dispatcher.py",
        "_HybridEPManager.setup_metadata",
        "moe_hybridep_pad_uneven_dispatch_inputs",
        "HybridEP's buffer all-gather expects equal per-rank token counts; uneven counts hang or corrupt routing",
        guarded(
            "moe.hybridep_uneven_inputs",
            "variable-width rows under HybridEP",
            ("model.moe_flex_dispatcher_backend", "model.moe_hybridep_pad_uneven_dispatch_inputs"),
        ),
    ),
)


def all_mechanisms() -> tuple[Mechanism, ...]:
    """The hand-listed mechanisms plus one discard per field ``FIELD_USES`` records as consumed nowhere."""
    discards = tuple(
        Mechanism(
            f"{use.field} consumed nowhere",
            "discard",
            "megatron/bridge/",
            "(field audit)",
            "",
            use.function,
            guarded(UNCONSUMED_FIELD_RULES[use.field], "consumed nowhere (docs/field-audit.md)", (use.field,)),
        )
        for use in FIELD_USES
        if not use.used and use.field in UNCONSUMED_FIELD_RULES
    )
    return MECHANISMS + discards
