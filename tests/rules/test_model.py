"""The ``model.*`` rules: a real ConfigContainer breaking only the rule gives exactly its violation,
and the fix repairs it (the cases: ``tests/support/rule_cases/model.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from mbridge_seqpack import check
from tests.support.rule_cases import Case, breaks_and_fix_repairs
from tests.support.rule_cases.model import CASES


@pytest.mark.parametrize("case", CASES, ids=[c.rule_id for c in CASES])
def test_rule_breaks_and_fix_repairs(case: Case, request: pytest.FixtureRequest) -> None:
    breaks_and_fix_repairs(case, request)


def test_glm45_from_its_bridge_structure_opts_out_of_offline_packing(packed_cfg: Any) -> None:
    """A small GLM-4.5-shaped config (QKV bias as GLM-4.5's own config.json has it) through GLM45Bridge."""
    from transformers import Glm4MoeConfig

    from mbridge_seqpack.recipes.building_blocks import provider_from_hf_config

    provider = provider_from_hf_config(
        Glm4MoeConfig(
            architectures=["Glm4MoeForCausalLM"],
            num_hidden_layers=4,
            hidden_size=256,
            intermediate_size=512,
            num_attention_heads=4,
            num_key_value_heads=2,
            moe_intermediate_size=128,
            n_routed_experts=4,
            num_experts_per_tok=2,
            vocab_size=1000,
            first_k_dense_replace=1,
            attention_bias=True,
        )
    )
    assert not hasattr(provider, "hf_architectures")  # nothing recorded beyond the bridge's own fields
    provider.seq_length = 4096
    packed_cfg.model = provider
    found = {v.rule_id: v for v in check(packed_cfg, world_size=8)}
    # GLM-4.5's router has an aux loss: the packed rows' tail padding is routed (equivalence.router_padding)
    assert sorted(found) == ["equivalence.router_padding", "model.offline_packing_opt_out"]
    v = found["model.offline_packing_opt_out"]
    assert v.fields["model family"] == "GLM-4.5"
