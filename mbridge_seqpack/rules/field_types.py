"""The type each field the rules read must hold (``FIELD_TYPES``) and the problems ``config.types`` reports."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from mbridge_seqpack.config_paths import get_path
from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext

__all__ = ["FieldType", "FIELD_TYPES", "type_problems"]

_MISSING = object()


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy.bool_


@dataclass(frozen=True)
class FieldType:
    """What one field may hold, in words and as a predicate, plus a value that always type-checks."""

    expects: str
    accepts: Callable[[Any], bool]
    example: Any


POSITIVE_INT = FieldType("a positive integer", lambda v: _is_int(v) and v > 0, 1)


OPTIONAL_POSITIVE_INT = FieldType("a positive integer or null", lambda v: v is None or (_is_int(v) and v > 0), None)


OPTIONAL_NON_NEGATIVE_INT = FieldType(
    "a non-negative integer or null", lambda v: v is None or (_is_int(v) and v >= 0), None
)


ANY_INT = FieldType("an integer", _is_int, -1)


NON_NEGATIVE_INT = FieldType("a non-negative integer", lambda v: _is_int(v) and v >= 0, 0)


BOOL = FieldType("true or false", _is_bool, False)


OPTIONAL_STR = FieldType("a string or null", lambda v: v is None or isinstance(v, str), None)


OPTIONAL_PATH = FieldType(
    "a path string or null", lambda v: v is None or isinstance(v, (str,)) or hasattr(v, "__fspath__"), None
)


OPTIONAL_MAPPING = FieldType("a mapping (dict) or null", lambda v: v is None or isinstance(v, Mapping), None)


CP_COMM_TYPE = FieldType(
    "null, a string (p2p, a2a, all_gather, a2a+p2p) or a list of those per layer",
    lambda v: (
        v is None
        or isinstance(v, str)
        or (isinstance(v, (list, tuple)) and all(x is None or isinstance(x, str) for x in v))
    ),
    None,
)


OPTIONAL_INT_LIST = FieldType(
    "null or a list of positive integers",
    lambda v: v is None or (isinstance(v, (list, tuple)) and all(_is_int(x) and x > 0 for x in v)),
    None,
)


MAPPING = FieldType("a mapping (dict)", lambda v: isinstance(v, Mapping), {})


#: None lets Megatron-Bridge's own 'must be defined' assertion (GPTDatasetConfig.finalize) speak
OPTIONAL_BOOL = FieldType("true, false or null", lambda v: v is None or _is_bool(v), None)


OPTIONAL_MICRO_BATCH = FieldType(
    "a positive integer (null lets Megatron-Bridge report it)", lambda v: v is None or (_is_int(v) and v > 0), 1
)


# dotted path -> type; a path whose parent is missing or None is not checked (the rules do not read it).
FIELD_TYPES: dict[str, FieldType] = {
    "model.seq_length": POSITIVE_INT,
    "model.tensor_model_parallel_size": POSITIVE_INT,
    "model.pipeline_model_parallel_size": POSITIVE_INT,
    "model.virtual_pipeline_model_parallel_size": OPTIONAL_POSITIVE_INT,
    "model.context_parallel_size": POSITIVE_INT,
    "model.expert_model_parallel_size": POSITIVE_INT,
    "model.expert_tensor_parallel_size": OPTIONAL_POSITIVE_INT,
    "model.sequence_parallel": BOOL,
    "model.calculate_per_token_loss": BOOL,
    "model.cp_comm_type": CP_COMM_TYPE,
    "model.hierarchical_context_parallel_sizes": OPTIONAL_INT_LIST,
    "model.cuda_graph_impl": OPTIONAL_STR,
    "model.mtp_num_layers": OPTIONAL_NON_NEGATIVE_INT,
    "dist.eval_context_parallel_size": OPTIONAL_POSITIVE_INT,
    "dist.use_megatron_fsdp": BOOL,
    "ddp.average_in_collective": BOOL,
    "ddp.use_megatron_fsdp": BOOL,
    "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
    "train.global_batch_size": OPTIONAL_MICRO_BATCH,
    "validation.eval_micro_batch_size": OPTIONAL_MICRO_BATCH,
    "dataset.seq_length": POSITIVE_INT,
    "dataset.enable_offline_packing": BOOL,
    "dataset.enable_in_batch_packing": BOOL,
    "dataset.defer_in_batch_packing_to_step": BOOL,
    "dataset.pad_to_max_length": BOOL,
    "dataset.packing_buffer_size": OPTIONAL_NON_NEGATIVE_INT,
    "dataset.dataset_kwargs": OPTIONAL_MAPPING,
    "dataset.dataset_kwargs['pad_to_max_length']": BOOL,
    "dataset.dataset_kwargs['pad_seq_length_to_mult']": POSITIVE_INT,
    "dataset.dataset_kwargs['answer_only_loss']": BOOL,  # equivalence: a string 'false' would train the prompts
    "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
    "dataset.offline_packing_specs.pad_seq_to_mult": POSITIVE_INT,  # None: gpt_sft.py collate `None > 1`
    "dataset.offline_packing_specs.max_single_sequence_length": OPTIONAL_POSITIVE_INT,
    "dataset.offline_packing_specs.pad_cu_seqlens": BOOL,
    "dataset.offline_packing_specs.packed_train_data_path": OPTIONAL_PATH,
    "dataset.offline_packing_specs.packed_val_data_path": OPTIONAL_PATH,
    "dataset.offline_packing_specs.packed_metadata_path": OPTIONAL_PATH,
    "env_vars": MAPPING,  # training/config.py runtime_config_update: `cfg.env_vars.items()`
    "validation.eval_global_batch_size": OPTIONAL_MICRO_BATCH,
    "validation.eval_iters": OPTIONAL_NON_NEGATIVE_INT,
    "dataset.inter_document_masking": BOOL,
    "dataset.reset_attention_mask": OPTIONAL_BOOL,
    "dataset.reset_position_ids": OPTIONAL_BOOL,
    "dataset.create_attention_mask": BOOL,
    "dataset.skip_getting_attention_mask_from_dataset": BOOL,
    "dataset.num_workers": OPTIONAL_NON_NEGATIVE_INT,
    "model.hybrid_context_parallel": BOOL,
    "model.tp_comm_overlap": BOOL,
    "model.is_hybrid_model": BOOL,
    # read by the gap rules (ssm, rope, moe, schedules, prep): a string 'false' would turn these on
    "model.use_mamba_mem_eff_path": BOOL,
    "model.rmsnorm": BOOL,  # Falcon-H1 only
    "model.deterministic_mode": BOOL,
    "model.fused_single_qkv_rope": BOOL,
    "model.qk_layernorm": BOOL,
    "model.rotary_interleaved": BOOL,
    "model.apply_rope_fusion": BOOL,
    "model.moe_router_fusion": BOOL,
    "model.moe_apply_probs_on_input": BOOL,
    "model.moe_router_topk": OPTIONAL_POSITIVE_INT,  # None in some providers until finalize
    "model.mamba_num_heads": OPTIONAL_POSITIVE_INT,
    "model.mamba_num_groups": POSITIVE_INT,
    "model.microbatch_group_size_per_vp_stage": OPTIONAL_POSITIVE_INT,
    "dataset.pad_to_multiple_of": POSITIVE_INT,
    "dataset.dataset_kwargs['virtual_tokens']": OPTIONAL_NON_NEGATIVE_INT,
    "ddp.num_distributed_optimizer_instances": POSITIVE_INT,
    "dist.use_sharp": BOOL,
    "dataset.max_train_samples": OPTIONAL_POSITIVE_INT,
    "dataset.drop_last": BOOL,
    "train.manual_gc_interval": NON_NEGATIVE_INT,  # training/train.py asserts it >= 0 when training starts
    # the capture-safety conditions (cuda_graphs.capture_host_reads) read these
    "ddp.check_for_nan_in_grad": BOOL,
    "ddp.check_for_large_grads": BOOL,
    "ddp.overlap_grad_reduce": BOOL,
    "rerun_state_machine.check_for_spiky_loss": BOOL,
    "logger.timing_log_level": ANY_INT,
}


def _read(cfg: Any, path: str) -> Any:
    """Value at ``path`` or ``_MISSING`` when a parent is absent/None or the field does not exist."""
    try:
        return get_path(cfg, path)
    except ValueError:
        return _MISSING


def _suggest(value: Any, kind: FieldType) -> Any:
    """A typed value the user most likely meant (``'4'`` -> 4, ``'true'`` -> True), else the kind's example."""
    candidates: list[Any] = []
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("true", "false"):
            candidates.append(text.lower() == "true")
        if text.lower() in ("none", "null", ""):
            candidates.append(None)
        try:
            candidates.append(int(text))
        except ValueError:
            pass
    elif isinstance(value, float) and value.is_integer():
        candidates.append(int(value))
    elif _is_int(value) and kind is BOOL and value in (0, 1):
        candidates.append(bool(value))
    for candidate in candidates:
        if kind.accepts(candidate):
            return candidate
    return kind.example


