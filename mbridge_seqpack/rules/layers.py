"""Layer settings Megatron-Core refuses when the layer is built or first runs, outside packing: multi-token
prediction under uniform full recompute with more than one layer a unit, and Transformer Engine attention whose
query-key layer scaling disagrees with the environment variable TE reads."""

from __future__ import annotations

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.attention import _env_value
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import rule

QK_SCALING_ENV = "NVTE_APPLY_QK_LAYER_SCALING"


@rule(
    "mtp.full_recompute_layers",
    "Multi-token prediction under uniform full recompute needs recompute_num_layers=1.",
    severity=ERROR,
    evidence=(
        "megatron/core/transformer/multi_token_prediction.py MultiTokenPredictionLayer._checkpointed_forward (taken "
        "when recompute_granularity='full' in training) asserts 'recompute_num_layers must be 1 for MTP recompute' "
        "for recompute_method='uniform' at the first forward (run on CPU); TransformerConfig bounds "
        "recompute_num_layers by the "
        "decoder's layers, not the MTP layers'."
    ),
)
def mtp_full_recompute_layers(ctx: RuleContext) -> list[Violation] | None:
    m = ctx.model
    if ctx.mtp_layers == 0 or getattr(m, "recompute_granularity", None) != "full":
        return None
    if getattr(m, "recompute_method", None) != "uniform" or getattr(m, "recompute_num_layers", None) in (None, 1):
        return []
    return [
        Violation(
            {
                "model.mtp_num_layers": ctx.mtp_layers,
                "model.recompute_granularity": "full",
                "model.recompute_method": "uniform",
                "model.recompute_num_layers": m.recompute_num_layers,
            },
            "each MTP layer is recomputed as a unit of one layer: the first forward asserts",
            assignments={"model.recompute_num_layers": 1},
        )
    ]


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
