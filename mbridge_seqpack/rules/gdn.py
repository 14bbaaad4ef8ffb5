"""``gdn.*``: what Megatron-Core's ``GatedDeltaNet`` asserts of packed rows."""

from __future__ import annotations

from typing import Any

from mbridge_seqpack.analysis.model_family import GDN, hybrid_layer_counts
from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.field_types import BOOL, OPTIONAL_NON_NEGATIVE_INT, UNCHECKED
from mbridge_seqpack.rules.registry import rule


def has_gdn_layers(model: Any) -> bool:
    """Gated delta net layers: a GPT stack with ``experimental_attention_variant='gated_delta_net'`` (Qwen3-Next,
    Qwen3.5, Qwen3.5-VL; models/gpt/experimental_attention_variant_module_specs.py) or 'G' in a hybrid pattern."""
    if getattr(model, "experimental_attention_variant", None) == "gated_delta_net":
        return True
    return hybrid_layer_counts(model).get(GDN, 0) > 0


@rule(
    "gdn.packing_deterministic",
    "Gated delta net layers over packed rows cannot run with deterministic_mode.",
    severity=ERROR,
    evidence=(
        "megatron/core/ssm/gated_delta_net/gdn.py GatedDeltaNet.forward asserts 'Packed sequence does not support "
        "deterministic mode.' whenever packed_seq_params (THD) is passed and config.deterministic_mode is set (run on "
        "CPU): the first forward of every GDN layer (Qwen3-Next, Qwen3.5, Qwen3.5-VL, hybrid 'G' layers) over "
        "offline, in-batch (also deferred to qwen3_vl_step) or Energon packed rows fails."
    ),
    reads={
        "dataset.enable_in_batch_packing": BOOL,
        "dataset.enable_offline_packing": BOOL,
        "dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT,
        "model.deterministic_mode": BOOL,
        "model.experimental_attention_variant": UNCHECKED,
        "model.hybrid_layer_pattern": UNCHECKED,
    },
)
def gdn_packing_deterministic(ctx: RuleContext) -> list[Violation] | None:
    flags = ctx.packing_flags
    if not flags or not has_gdn_layers(ctx.model):
        return None
    if not getattr(ctx.model, "deterministic_mode", False):
        return []
    return [
        Violation(
            {"model.deterministic_mode": True, "model": type(ctx.model).__name__, **flags},
            "gated delta net layers refuse packed sequences in deterministic mode: the first forward asserts",
            assignments={"model.deterministic_mode": False},
        )
    ]
