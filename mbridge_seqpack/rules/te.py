"""``te.*``: Transformer Engine attention whose query-key layer scaling disagrees with the environment variable TE
reads."""

from __future__ import annotations

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.field_types import BOOL, MAPPING, UNCHECKED
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.shared import _env_value

QK_SCALING_ENV = "NVTE_APPLY_QK_LAYER_SCALING"


@rule(
    "te.qk_layer_scaling_env",
    "apply_query_key_layer_scaling must agree with NVTE_APPLY_QK_LAYER_SCALING for Transformer Engine attention.",
    severity=ERROR,
    evidence=(
        "megatron/core/extensions/transformer_engine.py TEDotProductAttention.__init__ raises ValueError "
        "'apply_query_key_layer_scaling is X but environment variable NVTE_APPLY_QK_LAYER_SCALING is Y' when "
        "config.apply_query_key_layer_scaling != bool(int(os.getenv('NVTE_APPLY_QK_LAYER_SCALING', '0'))), when the "
        "model is built (run on CPU); runtime_config_update exports the config's env_vars first, and neither "
        "TransformerConfig nor Megatron-Bridge sets or checks the variable."
    ),
    reads={"env_vars": MAPPING, "model.apply_query_key_layer_scaling": BOOL, "model.transformer_impl": UNCHECKED},
)
def qk_layer_scaling_env(ctx: RuleContext) -> list[Violation] | None:
    if getattr(ctx.model, "transformer_impl", "transformer_engine") != "transformer_engine":
        return None
    wanted = bool(getattr(ctx.model, "apply_query_key_layer_scaling", False))
    value = _env_value(ctx, QK_SCALING_ENV)
    try:
        seen = bool(int(value if value is not None else "0"))
    except ValueError:
        seen = None  # int() fails inside TEDotProductAttention too
    if seen == wanted:
        return []
    return [
        Violation(
            {"model.apply_query_key_layer_scaling": wanted, f"env {QK_SCALING_ENV}": value},
            "Transformer Engine reads query-key layer scaling from the environment and Megatron-Core refuses a "
            "config that says otherwise when the model is built",
            assignments={f"env_vars.{QK_SCALING_ENV}": "1" if wanted else "0"},
        )
    ]
