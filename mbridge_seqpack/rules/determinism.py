"""``determinism.*``: Megatron-Core refuses deterministic mode without the Transformer Engine variable that makes
its attention deterministic."""

from __future__ import annotations

import os

from mbridge_seqpack.analysis.attention_backend import (
    NONDETERMINISTIC_ENV,
)
from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.field_types import BOOL, MAPPING, UNCHECKED
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.shared import _env_value


@rule(
    "determinism.te_attention_env",
    "deterministic_mode with Transformer Engine attention needs NVTE_ALLOW_NONDETERMINISTIC_ALGO=0.",
    severity=ERROR,
    evidence=(
        "megatron/core/extensions/transformer_engine.py TEDotProductAttention.__init__ raises RuntimeError "
        "'deterministic_mode is on ... but NVTE_ALLOW_NONDETERMINISTIC_ALGO is not 0' when the model is built, "
        "after the GPUs are allocated; Megatron-Bridge's _validate_and_apply_deterministic_mode checks NCCL_ALGO "
        "only (areal-project/AReaL#1544: the variable must be set before the model is built)."
    ),
    reads={"env_vars": MAPPING, "model.deterministic_mode": BOOL, "model.transformer_impl": UNCHECKED},
)
def te_attention_env(ctx: RuleContext) -> list[Violation] | None:
    if not getattr(ctx.model, "deterministic_mode", False):
        return None
    if getattr(ctx.model, "transformer_impl", "transformer_engine") != "transformer_engine":
        return None
    value = _env_value(ctx, NONDETERMINISTIC_ENV)
    if value is not None and value.strip() == "0":
        return []
    why = (
        "Megatron-Core builds Transformer Engine attention only when non-deterministic algorithms are "
        "disallowed, and raises at model build otherwise"
    )
    fields = {"model.deterministic_mode": True, f"env {NONDETERMINISTIC_ENV}": value}
    if NONDETERMINISTIC_ENV in os.environ:  # runtime_config_update's setdefault leaves a launch value in place
        return [
            Violation(
                fields,
                f"{why}; the launch environment sets it, and env_vars do not override a launch value "
                "(runtime_config_update: os.environ.setdefault)",
                fix=f"export {NONDETERMINISTIC_ENV}=0 in the launch environment (or unset it and set env_vars)",
            )
        ]
    return [Violation(fields, why, assignments={f"env_vars.{NONDETERMINISTIC_ENV}": "0"})]
