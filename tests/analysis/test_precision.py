"""Where a run's precision fields come from (``analysis/precision.py``): Megatron-Bridge's own recipe table for a
name, the config object as given, else the model's fields; the rules' ``RuleContext.precision_source`` and the
attention verdict's precision read that one answer."""

from __future__ import annotations

from typing import Any

from mbridge_seqpack.analysis import attention_backend as ab
from mbridge_seqpack.analysis.precision import precision_source
from mbridge_seqpack.rules import RuleContext


def test_a_recipe_name_is_megatron_bridges_preset(packed_cfg: Any) -> None:
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    packed_cfg.mixed_precision = "bf16_with_fp8_delayed_scaling_mixed"
    prefix, source = precision_source(packed_cfg)
    assert prefix == "mixed_precision"
    assert source == get_mixed_precision_config("bf16_with_fp8_delayed_scaling_mixed")
    assert RuleContext(packed_cfg, 8).precision_source == (prefix, source)
    assert ab._precision(packed_cfg).fp8 == source.fp8 == "hybrid"  # the preset's field, not the model's


def test_an_unknown_recipe_name_has_no_source_and_the_verdict_reads_the_models_fields(packed_cfg: Any) -> None:
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    packed_cfg.mixed_precision = "no_such_recipe"
    try:
        get_mixed_precision_config("no_such_recipe")
    except ValueError:
        pass
    else:
        raise AssertionError("Megatron-Bridge knows the recipe this test takes as unknown")
    packed_cfg.model.fp8 = "e4m3"
    assert precision_source(packed_cfg) is None
    assert RuleContext(packed_cfg, 8).precision_source is None
    assert ab._precision(packed_cfg).fp8 == "e4m3"


def test_a_config_object_or_none_is_read_as_given(packed_cfg: Any) -> None:
    from megatron.bridge.training.mixed_precision import MixedPrecisionConfig

    mixed = MixedPrecisionConfig(fp8="e4m3")
    packed_cfg.mixed_precision = mixed
    assert precision_source(packed_cfg) == ("mixed_precision", mixed)
    assert ab._precision(packed_cfg).fp8 == "e4m3"
    packed_cfg.mixed_precision = None
    packed_cfg.model.fp8 = None
    assert precision_source(packed_cfg) == ("model", packed_cfg.model)
    assert ab._precision(packed_cfg).fp8 is None