def _specs_problem(ctx: RuleContext) -> Violation | None:
    """``offline_packing_specs`` must be Megatron-Bridge's dataclass (a YAML merge can leave a dict)."""
    from megatron.bridge.data.packing.config import PackedSequenceSpecs

    specs = _read(ctx.cfg, "dataset.offline_packing_specs")
    if specs is _MISSING or specs is None or isinstance(specs, PackedSequenceSpecs):
        return None
    shown = dict(specs) if isinstance(specs, Mapping) else specs
    return Violation(
        {"dataset.offline_packing_specs": shown, "type": type(specs).__name__},
        "dataset.offline_packing_specs must be a PackedSequenceSpecs (Megatron-Bridge reads its attributes, "
        f"a {type(specs).__name__} has none)",
        fix="cfg.dataset.offline_packing_specs = PackedSequenceSpecs(**"
        + (repr(shown) if isinstance(specs, Mapping) else "{...}")
        + ")  "
        "(from megatron.bridge.data.packing.config import PackedSequenceSpecs)",
        severity=ERROR,
    )


def type_problems(ctx: RuleContext) -> list[Violation]:
    """One violation per mistyped field (the specs object itself first)."""
    found: list[Violation] = []
    specs_problem = _specs_problem(ctx)
    if specs_problem is not None:
        found.append(specs_problem)
    for path, kind in FIELD_TYPES.items():
        if specs_problem is not None and path.startswith("dataset.offline_packing_specs."):
            continue
        value = _read(ctx.cfg, path)
        if value is _MISSING or kind.accepts(value):
            continue
        found.append(
            Violation(
                {path: value, "type": type(value).__name__},
                f"{path} must be {kind.expects}; got {value!r} of type {type(value).__name__}",
                assignments={path: _suggest(value, kind)},
            )
        )
    return found
