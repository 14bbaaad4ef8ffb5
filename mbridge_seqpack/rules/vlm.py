"""``vlm.*``: VLM collators that refuse packing."""

from __future__ import annotations

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.field_types import BOOL
from mbridge_seqpack.rules.registry import rule

#: providers whose registered collate (data/collators/registry.py, keyed by HF processor type) or step refuses
#: in-batch packing: (module, class) -> that processor's name
_MODELS = "megatron.bridge.models"


REFUSING_COLLATE_FAMILIES = {
    (f"{_MODELS}.nemotron_vl.nemotron_vl_provider", "NemotronVLModelProvider"): "NemotronNanoVLV2Processor",
    (f"{_MODELS}.qwen_omni.qwen3_omni_provider", "Qwen3OmniModelProvider"): "Qwen3OmniMoeProcessor",
}


def _refusing_collate_families() -> dict[type, str]:
    """The provider classes of ``REFUSING_COLLATE_FAMILIES`` this installation has (a family whose module does not
    import, e.g. for a missing optional dependency, cannot be the model either)."""
    import importlib

    found = {}
    for (module, name), processor in REFUSING_COLLATE_FAMILIES.items():
        try:
            found[getattr(importlib.import_module(module), name)] = processor
        except (ImportError, AttributeError):
            continue
    return found


@rule(
    "vlm.collate_refuses_packing",
    "Nemotron Nano VL V2 and Qwen3-Omni cannot use in-batch packing (their collate and step refuse it).",
    severity=ERROR,
    evidence=(
        "megatron/bridge/data/datasets/direct_sft.py DirectSFTDataset picks the collate registered for the HF "
        "processor type (data/collators/registry.py): models/nemotron_vl/data/collate_fn.py "
        "nemotron_nano_v2_vl_collate_fn raises 'Nemotron-VL collation does not support in-batch packing' and "
        "models/qwen_omni/data/collate_fn.py qwen3_omni_collate_fn 'Qwen3-Omni does not support in-batch packing' "
        "(both run on CPU) at the first batch; deferring to the step does not help: training/vlm_step.py raises "
        "'vlm_step requires collate-time in-batch packing' and models/qwen_omni/qwen3_omni_step.py "
        "NotImplementedError. recipes/common.py _sft_common_vlm / _peft_common_vlm turn packing on; the "
        "Nemotron-VL and Qwen3-Omni recipes turn it off again."
    ),
    reads={"dataset.enable_in_batch_packing": BOOL},
)
def collate_refuses_packing(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.in_batch_packing:
        return None
    families = _refusing_collate_families().items()
    processor = next((name for klass, name in families if isinstance(ctx.model, klass)), None)
    if processor is None:
        return []
    return [
        Violation(
            {"model": type(ctx.model).__name__, "dataset.enable_in_batch_packing": True},
            f"the collate registered for {processor} raises on in-batch packing at the first batch (and the step "
            "refuses packing deferred to it)",
            assignments={"dataset.enable_in_batch_packing": False},
        )
    ]
