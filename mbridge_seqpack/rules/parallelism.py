"""Context-parallel rules: sequence divisibility, fine-tuning loss settings, hierarchical CP, THD support."""

from __future__ import annotations

import math

from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.model_family import per_token_loss_after_finalize
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.topology import round_up


def _seq_length_fix(ctx: RuleContext, new_length: int) -> dict[str, int]:
    """Move every copy of the sequence length together (model, dataset, pack size)."""
    fix = {"model.seq_length": new_length}
    if hasattr(ctx.dataset, "seq_length"):
        fix["dataset.seq_length"] = new_length
    if ctx.specs is not None:
        fix["dataset.offline_packing_specs.packed_sequence_size"] = new_length
    return fix


@rule(
    "cp.seq_length_divisible",
    "With CP>1, model.seq_length must be divisible by 2*CP.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate asserts model.seq_length % (2*CP) == 0 for the train CP "
        "(evaluation runs at the train CP in 0.6.2: see cp.eval_cp_has_no_effect)."
    ),
)
def seq_length_divisible_by_2cp(ctx: RuleContext) -> list[Violation] | None:
    topo = ctx.topology
    if topo.cp <= 1:
        return None
    need = 2 * topo.cp
    seq = ctx.model.seq_length
    if seq % need == 0:
        return []
    fields = {"model.seq_length": seq, "model.context_parallel_size": topo.cp}
    return [
        Violation(
            fields,
            f"with context parallelism every rank holds 2 chunks per sequence, so seq_length must be a multiple "
            f"of 2*CP = {need}; {seq} is not (THD would round lengths down and drop tokens)",
            assignments=_seq_length_fix(ctx, round_up(seq, need)),
        )
    ]


@rule(
    "collate.seq_length_alignment",
    "DirectHF/Energon/MockVLM: dataset.seq_length divisible by lcm(2*CP, CP*TP if SP) for train and eval CP.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError '<Dataset>.seq_length must be "
        "divisible by the CP/SP collate padding multiple' for DirectHF/Energon/MockVLM datasets."
    ),
)
def collate_seq_length_alignment(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.has_collate_padding:
        return None
    need = ctx.topology.alignment
    seq = ctx.dataset.seq_length
    if seq % need == 0:
        return []
    topo = ctx.topology
    return [
        Violation(
            {
                "dataset.seq_length": seq,
                "model.context_parallel_size": topo.cp,
                "model.tensor_model_parallel_size": topo.tp,
                "model.sequence_parallel": topo.sequence_parallel,
            }
            | ({} if topo.eval_cp is None else {"dist.eval_context_parallel_size": topo.eval_cp}),
            f"the collate pads every sequence to the CP/SP multiple {need}, so dataset.seq_length must be "
            f"a multiple of {need}",
            assignments=_seq_length_fix(ctx, round_up(seq, need)),
        )
    ]


@rule(
    "cp.eval_cp_has_no_effect",
    "dist.eval_context_parallel_size has no effect in Megatron-Bridge 0.6.2: evaluation runs at the training CP.",
    severity=ADVISORY,
    evidence=(
        "training/state.py GlobalState._eval_pgs is only ever None (nothing builds eval-time CP groups), and "
        "training/eval_context_parallel_rebinding.py eval_cp_context is never called; training/config.py still "
        "uses the value for its eval batch arithmetic and the DirectHF/Energon/MockVLM collate multiple."
    ),
)
def eval_cp_has_no_effect(ctx: RuleContext) -> list[Violation] | None:
    eval_cp = ctx.topology.eval_cp
    if eval_cp is None:
        return None
    if eval_cp == ctx.topology.cp:
        return []
    return [
        Violation(
            {"dist.eval_context_parallel_size": eval_cp, "model.context_parallel_size": ctx.topology.cp},
            f"evaluation runs at the training CP ({ctx.topology.cp}), not at {eval_cp}: Megatron-Bridge 0.6.2 never "
            "wires evaluation-time context parallelism",
            assignments={"dist.eval_context_parallel_size": None},
        )
    ]


@rule(
    "cp.finetune_per_token_loss",
    "Fine-tuning with CP>1 needs model.calculate_per_token_loss=True.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate asserts 'When finetuning with CP>1, "
        "calculate_per_token_loss must be True' (GPT SFT, DirectHF, Energon, MockVLM datasets), after "
        "model.finalize(): the Qwen3-VL / Qwen3.5-VL providers turn it on themselves at CP>1."
    ),
)
def finetune_per_token_loss(ctx: RuleContext) -> list[Violation] | None:
    if ctx.topology.cp <= 1 or not ctx.is_finetuning:
        return None
    if per_token_loss_after_finalize(ctx.model, ctx.topology.cp):
        return []
    return [
        Violation(
            {"model.calculate_per_token_loss": False, "model.context_parallel_size": ctx.topology.cp},
            "with CP>1 a rank can hold only masked (prompt/padding) tokens; per-sequence loss averaging then "
            "divides by zero and gives NaN, so fine-tuning must use per-token loss",
            assignments={"model.calculate_per_token_loss": True},
        )
    ]


def _uses_megatron_fsdp(ctx: RuleContext) -> bool:
    return bool(getattr(ctx.cfg.dist, "use_megatron_fsdp", False) or getattr(ctx.cfg.ddp, "use_megatron_fsdp", False))


