"""The launch in miniature (issue #49): what Megatron-Bridge's ``setup()`` constructs after ``validate()``, constructed
at config time on CPU (``mbridge_seqpack/minilaunch``), so a config that fails once the GPUs are allocated fails
here, with Megatron's own message.
"""

from __future__ import annotations

import copy
from typing import Any

from mbridge_seqpack.errors import ERROR, UNDETERMINED, Violation
from mbridge_seqpack.minilaunch import LAUNCH_ENV, STEP_SCOPE, enabled
from mbridge_seqpack.rules.context import DATASET_KWARGS_READS, EQUIVALENCE_READS, RuleContext
from mbridge_seqpack.rules.field_types import (
    BOOL,
    MAPPING,
    OPTIONAL_NAME,
    OPTIONAL_POSITIVE_INT,
    POSITIVE_INT,
    UNCHECKED,
)
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.shared import no_packing

__all__ = ["model_build", "CANDIDATE_FIXES"]

#: fixes to try for a refusal whose message names the setting (each offered only where the construction then
#: succeeds): the message fragment, then the assignments
CANDIDATE_FIXES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("RNG tracker", {"rng.te_rng_tracker": True}),
    ("average in collective", {"ddp.average_in_collective": False}),
    ("context parallelism", {"model.context_parallel_size": 1}),
)

_BUILD_READS = {
    "peft": UNCHECKED,
    "env_vars": MAPPING,  # the launch's environment, as construction reads it (NVTE_*, ...)
    # the fields a verified candidate fix names (CANDIDATE_FIXES), read for the violation
    "ddp.average_in_collective": BOOL,
    "model.context_parallel_size": POSITIVE_INT,
    "dist.use_megatron_fsdp": BOOL,
    "dist.use_torch_fsdp2": BOOL,
    "optimizer.overlap_param_gather_with_optimizer_step": BOOL,
    "rng.data_parallel_random_init": BOOL,
    "rng.te_rng_tracker": BOOL,
}


def _verified_fix(cfg: Any, error: str) -> dict[str, Any]:
    """The first candidate fix the message names under which the same construction succeeds, else {}."""
    from mbridge_seqpack.config_paths import set_path
    from mbridge_seqpack.minilaunch.build import construct

    for fragment, assignments in CANDIDATE_FIXES:
        if fragment.lower() not in error.lower():
            continue
        fixed = copy.deepcopy(cfg)
        for path, value in assignments.items():
            set_path(fixed, path, value)
        if construct(fixed).state == "built":
            return assignments
    return {}


@rule(
    "launch.model_build",
    "The model builds and wraps as the launch builds it (the provider's provide(), every module's constructor, "
    "Megatron-Core's DDP with the config's ddp settings).",
    severity=ERROR,
    evidence=(
        "Megatron-Bridge's setup() (training/setup.py _build_distributed_model) runs after validate(), once the GPUs "
        "are allocated: cfg.model.provide_distributed_model(ddp_config=cfg.ddp, use_megatron_fsdp, use_torch_fsdp2, "
        "overlap_param_gather_with_optimizer_step, data_parallel_random_init) -> models/model_provider.py get_model "
        "-> the provider's provide() (models/gpt_provider.py asserts use_te_rng_tracker for every CUDA-graph config; "
        "gemma_vl/gemma3_vl_provider.py raises for CP>1), each module's constructor, Float16Module, then "
        "megatron/core/distributed/distributed_data_parallel.py DistributedDataParallel.__init__ (asserts 'Cannot "
        "average in collective when calculating per-token loss!'). Computed: the same call with the same arguments "
        "on a copy of the provider at CPU widths (every switch, layer count and parallel size kept) in a one-rank "
        "gloo world (mbridge_seqpack/minilaunch); a raise inside Megatron at the same site at two widths is the "
        "launch's, anything this machine cannot run (a GPU path, a package not installed) is not determined. "
        f"Runs with {LAUNCH_ENV}=1 (opt-in until Megatron-Bridge's recipe zoo has run through it)."
    ),
    reads=_BUILD_READS,
)
def model_build(ctx: RuleContext) -> list[Violation] | None:
    if not enabled():
        return None
    from mbridge_seqpack.config_paths import get_path
    from mbridge_seqpack.minilaunch.build import built_with, construct

    found = construct(ctx.cfg)
    model = type(ctx.cfg.model).__name__
    if found.state == "invalid":
        return None  # validate() refuses the config before any model is built (Megatron's own message)
    if found.state == "built":
        return []
    if found.state == "not_run":
        return [
            Violation(
                {"model": model},
                "whether the model builds and wraps as the launch builds it is not determined here",
                fix="build it once where it can run (one step of the launch on a GPU node) before the full launch",
                severity=UNDETERMINED,
                not_run=f"{found.why} ({built_with(found)})",
            )
        ]
    assignments = _verified_fix(ctx.cfg, found.error)
    fields: dict[str, Any] = {"model": model, "raised": found.error, "at": found.site}
    for path in assignments:
        fields[path] = get_path(ctx.cfg, path)
    return [
        Violation(
            fields,
            f"the launch fails building the model, after the GPUs are allocated: {found.error} ({found.site}; "
            f"{built_with(found)})",
            fix="" if assignments else f"change the setting the message names (raised at {found.site})",
            assignments=assignments,
        )
    ]


