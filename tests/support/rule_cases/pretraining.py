"""The ``pretraining.*`` rule cases (run by ``tests/rules/test_pretraining.py``)."""

from __future__ import annotations

from tests.support.rule_cases import Case, set_fields

CASES = [
    Case(
        "pretraining.inter_document_masking",
        "pretrain_cfg",
        8,
        set_fields(dataset__inter_document_masking=True),
        {"dataset.inter_document_masking": True, "train.micro_batch_size": 1, "model.context_parallel_size": 1},
        {"dataset.inter_document_masking": False},
    ),
    Case(
        "pretraining.reset_attention_mask",
        "pretrain_cfg",
        8,
        set_fields(dataset__reset_attention_mask=True),
        {
            "dataset.reset_attention_mask": True,
            "dataset.create_attention_mask": True,
            "dataset.skip_getting_attention_mask_from_dataset": True,
        },
        {"dataset.reset_attention_mask": False},
    ),
    Case(
        "pretraining.reset_position_ids",
        "pretrain_cfg",
        8,
        set_fields(dataset__reset_position_ids=True),
        {"dataset.reset_position_ids": True, "model.position_embedding_type": "rope"},
        {"dataset.reset_position_ids": False},
    ),
]
