"""Transformer Engine's own attention backend selection must leave a backend for every layer (computed by calling
it: ``analysis/attention_backend.py``), and NVTE_*_ATTN variables must not contradict ``attention_backend``.
Megatron-Bridge 0.6.2's validate() checks neither."""

from __future__ import annotations

from typing import Any

from mbridge_seqpack.analysis.attention_backend import (
    BACKEND_ENV,
    claims,
    mcore_backend_env,
    no_backend_violation,
    not_computed_violation,
    recipe_switch_violation,
    training_env,
    undetermined_violation,
)
from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import ATTENTION_VERDICT_READS, TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.cp import a2a_heads_divisible
from mbridge_seqpack.rules.field_types import (
    BOOL,
    MAPPING,
    OPTIONAL_NAME,
    OPTIONAL_NON_NEGATIVE_INT,
    OPTIONAL_PATH,
    UNCHECKED,
)
from mbridge_seqpack.rules.registry import rule


@rule(
    "attention.backend_available",
    "Transformer Engine's own backend selection must leave an attention backend for every layer.",
    severity=ERROR,
    evidence=(
        "transformer_engine/pytorch/attention/dot_product_attention/utils.py get_attention_backend, called here "
        "unchanged on the AttentionParams DotProductAttention.forward builds for each kind of layer "
        "(analysis/attention_backend.py: THD and pad_between_seqs from Megatron-Bridge's batches, CP size and comm "
        "type, window, softmax, determinism, FP8 attention, the NVTE_* variables Megatron-Core's "
        "_set_attention_backend leaves) on the target GPU (analysis/te_attention.py: architecture, cuDNN, flash-attn "
        "declared; TE's fixed FusedAttention rules applied as data, analysis/te_fused_rules.py; cuDNN's own support "
        "query assumed to accept); when it leaves none, "
        "dot_product_attention.py DotProductAttention.forward raises 'No dot product attention backend is "
        "available for the provided inputs' at the first forward (NVIDIA-NeMo/Megatron-Bridge#2298). Layers a "
        "cp.* rule reports are left to it. With NVTE_DPA_FP8_RECIPE set and FP8 attention on, not determined: "
        "DotProductAttention.init_fp8_metadata swaps the attention's recipe on the GPU. Where TE cannot be "
        "imported or the model cannot be read as Megatron-Core reads it, not determined; n/a where no TE core "
        "attention runs (a spec's own core attention, a hybrid pattern without attention layers) and for Energon's "
        "online packing, whose batches the model's own task encoder makes."
    ),
    reads={
        **ATTENTION_VERDICT_READS,
        **TOPOLOGY_READS,
        "dataset.enable_in_batch_packing": BOOL,
        "dataset.offline_packing_specs.packed_metadata_path": OPTIONAL_PATH,
        "dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT,
        "mixed_precision.bf16": UNCHECKED,
        "mixed_precision.first_last_layers_bf16": UNCHECKED,
        "mixed_precision.fp8": UNCHECKED,
        "mixed_precision.fp8_dot_product_attention": UNCHECKED,
        "mixed_precision.fp8_recipe": OPTIONAL_NAME,
        "model.first_last_layers_bf16": UNCHECKED,
        "model.flash_attention_version": UNCHECKED,
        "model.fp8_dot_product_attention": UNCHECKED,
        "model.hidden_size": UNCHECKED,
        "model.num_layers_at_end_in_bf16": UNCHECKED,
        "model.num_layers_at_start_in_bf16": UNCHECKED,
        "model.window_attn_skip_freq": UNCHECKED,
    },
)
def backend_available(ctx: RuleContext) -> list[Violation] | None:
    verdict = ctx.attention_verdict
    if not verdict.computed:  # n/a only where no TE core attention runs; else not determined, never silence
        if verdict.recipe_switched:
            return [recipe_switch_violation(verdict)]
        return [not_computed_violation(ctx.cfg, verdict)] if verdict.applies else None
    heads_split = bool(a2a_heads_divisible(ctx))  # that rule reports a2a layers whose heads TE cannot split

    def own(kind: Any) -> bool:  # not a layer kind another rule reports
        return not claims(ctx, kind.kind) and not (heads_split and kind.kind.cp_comm_type in ("a2a", "a2a+p2p"))

    mine = [k for k in verdict.kinds if own(k)]
    found = [no_backend_violation(ctx.cfg, verdict, failing) for failing in verdict.failing if own(failing)]
    if verdict.undetermined_for(mine) is not None:  # kinds served on some stacks asked and not on others
        found.append(undetermined_violation(ctx.cfg, verdict, mine))
    return found


@rule(
    "attention.backend_env_conflict",
    "An NVTE_*_ATTN variable set for the launch must agree with an AttnBackend model.attention_backend.",
    severity=ERROR,
    evidence=(
        "megatron/core/models/common/language_module/language_module.py LanguageModule._set_attention_backend "
        "(run by GPTModel.__init__, when the model is built) asserts 'NVTE_... set to ..., but expected ... for "
        "attention backend type ...' for every AttnBackend value, the default auto included (it expects 1 for all "
        "three); run here on a copy of the launch's NVTE_* variables (environment, then env_vars as "
        "runtime_config_update's setdefault leaves them). A string value sets and checks nothing."
    ),
    reads={"env_vars": MAPPING, "model.attention_backend": OPTIONAL_NAME},
)
def backend_env_conflict(ctx: RuleContext) -> list[Violation] | None:
    env = training_env(ctx.cfg)
    if not any(name in env for name in BACKEND_ENV) or not hasattr(ctx.model, "attention_backend"):
        return None
    _, conflict = mcore_backend_env(ctx.model, env)
    if conflict is None:
        return []
    name, value, expected = _conflict_parts(conflict)
    pinned = getattr(ctx.model, "attention_backend", None)
    return [
        Violation(
            {"model.attention_backend": f"AttnBackend.{getattr(pinned, 'name', pinned)}", f"env {name}": value},
            f"Megatron-Core asserts when the model is built: {conflict.split('. ')[0]}",
            fix=(
                f"cfg.model.attention_backend = 'auto' (as an override: a string, for which Megatron-Core sets and "
                f"checks no variable, so Transformer Engine honours {name}={value}); or unset {name} "
                f"(or set it to {expected})"
            ),
            assignments={"model.attention_backend": "auto"},
        )
    ]


def _conflict_parts(message: str) -> tuple[str, str, str]:
    """(variable, value, expected) from _set_attention_backend's assertion message."""
    import re

    found = re.match(r"(\w+) set to (.*?), but expected (\w+)", message)
    return (found.group(1), found.group(2), found.group(3)) if found else ("NVTE_*_ATTN", "?", "?")
