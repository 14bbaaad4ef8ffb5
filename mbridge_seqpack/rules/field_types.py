"""The types a field the rules read may hold (each rule declares its fields and their types in its ``reads=``;
``rules.catalog.FIELD_TYPES`` is their union) and the problems ``config.types`` reports."""

from __future__ import annotations

import enum
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from mbridge_seqpack.config_paths import get_path
from mbridge_seqpack.errors import ERROR, Violation

__all__ = ["FieldType", "UNCHECKED", "type_problems"]

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


OPTIONAL_INT = FieldType("an integer or null", lambda v: v is None or _is_int(v), None)


def _is_name(value: Any) -> bool:
    return isinstance(value, (str, enum.Enum))


#: Megatron's string / enum choices (``attention_backend``, ``normalization``, ``moe_token_dispatcher_type``, ...)
OPTIONAL_NAME = FieldType("a name (a string or enum member) or null", lambda v: v is None or _is_name(v), None)


OPTIONAL_NAMES = FieldType(
    "a name, a list of names or null",
    lambda v: v is None or _is_name(v) or (isinstance(v, (list, tuple)) and all(_is_name(x) for x in v)),
    None,
)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


OPTIONAL_NUMBERS = FieldType(
    "a number, a list of numbers or null",
    lambda v: v is None or _is_number(v) or (isinstance(v, (list, tuple)) and all(_is_number(x) for x in v)),
    None,
)


#: ``window_size``: a (left, right) pair, or one integer as the Gemma-3 providers set it
OPTIONAL_WINDOW = FieldType(
    "null, an integer or a pair of integers",
    lambda v: v is None or _is_int(v) or (isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_int(x) for x in v)),
    None,
)


#: a field a rule reads as it is, whatever it holds (a layer spec, a tokenizer setting, a precision config): declared
#: so the reads are complete, checked by no type rule
UNCHECKED = FieldType("any value", lambda v: True, None)


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


def _specs_problem(cfg: Any) -> Violation | None:
    """``offline_packing_specs`` must be Megatron-Bridge's dataclass (a YAML merge can leave a dict)."""
    from megatron.bridge.data.packing.config import PackedSequenceSpecs

    specs = _read(cfg, "dataset.offline_packing_specs")
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


def type_problems(cfg: Any, types: Mapping[str, FieldType]) -> list[Violation]:
    """One violation per field of ``types`` that ``cfg`` holds mistyped (the specs object itself first); a path whose
    parent is missing or None is not checked (the rules do not read it)."""
    found: list[Violation] = []
    specs_problem = _specs_problem(cfg)
    if specs_problem is not None:
        found.append(specs_problem)
    for path, kind in types.items():
        if specs_problem is not None and path.startswith("dataset.offline_packing_specs."):
            continue
        value = _read(cfg, path)
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
