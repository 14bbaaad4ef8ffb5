"""Process-group options Megatron-Core's initialize_model_parallel asserts when the groups are made (after the GPUs
are allocated): the partial distributed optimizer's instance count and the SHARP group."""

from __future__ import annotations

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import BOOL, OPTIONAL_NAME, POSITIVE_INT
from mbridge_seqpack.rules.registry import rule


@rule(
    "process_groups.optimizer_instances",
    "ddp.num_distributed_optimizer_instances must divide DP x CP and the expert data-parallel size.",
    severity=ERROR,
    evidence=(
        "megatron/core/parallel_state.py initialize_model_parallel asserts 'Data parallel size should be divisible by "
        "partial DistOpt shard factor' ((DP x CP) % num_distributed_optimizer_instances) and 'Expert data parallel "
        "size should be divisible by partial DistOpt shard factor' (expert DP = world / (expert TP x EP x PP)) when "
        "Megatron-Bridge's training/initialize.py builds the groups, after the GPUs are allocated; "
        "DistributedDataParallelConfig and ConfigContainer.validate do not compare them."
    ),
    reads={**TOPOLOGY_READS, "ddp.num_distributed_optimizer_instances": POSITIVE_INT},
)
def optimizer_instances_divide(ctx: RuleContext) -> list[Violation] | None:
    instances = getattr(getattr(ctx.cfg, "ddp", None), "num_distributed_optimizer_instances", 1)
    topo = ctx.topology
    if not isinstance(instances, int) or instances <= 1 or topo.data_parallel is None:
        return None
    dp_cp = topo.data_parallel * topo.cp
    expert_dp = (
        topo.world_size // topo.expert_model_parallel if topo.world_size % topo.expert_model_parallel == 0 else None
    )
    sizes = [s for s in (dp_cp, expert_dp) if s is not None]
    if all(s % instances == 0 for s in sizes):
        return []
    fitting = max(n for n in range(1, instances + 1) if all(s % n == 0 for s in sizes))
    return [
        Violation(
            {"ddp.num_distributed_optimizer_instances": instances, "DP x CP": dp_cp, "expert DP": expert_dp},
            "the partial distributed optimizer shards the data-parallel domain into this many instances, which must "
            "divide it (and the expert data-parallel domain): initialize_model_parallel asserts",
            assignments={"ddp.num_distributed_optimizer_instances": fitting},
        )
    ]


@rule(
    "process_groups.sharp_group",
    "dist.sharp_enabled_group needs dist.use_sharp, and 'dp_replica' needs more than one optimizer instance.",
    severity=ERROR,
    evidence=(
        "megatron/core/parallel_state.py initialize_model_parallel asserts 'sharp_enabled_group is only valid when "
        "use_sharp is True' and 'dp_replica group requires num_distributed_optimizer_instances > 1' when "
        "training/initialize.py builds the groups, after the GPUs are allocated (an unknown group name is "
        "config.known_values')."
    ),
    reads={
        "ddp.num_distributed_optimizer_instances": POSITIVE_INT,
        "dist.sharp_enabled_group": OPTIONAL_NAME,
        "dist.use_sharp": BOOL,
    },
)
def sharp_group(ctx: RuleContext) -> list[Violation] | None:
    dist = getattr(ctx.cfg, "dist", None)
    group = getattr(dist, "sharp_enabled_group", None)
    if group is None:
        return None
    instances = getattr(getattr(ctx.cfg, "ddp", None), "num_distributed_optimizer_instances", 1)
    if not getattr(dist, "use_sharp", False):
        return [
            Violation(
                {"dist.sharp_enabled_group": group, "dist.use_sharp": False},
                "a SHARP group is named but SHARP is off: initialize_model_parallel asserts",
                assignments={"dist.sharp_enabled_group": None},
            )
        ]
    if group == "dp_replica" and not (isinstance(instances, int) and instances > 1):
        return [
            Violation(
                {"dist.sharp_enabled_group": group, "ddp.num_distributed_optimizer_instances": instances},
                "SHARP over the replica group needs a partial distributed optimizer (more than one instance): "
                "initialize_model_parallel asserts",
                assignments={"dist.sharp_enabled_group": "dp"},
            )
        ]
    return []
