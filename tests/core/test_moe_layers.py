"""Which layers are MoE (``mbridge_seqpack/moe_layers.py``), against Megatron-Core's own readers of the fields:
``get_moe_layer_pattern`` for ``moe_layer_freq``, ``get_mlp_module_spec`` for which ``num_moe_experts`` builds a
MoE layer, ``get_hybrid_layer_counts`` for a hybrid pattern, and TransformerConfig's refusal of an ``mlp``
CUDA-graph scope on a model with no dense layer (reached through Megatron-Bridge's validate()). The rule that reads
it agrees with Megatron-Core on the same configs."""

from __future__ import annotations

from typing import Any

import pytest

from mbridge_seqpack import check
from mbridge_seqpack.capture.conditions import model_layer_kinds, moe_kind
from mbridge_seqpack.moe_layers import MoeLayers, hybrid_pattern, moe_layers, routed_experts
from mbridge_seqpack.rules import RuleContext

#: (num_layers, moe_layer_freq): every N-th layer, N beyond the layer count, lists with and without a dense layer
FREQS = [(4, 1), (4, 2), (6, 4), (2, 3), (4, [1, 0, 1, 1]), (3, [0, 0, 0]), (2, [1, 1]), (4, [0, 1, 0, 1])]


def _gpt(num_layers: int = 4, experts: Any = 8, freq: Any = 1) -> Any:
    from mbridge_seqpack.recipes.building_blocks import small_gpt_provider

    model = small_gpt_provider(4096)
    model.num_layers, model.num_moe_experts, model.moe_layer_freq = num_layers, experts, freq
    return model


@pytest.mark.parametrize(("num_layers", "freq"), FREQS)
def test_the_layer_pattern_is_megatron_cores(megatron_bridge: Any, num_layers: int, freq: Any) -> None:
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import get_moe_layer_pattern

    model = _gpt(num_layers, 8, freq)
    expected = get_moe_layer_pattern(model)
    layers = moe_layers(model)
    assert layers.pattern == tuple(expected)
    assert layers.dense_mlp is (0 in expected)
    assert layers.experts == (8 if 1 in expected else None)  # a pattern without a MoE layer builds no router


@pytest.mark.parametrize(("experts", "routed"), [(None, None), (0, None), (True, None), ("8", None), (1, 1), (8, 8)])
def test_routed_experts_are_what_megatron_core_builds_a_moe_layer_for(
    megatron_bridge: Any, experts: Any, routed: int | None
) -> None:
    from megatron.core.models.gpt.gpt_layer_specs import get_mlp_module_spec
    from megatron.core.transformer.moe.moe_layer import MoELayer

    assert routed_experts(_gpt(experts=experts)) == routed
    if isinstance(routed, int):  # one expert is a MoE layer too: Megatron-Core asks only `num_experts is not None`
        assert get_mlp_module_spec(use_te=False, num_experts=routed).func is MoELayer


def test_no_layer_count_reads_the_frequency_as_transformer_config_does() -> None:
    """Without ``num_layers`` (a bare config object), an int frequency above 1 is a mixed model, as
    TransformerConfig.__post_init__ reads it for ``moe_ffn_hidden_size``."""

    class Bare:
        num_moe_experts, moe_layer_freq = 8, 2

    assert moe_layers(Bare()) == MoeLayers(8, None, True)
    Bare.moe_layer_freq = 1
    assert moe_layers(Bare()) == MoeLayers(8, None, False)


HYBRID = ["M-M*", "MEM*", "M-ME|M*", "M*M*/EE/EE", "MM*M"]


@pytest.mark.parametrize("pattern", HYBRID)
def test_a_hybrid_models_layers_are_its_patterns(hybrid_cfg: Any, pattern: str) -> None:
    """A hybrid model's MoE and dense-MLP layers are its pattern's symbols, as Megatron-Core counts them;
    ``moe_layer_freq`` plays no part (it stays 1 here)."""
    from megatron.core.models.hybrid.hybrid_layer_allocation import get_hybrid_layer_counts

    hybrid_cfg.model.hybrid_layer_pattern = pattern
    hybrid_cfg.model.num_moe_experts = 4
    counts = get_hybrid_layer_counts(pattern)
    layers = moe_layers(hybrid_cfg.model)
    assert hybrid_pattern(hybrid_cfg.model) == pattern
    assert (layers.experts, layers.pattern, layers.dense_mlp) == (4 if counts["E"] else None, None, counts["-"] > 0)


@pytest.mark.parametrize(("num_layers", "freq"), [(4, 1), (4, 2), (4, [1, 0, 1, 0]), (4, [1, 1, 1, 1])])
def test_an_mlp_graph_scope_is_refused_where_megatron_core_refuses_it(
    packed_cfg: Any, num_layers: int, freq: Any
) -> None:
    """``cuda_graph_modules=[mlp]`` on a MoE model: refused by the check exactly where TransformerConfig refuses it
    (every layer MoE), passed where some layer is dense (an int frequency of 2 is [1, 0, 1, 0])."""
    from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules

    from tests.support.validation import mb_validate

    packed_cfg.dataset.dataset_kwargs["pad_to_max_length"] = True
    packed_cfg.model.num_layers = num_layers
    packed_cfg.model.num_moe_experts = 8
    packed_cfg.model.moe_layer_freq = freq
    packed_cfg.model.cuda_graph_impl = "transformer_engine"
    set_cuda_graph_modules(packed_cfg.model, ["mlp"])
    error = mb_validate(packed_cfg, 8)  # Megatron-Core's own answer, from TransformerConfig.__post_init__
    refused = error is not None
    assert not refused or "mlp cuda graph is only supported for dense layers" in str(error)
    assert RuleContext(packed_cfg, 8).moe.dense_mlp is not refused
    kind = moe_kind(packed_cfg)
    assert model_layer_kinds(packed_cfg) == ({kind} if refused else {kind, "dense"})
    found = [v for v in check(packed_cfg, world_size=8) if v.rule_id == "cuda_graphs.capture_host_reads"]
    assert [v.rule.startswith(f"Megatron-Core refuses the [mlp] scope for {kind} layers") for v in found] == (
        [True] if refused else []
    )
