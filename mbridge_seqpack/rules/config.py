"""``config.types``: every field the rules read has a type the rules (and Megatron) can interpret.

Overrides, YAML merges and hand edits can leave ``'4'`` where 4 belongs, ``None`` or ``0`` in a batch size,
or a plain dict where ``PackedSequenceSpecs`` belongs. Megatron-Bridge then fails with a bare TypeError /
AttributeError deep inside ``validate()`` (e.g. ``'4' <= 0`` in ``PackedSequenceSpecs``, ``None > 1`` in the
micro-batch checks, ``specs.packed_sequence_size`` on a dict). This rule runs before every other rule and
names the field, its value and type, and the value to use; the other rules are then reported "skipped".
Where Megatron-Bridge has its own clear message for a value (``train.micro_batch_size=None`` /
``global_batch_size=None``: "must be set ..."), the value is accepted here so that message shows.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Callable

from mbridge_seqpack.config_paths import get_path
from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import MOE_READS, RuleContext
from mbridge_seqpack.rules.field_types import (
    BOOL,
    NON_NEGATIVE_INT,
    OPTIONAL_NAME,
    UNCHECKED,
    type_problems,
)
from mbridge_seqpack.rules.registry import checked_field_types, rule

__all__ = ["TYPES_RULE_ID", "KNOWN_VALUE_FIELDS", "declared_choices"]

TYPES_RULE_ID = "config.types"


@rule(
    TYPES_RULE_ID,
    "Every field the rules read holds a value of the type Megatron-Bridge expects.",
    severity=ERROR,
    evidence="Megatron-Bridge 0.6.2 compares these fields numerically or reads their attributes in "
    "training/config.py ConfigContainer.validate (e.g. `self.train.micro_batch_size > 1`, "
    "data/packing/config.py PackedSequenceSpecs.__post_init__ `self.pad_seq_to_mult <= 0`), which raise "
    "TypeError/AttributeError on a string, a dict or 0; pad_seq_to_mult=None passes PackedSequenceSpecs but "
    "data/packing/gpt_sft.py GPTSFTPackedDataset.collate_fn then fails on `self._pad_seq_to_mult > 1`; "
    "training/train.py asserts train.manual_gc_interval >= 0 when training starts; a string 'false' is truthy and "
    "silently turns flags on.",
    reads={"train.manual_gc_interval": NON_NEGATIVE_INT},
)
def config_types(ctx: RuleContext) -> list[Violation]:
    return type_problems(ctx.cfg, checked_field_types())


def _moe(ctx: RuleContext) -> bool:
    return ctx.moe.experts is not None


def _typed_precision(ctx: RuleContext) -> tuple[str, Any] | None:
    """``ctx.precision_source`` where the user typed it; None for a recipe name (Megatron-Bridge's own preset)."""
    return None if ctx.precision_is_preset else ctx.precision_source


def _fp8(ctx: RuleContext) -> bool:
    source = _typed_precision(ctx)
    return source is not None and bool(getattr(source[1], "fp8", None))


def _fp4(ctx: RuleContext) -> bool:
    source = _typed_precision(ctx)
    return source is not None and bool(getattr(source[1], "fp4", None))


#: precision fields read from the mixed precision config when there is one; their choices are TransformerConfig's
PRECISION_FIELDS = ("model.fp8", "model.fp8_recipe", "model.fp4_recipe")


#: field -> where its dispatch runs (the site that raises on an unknown value)
KNOWN_VALUE_FIELDS: dict[str, tuple[Callable[[RuleContext], bool], str]] = {
    "dataset.dataloader_type": (
        lambda ctx: True,
        "data/samplers.py build_pretraining_data_loader raises '... dataloader type is not supported'",
    ),
    "model.normalization": (lambda ctx: True, "core/extensions/transformer_engine.py TENorm.__new__ raises"),
    "model.softmax_type": (lambda ctx: True, "core/transformer/dot_product_attention.py / TE attention raise"),
    "model.pipeline_model_parallel_comm_backend": (
        lambda ctx: True,
        "core/parallel_state.py initialize_model_parallel asserts the backend is nccl or ucc",
    ),
    "model.fp8": (
        _fp8,
        "core/fp8_utils.py get_fp8_recipe raises 'E4M3 and HYBRID are the only supported FP8 formats'",
    ),
    "model.fp8_recipe": (_fp8, "core/fp8_utils.py get_fp8_recipe raises for any other recipe"),
    "model.fp4_recipe": (_fp4, "core/fp4_utils.py get_fp4_recipe raises"),
    "model.moe_token_dispatcher_type": (_moe, "core/transformer/moe/moe_layer.py MoELayer.__init__ raises"),
    "model.moe_router_score_function": (
        _moe,
        "core/transformer/moe/moe_utils.py topk_routing_with_score_function raises 'Invalid score_function'",
    ),
    "model.moe_token_drop_policy": (
        lambda ctx: _moe(ctx) and getattr(ctx.model, "moe_expert_capacity_factor", None) is not None,
        "core/transformer/moe/moe_utils.py apply_router_token_dropping raises 'Invalid drop_policy'",
    ),
    "dist.sharp_enabled_group": (
        lambda ctx: bool(getattr(getattr(ctx.cfg, "dist", None), "use_sharp", False)),
        "core/parallel_state.py initialize_model_parallel asserts 'Invalid sharp_enabled_group'",
    ),
    "model.moe_flex_dispatcher_backend": (
        lambda ctx: _moe(ctx) and getattr(ctx.model, "moe_token_dispatcher_type", None) == "flex",
        "core/transformer/moe/token_dispatcher.py MoEFlexTokenDispatcher.__init__ raises 'Invalid backend'",
    ),
}


def _literal_values(annotation: Any) -> set[Any] | None:
    """The values a ``Literal[...]`` (possibly inside Optional / Union) allows, None when it is not a Literal."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return set(typing.get_args(annotation))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        found: set[Any] = set()
        literal = False
        for arg in typing.get_args(annotation):
            if arg is type(None):
                found.add(None)
                continue
            inner = _literal_values(arg)
            if inner is None:
                return None  # a Union with a non-Literal member (str, an enum) is open
            found |= inner
            literal = True
        return found if literal else None
    return None


def declared_choices(obj: Any, name: str) -> set[Any] | None:
    """The union of the Literal choices every class in ``obj``'s hierarchy declares for field ``name`` (None when
    none declares it as a Literal)."""
    choices: set[Any] | None = None
    for klass in type(obj).__mro__:
        if name not in getattr(klass, "__annotations__", {}):
            continue
        try:
            hint = typing.get_type_hints(klass).get(name)
        except Exception:  # noqa: BLE001 - an unresolvable forward reference: that class says nothing here
            continue
        values = _literal_values(hint)
        if values is not None:
            choices = values if choices is None else choices | values
    return choices


def _default(obj: Any, name: str) -> Any:
    if is_dataclass(obj):
        for f in fields(obj):
            if f.name == name and f.default is not MISSING:
                return f.default
    return None


@rule(
    "config.known_values",
    "Fields Megatron dispatches on hold one of the values their declaring class lists (dataloader_type, "
    "normalization, softmax_type, FP8 / FP4 recipe, MoE dispatcher, router score function, drop policy, PP backend).",
    severity=ERROR,
    evidence=(
        "Dataclass Literal annotations are not enforced; neither TransformerConfig.__post_init__ nor "
        "ConfigContainer.validate checks these fields, and the code that dispatches on them raises on any other "
        "value when the model or data loader is built or at the first forward: data/samplers.py "
        "build_pretraining_data_loader and data/loaders.py (dataloader_type), core/extensions/transformer_engine.py "
        "TENorm.__new__ (normalization), core/transformer/dot_product_attention.py (softmax_type), core/fp8_utils.py "
        "get_fp8_recipe (fp8, fp8_recipe; run on CPU), core/fp4_utils.py (fp4_recipe), core/parallel_state.py "
        "initialize_model_parallel (pipeline_model_parallel_comm_backend), core/transformer/moe/moe_layer.py, "
        "moe_utils.py and token_dispatcher.py (MoE dispatcher, score function, drop policy, flex backend; run on CPU "
        "where they are functions). The choices are read from the fields' Literal annotations."
    ),
    reads={
        "dataset.dataloader_type": OPTIONAL_NAME,
        "dist.sharp_enabled_group": OPTIONAL_NAME,
        "dist.use_sharp": BOOL,
        "mixed_precision": UNCHECKED,
        "mixed_precision.fp4": UNCHECKED,
        "mixed_precision.fp4_recipe": UNCHECKED,
        "mixed_precision.fp8": UNCHECKED,
        "mixed_precision.fp8_recipe": OPTIONAL_NAME,
        **MOE_READS,
        "model.moe_expert_capacity_factor": UNCHECKED,
        "model.moe_flex_dispatcher_backend": OPTIONAL_NAME,
        "model.moe_router_score_function": UNCHECKED,
        "model.moe_token_dispatcher_type": OPTIONAL_NAME,
        "model.moe_token_drop_policy": UNCHECKED,
        "model.normalization": OPTIONAL_NAME,
        "model.pipeline_model_parallel_comm_backend": UNCHECKED,
        "model.softmax_type": OPTIONAL_NAME,
    },
)
def known_values(ctx: RuleContext) -> list[Violation] | None:
    found = []
    for path, (reached, where) in KNOWN_VALUE_FIELDS.items():
        owner_path, name = path.rsplit(".", 1)
        try:
            owner = get_path(ctx.cfg, owner_path)
        except ValueError:
            continue
        choices = declared_choices(owner, name)
        if path in PRECISION_FIELDS:
            source = _typed_precision(ctx)
            if source is None:
                continue
            path, owner = f"{source[0]}.{name}", source[1]
        if choices is None or not hasattr(owner, name) or not reached(ctx):
            continue
        value = getattr(owner, name)
        value = getattr(value, "value", value)  # a str enum (Fp8Recipe) holds its value
        if value in choices:
            continue
        named = sorted(str(c) for c in choices if c is not None)
        near = difflib.get_close_matches(str(value), named, n=1)
        fixed = near[0] if near else _default(owner, name)
        if fixed not in choices:
            fixed = sorted(named)[0] if named else None
        found.append(
            Violation(
                {path: value},
                f"{path} must be one of {', '.join(named)}{' or null' if None in choices else ''}; {where} for "
                f"{value!r}",
                assignments={path: fixed},
            )
        )
    return found
