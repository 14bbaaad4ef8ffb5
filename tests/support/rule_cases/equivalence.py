"""The ``equivalence.*`` rule cases (run by ``tests/rules/test_equivalence.py``)."""

from __future__ import annotations

from tests.support.rule_cases import KW, SPECS, Case, set_fields

ROUTED_MOE = {"model__num_moe_experts": 4, "model__moe_router_topk": 2, "model__moe_aux_loss_coeff": 0.01}


CASES = [
    Case(
        "equivalence.labels",
        "packed_cfg",
        8,
        set_fields(dataset__dataset_kwargs={"chat": True, "answer_only_loss": False}),
        {
            "dataset.enable_offline_packing": True,
            f"{SPECS}.pad_seq_to_mult": 1,
            f"{SPECS}.pad_cu_seqlens": False,
            KW: False,
            "dataset.dataset_kwargs.answer_only_loss": False,
            "measured": "9 tokens the unpacked run does not train get loss packed; 4 of 5 sequences get another loss "
            "sum or token count; the step reports lm loss 1.5 vs 1.462",
        },
        {"dataset.dataset_kwargs.answer_only_loss": True},
    ),
    Case(
        "equivalence.mtp_labels",
        "packed_cfg",
        8,
        set_fields(model__mtp_num_layers=1, dataset__offline_packing_specs__pad_seq_to_mult=16),
        {
            "model.mtp_num_layers": 1,
            "dataset.enable_offline_packing": True,
            f"{SPECS}.pad_seq_to_mult": 16,
            f"{SPECS}.pad_cu_seqlens": False,
            KW: False,
            "measured": "16 of 34 MTP labels cross a sequence boundary or differ from the unpacked run's",
        },
        {f"{SPECS}.pad_seq_to_mult": 1},
        also=("mtp.no_packing",),
    ),
    Case(
        "equivalence.router_padding",
        "packed_cfg",
        8,
        set_fields(**ROUTED_MOE),
        {
            "model.num_moe_experts": 4,
            "router terms": ["moe_aux_loss_coeff"],
            "dataset.enable_offline_packing": True,
            f"{SPECS}.pad_seq_to_mult": 1,
            f"{SPECS}.pad_cu_seqlens": False,
            KW: False,
            "measured": "27.1% of routed tokens are padding (13 of 48); tokens per expert move by 37.1% of the real "
            "load; load-balancing loss 1.114 vs 1.031 on real tokens only",
        },
        {"dataset.dataset_kwargs.pad_seq_length_to_mult": 1},
    ),
]
