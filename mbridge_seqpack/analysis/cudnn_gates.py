"""The cuDNN versions at which Transformer Engine's attention selection can change, read from the code that gates.

A target whose cuDNN is not declared is asked on every version the installed TE accepts: one version for each
interval over which no gate flips. The gates are read, not listed: every comparison of ``cudnn_version`` in TE's
``get_attention_backend`` module (its source, as installed) and of the cuDNN version in the fixed FusedAttention
rules (``te_fused_rules``' source, the thresholds of the compiled code), from TE's own minimum
(``transformer_engine.common.MIN_CUDNN_VERSION``, below which TE refuses to load).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

__all__ = ["SELECTION_MODULE", "gates_in", "cudnn_versions_to_ask", "decode", "interval_of"]

Version = tuple[int, int, int]

#: TE's Python selection, relative to the installed transformer_engine package
SELECTION_MODULE = "pytorch/attention/dot_product_attention/utils.py"
#: the names the gating code compares: TE's local variable, the fixed rules' Query fields
_VERSION_NAMES = ("cudnn_version", "cudnn")
_ENCODED_NAMES = ("cudnn_int",)


def decode(encoded: int) -> Version:
    """``cudnnGetVersion()``'s integer as a version (92300 -> 9.23.0), as TE's ``decode_cudnn_version`` reads it."""
    major, rest = divmod(encoded, 1000 if encoded < 90000 else 10000)
    minor, patch = divmod(rest, 100)
    return major, minor, patch


def _compared(node: ast.AST) -> str | None:
    """ "version" / "encoded" where ``node`` is a cuDNN version the gating code compares, else None."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return "version" if name in _VERSION_NAMES else "encoded" if name in _ENCODED_NAMES else None


def _constant(node: ast.AST, kind: str) -> list[int | Version]:
    """What a compared constant names: an int (encoded, kept encoded so that its neighbour is the next integer), a
    version tuple, or a tuple of version tuples."""
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return []
    if kind == "encoded" and isinstance(value, int):
        return [value]
    if kind == "encoded" and isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return list(value)  # membership in encoded versions (`cudnn_int in (91000, 91001)`)
    if isinstance(value, tuple) and len(value) == 3 and all(isinstance(v, int) for v in value):
        return [value]  # type: ignore[list-item]
    if isinstance(value, tuple) and all(isinstance(v, tuple) and len(v) == 3 for v in value):
        return list(value)
    return []


def _next(value: int | Version) -> int | Version:
    return value + 1 if isinstance(value, int) else (value[0], value[1], value[2] + 1)


def _version(value: int | Version) -> Version:
    return decode(value) if isinstance(value, int) else value


#: the first version on the other side of ``x OP v`` for each operator, with x on the left
_FLIP = {
    ast.Lt: lambda v: [v],
    ast.GtE: lambda v: [v],
    ast.LtE: lambda v: [_next(v)],
    ast.Gt: lambda v: [_next(v)],
    ast.Eq: lambda v: [v, _next(v)],
    ast.NotEq: lambda v: [v, _next(v)],
    ast.In: lambda v: [v, _next(v)],
    ast.NotIn: lambda v: [v, _next(v)],
}
_MIRROR = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE}


def gates_in(source: str) -> set[Version]:
    """Every version at which a comparison of a cuDNN version in ``source`` changes its outcome."""
    found: set[Version] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:]):
            kind, other, op_type = _compared(left), right, type(op)
            if kind is None and (kind := _compared(right)) is not None:
                other, op_type = left, _MIRROR.get(op_type, op_type)
            if kind is None or op_type not in _FLIP:
                continue
            for value in _constant(other, kind):
                found.update(_version(v) for v in _FLIP[op_type](value))
    return found


@functools.cache
def cudnn_versions_to_ask() -> tuple[Version, ...]:
    """One version per interval of TE's gates, from TE's minimum: a selection that holds on each holds on every
    cuDNN the installed TE runs with."""
    from transformer_engine.common import MIN_CUDNN_VERSION

    from mbridge_seqpack.analysis import te_fused_rules

    selection = (te_fused_rules.te_root() / SELECTION_MODULE).read_text()
    gates = gates_in(selection) | gates_in(Path(te_fused_rules.__file__).read_text())
    lowest = tuple(MIN_CUDNN_VERSION)
    return tuple(sorted({lowest, *(g for g in gates if g > lowest)}))  # type: ignore[arg-type]


def interval_of(version: Version, asked: tuple[Version, ...]) -> Version:
    """The asked version that stands for ``version``'s interval (the last one at or below it)."""
    below = [v for v in asked if v <= version]
    return below[-1] if below else asked[0]
