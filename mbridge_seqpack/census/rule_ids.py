"""Rule ids the census names that other engineers are writing in parallel (issue #32 items 2-3, issue #33).

The id-existence test accepts these until the lead merges their rules; after the merge every id must be in the
catalog and this set shrinks to nothing.
"""

from __future__ import annotations

PLANNED_RULE_IDS: frozenset[str] = frozenset(
    {
        "pretraining.inter_document_masking",
        "pretraining.reset_attention_mask",
        "pretraining.reset_position_ids",
        "dataset.create_attention_mask",
        "eval.packed_split_rows",
        "tp_comm_overlap.token_count",
        "cp.hybrid_context_parallel",
        "vlm.collate_refuses_packing",
        "cp.comm_type_known",
        "mamba.packing_needs_hybrid",
        "moe.router_counts_padding",
        "resume.repacked_data",
        "attention.backend_available",
        "cuda_graphs.capture_host_reads",
        "cuda_graphs.te_scope_inputs",
    }
)
