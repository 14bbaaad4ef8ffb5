"""The ``moe.*`` rule cases (run by ``tests/rules/test_moe.py``)."""

from __future__ import annotations

from tests.support.rule_cases import KW, Case, set_fields

HYBRIDEP = {
    "model__num_moe_experts": 4,
    "model__moe_router_topk": 2,
    "model__expert_model_parallel_size": 2,
    "model__moe_token_dispatcher_type": "flex",
    "model__moe_flex_dispatcher_backend": "hybridep",
}


CASES = [
    Case(
        "moe.hybridep_uneven_inputs",
        "unpacked_cfg",
        8,
        set_fields(**HYBRIDEP),
        {
            "model.moe_flex_dispatcher_backend": "hybridep",
            "model.expert_model_parallel_size": 2,
            "dataset.dataset_kwargs.pad_to_max_length": False,
            "model.moe_hybridep_pad_uneven_dispatch_inputs": False,
        },
        {"model.moe_hybridep_pad_uneven_dispatch_inputs": True},
        also=("fixed_width.gpt_sft_experts",),
    ),
    Case(
        "moe.router_counts_padding",
        "unpacked_cfg",
        8,
        set_fields(
            model__num_moe_experts=4,
            model__moe_router_topk=2,
            model__moe_aux_loss_coeff=0.01,
            **{"dataset__dataset_kwargs['pad_to_max_length']": True},
        ),
        {"model.num_moe_experts": 4, KW: True, "router terms": ["moe_aux_loss_coeff"]},
        fix="pack the rows (dataset.enable_offline_packing / enable_in_batch_packing) or leave them variable-width "
        "where the layout allows; Megatron-Bridge 0.6.2 has no setting that masks padding in the router",
        repair=set_fields(model__moe_aux_loss_coeff=0.0),
    ),
]