@rule(
    "cp.finetune_average_in_collective",
    "Fine-tuning with CP>1 needs ddp.average_in_collective=False.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate asserts 'When finetuning with CP>1, "
        "average_in_collective must be False' (Megatron-FSDP sets it to False itself)."
    ),
)
def finetune_average_in_collective(ctx: RuleContext) -> list[Violation] | None:
    if ctx.topology.cp <= 1 or not ctx.is_finetuning or _uses_megatron_fsdp(ctx):
        return None  # Megatron-FSDP forces it to False itself
    if not getattr(ctx.cfg.ddp, "average_in_collective", False):
        return []
    return [
        Violation(
            {"ddp.average_in_collective": True, "model.context_parallel_size": ctx.topology.cp},
            "per-token loss under CP sums token counts across ranks; averaging gradients inside the collective "
            "divides a second time",
            assignments={"ddp.average_in_collective": False},
        )
    ]


def _comm_types(ctx: RuleContext) -> list[str]:
    value = getattr(ctx.model, "cp_comm_type", None)
    return list(value) if isinstance(value, list) else [value or "p2p"]


def _suggest_hierarchy(ctx: RuleContext) -> list[int]:
    """A 2-level split that keeps the a2a level inside an 8-GPU node when it can, and no larger than what each TP
    rank's query and key/value heads divide by (the a2a level scatters heads: cp.a2a_heads_divisible)."""
    cp, tp = ctx.topology.cp, max(ctx.topology.tp, 1)
    heads = int(getattr(ctx.model, "num_attention_heads", 0) or 0)
    groups = int(getattr(ctx.model, "num_query_groups", None) or heads)
    inner = math.gcd(math.gcd(cp, max(1, 8 // tp)), math.gcd(heads // tp, groups // tp) or cp)
    return [inner, cp // inner]


@rule(
    "cp.hierarchical_sizes_required",
    "cp_comm_type 'a2a+p2p' needs model.hierarchical_context_parallel_sizes.",
    severity=ERROR,
    evidence=(
        "megatron/core/extensions/transformer_engine.py TEDotProductAttention.__init__ passes "
        "get_hierarchical_context_parallel_groups(check_initialized=False) as cp_group for 'a2a+p2p'; without "
        "hierarchical sizes parallel_state never creates those groups, so TE gets cp_group=None (crash at "
        "model build)."
    ),
)
def hierarchical_sizes_required(ctx: RuleContext) -> list[Violation] | None:
    if not any(t is not None and "a2a+p2p" in t for t in _comm_types(ctx)):
        return None
    if getattr(ctx.model, "hierarchical_context_parallel_sizes", None) is not None:
        return []
    return [
        Violation(
            {
                "model.cp_comm_type": getattr(ctx.model, "cp_comm_type", None),
                "model.hierarchical_context_parallel_sizes": None,
            },
            "without hierarchical sizes the a2a+p2p CP communication is silently disabled: each rank attends "
            "only to its local chunk (fast, and wrong)",
            assignments={"model.hierarchical_context_parallel_sizes": _suggest_hierarchy(ctx)},
        )
    ]


@rule(
    "cp.hierarchical_sizes_product",
    "prod(model.hierarchical_context_parallel_sizes) must equal CP.",
    severity=ERROR,
    evidence=(
        "megatron/core/parallel_state.py initialize_model_parallel asserts "
        "np.prod(hierarchical_context_parallel_sizes) == context_parallel_size."
    ),
)
def hierarchical_sizes_product(ctx: RuleContext) -> list[Violation] | None:
    sizes = getattr(ctx.model, "hierarchical_context_parallel_sizes", None)
    if sizes is None:
        return None
    cp = ctx.topology.cp
    if math.prod(sizes) == cp:
        return []
    return [
        Violation(
            {"model.hierarchical_context_parallel_sizes": list(sizes), "model.context_parallel_size": cp},
            f"the hierarchical CP levels must multiply to context_parallel_size ({math.prod(sizes)} != {cp})",
            assignments={"model.hierarchical_context_parallel_sizes": _suggest_hierarchy(ctx)},
        )
    ]


MIN_MCORE_FOR_THD_CP = (0, 18, 0)


def _mcore_version() -> tuple[int, ...]:
    from megatron.core import package_info
    from packaging.version import Version

    return Version(package_info.__version__).release[:3]


@rule(
    "cp.thd_mcore_version",
    "Packed (THD) sequences with CP>1 need Megatron-Core >= 0.18.",
    severity=ERROR,
    evidence=(
        "THD partitioning under CP (megatron/core/utils.py get_thd_cp_partition_indices) does not exist "
        "before Megatron-Core 0.18: training/gpt_step.py cannot import it."
    ),
)
def thd_mcore_version(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.any_packing or ctx.topology.cp <= 1:
        return None
    version = _mcore_version()
    if version >= MIN_MCORE_FOR_THD_CP:
        return []
    return [
        Violation(
            {"megatron.core.__version__": ".".join(map(str, version)), "model.context_parallel_size": ctx.topology.cp},
            "THD context-parallel partitioning (thd_get_partitioned_indices) exists from Megatron-Core 0.18",
            fix="pip install 'megatron-core>=0.18' (or set cfg.model.context_parallel_size = 1)",
        )
    ]