@rule(
    "launch.packed_step",
    "One training step through the config's model gives every trained token the same loss packed as unpacked.",
    severity=ERROR,
    evidence=(
        "Computed on CPU (mbridge_seqpack/minilaunch/step.py): the check's sequences through Megatron-Bridge's own "
        "prep and collate, packed as the config packs and one per row unpacked (equivalence/batches.py), each micro "
        "batch through Megatron-Bridge's training/gpt_step.py forward_step (get_batch, _packed_metadata_for_forward, "
        "training/utils/packed_seq_utils.py get_packed_seq_params) and the model the config's provider builds "
        "(provide_distributed_model, Megatron-Core DDP): embedding, position ids, RoPE over THD "
        "(_apply_rotary_pos_emb_thd), attention, MLP or MoE, output layer and cross entropy. TE's attention kernel "
        "is CUDA only: core attention is a reference that reads qkv_format, cu_seqlens_q/kv, their padded forms "
        "and max_seqlen_q/kv as TE's DotProductAttention API documents them; TE's layer modules are Megatron-Core's "
        "local ones, in float32 without dropout. Compared per trained token: the loss the model returns. The step "
        f"covers {STEP_SCOPE}; each CP rank's share of the data is equivalence.labels' (a 2-rank world). Runs "
        f"with {LAUNCH_ENV}=1."
    ),
    reads={
        **EQUIVALENCE_READS,
        **DATASET_KWARGS_READS,
        **_BUILD_READS,
        "dataset.enable_offline_packing": BOOL,
        # the step's scope (minilaunch/step.py out_of_scope)
        "model.moe_token_dispatcher_type": OPTIONAL_NAME,
        "model.multi_latent_attention": UNCHECKED,
        "model.transformer_layer_spec": UNCHECKED,
        "model.use_transformer_engine_full_layer_spec": UNCHECKED,
        "model.virtual_pipeline_model_parallel_size": OPTIONAL_POSITIVE_INT,
    },
)
def packed_step(ctx: RuleContext) -> list[Violation] | None:
    if not enabled():
        return None
    from mbridge_seqpack.minilaunch.build import construct
    from mbridge_seqpack.minilaunch.step import STOOD_IN_WORDS
    from mbridge_seqpack.minilaunch.step import packed_step as step_of

    if construct(ctx.cfg).state in ("refused", "invalid"):
        return None  # the launch stops before the step: validate() or launch.model_build says so
    found = step_of(ctx.cfg)
    if found is None:
        return None
    fields: dict[str, Any] = {"model": type(ctx.cfg.model).__name__, **ctx.packing_flags}
    if found.state == "not_run":
        return [
            Violation(
                fields,
                "whether one packed training step trains what the unpacked step trains, through the config's model, "
                "is not determined here",
                fix="compare one packed and one unpacked step on a GPU (scripts/gpu_check.py) before the full launch",
                severity=UNDETERMINED,
                not_run=found.why,
            )
        ]
    if not found.differences:
        return []
    effect = "; ".join(found.differences)
    return [
        Violation(
            {**fields, "measured": effect},
            f"{effect}: packed training does not train what unpacked training trains (stood in: {STOOD_IN_WORDS})",
            fix="turn packing off until the difference is found: "
            + "; ".join(f"cfg.{k} = {v!r}" for k, v in no_packing(ctx).items()),
            assignments=no_packing(ctx),
        )
    ]
