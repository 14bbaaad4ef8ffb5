"""Model families are recognised from the providers users actually build: ``AutoBridge`` over a hub id or an
in-code config (a plain ``GPTModelProvider``), also after Megatron-Bridge's YAML round trip."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mbridge_seqpack import check
from mbridge_seqpack.analysis.model_family import GLM45, QWEN3_NEXT, detect_model_family

pytestmark = pytest.mark.slow


def _provider(hub_id: str) -> Any:
    from megatron.bridge import AutoBridge

    from tests.zoo.hf_configs import config_for

    return AutoBridge.from_hf_config(config_for(hub_id)).to_megatron_provider(load_weights=False)


@pytest.mark.parametrize(
    "hub_id, family",
    [
        ("zai-org/GLM-4.5", GLM45),
        ("zai-org/GLM-4.5-Air", GLM45),
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", QWEN3_NEXT),
        ("meta-llama/Meta-Llama-3-8B", None),
        ("Qwen/Qwen3-30B-A3B", None),
        ("deepseek-ai/DeepSeek-V3", None),
        ("openai/gpt-oss-20b", None),
        ("allenai/OLMoE-1B-7B-0924", None),
    ],
)
def test_family_from_autobridge_provider(megatron_bridge: Any, hub_id: str, family: str | None) -> None:
    provider = _provider(hub_id)
    assert type(provider).__name__ in ("GPTModelProvider", "MLAModelProvider", "Qwen3NextModelProvider") or family
    assert detect_model_family(provider) == family


def test_glm45_offline_packing_advisory_survives_yaml_round_trip(packed_cfg: Any, tmp_path: Any) -> None:
    from megatron.bridge.training.config import ConfigContainer

    cfg = copy.deepcopy(packed_cfg)
    cfg.model = _provider("zai-org/GLM-4.5")
    cfg.model.seq_length = 4096
    found = [v for v in check(cfg, world_size=8) if v.rule_id == "model.offline_packing_opt_out"]
    assert [(v.severity, v.fields["model family"]) for v in found] == [("advisory", GLM45)]
    path = tmp_path / "run_config.yaml"
    cfg.to_yaml(str(path))
    loaded = ConfigContainer.from_yaml(str(path))
    assert type(loaded.model).__name__ == type(cfg.model).__name__
    assert detect_model_family(loaded.model) == GLM45
    assert [v.rule_id for v in check(loaded, world_size=8) if v.rule_id.startswith("model.")] == [
        "model.offline_packing_opt_out"
    ]
