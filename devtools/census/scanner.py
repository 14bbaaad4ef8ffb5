"""Find the failure points of one installed source file, by reading its AST (no Megatron import).

A *site* is one place where the code can stop a run or make the device wait for the host:

``assert``
    an ``assert`` statement, or a call of ``torch._assert`` / ``torch._assert_async``.
``raise``
    a ``raise`` statement that raises something (a bare re-``raise`` inside ``except`` is not a new site).
``item`` / ``tolist`` / ``cpu`` / ``numpy``
    a call of the method of that name (``x.item()``, ``x.tolist()``, ``x.cpu()``, ``x.numpy()``): a host read
    of a device value when ``x`` is a CUDA tensor (the scanner cannot know the receiver's type; a list's or a
    NumPy array's call is still listed and judged by hand).
``to_cpu``
    ``x.to("cpu")``, ``x.to(device="cpu")``, ``x.to(torch.device("cpu"))`` (the device spelled as a literal).
``sync``
    ``torch.cuda.synchronize(...)`` and any ``*.synchronize()`` call (streams, events).
``dynamic_shape``
    a value-dependent output shape: ``nonzero`` / ``argwhere`` / ``unique`` / ``unique_consecutive`` /
    ``masked_select`` / ``bincount`` (method or ``torch.`` function), ``torch.where`` with one argument, and
    ``repeat_interleave`` without ``output_size`` whose repeats are not an int literal.
``tensor_bool``
    a tensor turned into a Python bool: ``torch.equal`` / ``torch.allclose`` / ``torch.is_nonzero`` anywhere,
    and, in a boolean context (``if`` / ``while`` / ternary test, ``assert`` test, ``not``, ``and`` / ``or``,
    ``bool()``), a call of ``.any()`` / ``.all()`` (or ``torch.any`` / ``torch.all`` / ``torch.isnan`` /
    ``torch.isinf`` / ``torch.isfinite``) or a comparison one of whose sides is such a call or a reduction
    (``.sum()`` / ``.max()`` / ``.min()`` / ``.prod()`` / ``.mean()`` / ``.count_nonzero()``, method or
    ``torch.`` function).
``scalar``
    ``int(...)`` / ``float(...)`` / ``bool(...)`` of a reduction call as above or of a ``torch.`` call.
``check_call``
    a call of a helper whose only job is to raise on a bad value, at the call site that decides the value:
    ``divide`` / ``ensure_divisibility`` (Megatron-Core and TE assert divisibility), ``validate_result``
    (Megatron-Core's rerun state machine: NaN / Inf / spike checks), ``assert_dim_for_fp8_exec`` and
    ``assert_viewless_tensor``.

What it cannot see: ``if t:`` / ``int(t)`` / ``t[mask]`` where ``t`` is a plain name (that needs types: a
tensor and an int look alike in the AST), implicit syncs inside library calls (``torch.tensor(...)`` of a
device value, printing a tensor, a CUDA caching-allocator retry), and failure points outside Python: the C++ /
CUDA checks of TE's and Megatron's compiled extensions (``NVTE_CHECK``, Triton ``tl.device_assert``), which
the census lists by hand where a rule depends on them (``docs/failure-points.md``, "What the scanner cannot
see").

A site's identity is (file, enclosing qualname, kind, normalized text, occurrence): the text is
``ast.unparse`` of the statement (``assert`` / ``raise``) or of the call, so a reformatting or a line move
keeps the identity and a changed condition or message does not; the occurrence index tells identical sites in
one function apart. Line numbers are shown, never used as a key.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

__all__ = ["KINDS", "Site", "scan_source", "scan_file", "digest"]

KINDS = (
    "assert",
    "raise",
    "item",
    "tolist",
    "cpu",
    "numpy",
    "to_cpu",
    "sync",
    "dynamic_shape",
    "tensor_bool",
    "scalar",
    "check_call",
)

_HOST_READ_METHODS = {"item": "item", "tolist": "tolist", "cpu": "cpu", "numpy": "numpy"}
_DYNAMIC_SHAPE = {"nonzero", "argwhere", "unique", "unique_consecutive", "masked_select", "bincount"}
_TENSOR_BOOL_ANYWHERE = {"equal", "allclose", "is_nonzero"}
_BOOL_REDUCTIONS = {"any", "all"}
_TORCH_BOOL_FUNCS = {"any", "all", "isnan", "isinf", "isfinite"}
_REDUCTIONS = {"sum", "max", "min", "prod", "mean", "count_nonzero"}
_ASSERT_FUNCS = {"_assert", "_assert_async"}
_CHECK_CALLS = {
    "divide",
    "ensure_divisibility",
    "validate_result",
    "assert_dim_for_fp8_exec",
    "assert_viewless_tensor",
}


def digest(text: str) -> str:
    """A short, stable fingerprint of a site's normalized text (the inventory stores it, not the text)."""
    return hashlib.sha1(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Site:
    """One failure point: where it is (file relative to its package root, qualname, line) and what it is."""

    file: str
    qualname: str
    kind: str
    text: str
    occurrence: int
    line: int

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        """The identity: survives line moves and reformatting, not a change of the statement."""
        return (self.file, self.qualname, self.kind, digest(self.text), self.occurrence)

    @property
    def excerpt(self) -> str:
        text = " ".join(self.text.split())
        return text if len(text) <= 60 else text[:57] + "..."


def _is_torch(node: ast.expr, names: set[str]) -> bool:
    """``torch.<name>`` (or ``torch.cuda.<name>`` for ``synchronize``) spelled through the module."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr in names
        and isinstance(node.value, ast.Name)
        and node.value.id in ("torch", "th")
    )


def _method(node: ast.expr) -> str | None:
    """The attribute name of a call's function (``x.item()`` -> ``item``), else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def _is_reduction(node: ast.expr, names: set[str]) -> bool:
    name = _method(node)
    return name in names


def _bool_tensor_expr(node: ast.expr) -> bool:
    """A boolean-context expression that is decidably a tensor (see the module docstring)."""
    while isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        node = node.operand
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in _BOOL_REDUCTIONS and not node.args and not node.keywords:
            return True  # x.any(), (a == b).all()
        if _is_torch(node.func, _TORCH_BOOL_FUNCS):
            return True
    if isinstance(node, ast.Compare):
        return any(
            _is_reduction(side, _REDUCTIONS | _BOOL_REDUCTIONS) or _is_torch(getattr(side, "func", None), _REDUCTIONS)
            for side in [node.left, *node.comparators]
            if isinstance(side, ast.Call)
        )
    return False


def _to_cpu(call: ast.Call) -> bool:
    def is_cpu(arg: ast.expr) -> bool:
        if isinstance(arg, ast.Constant) and arg.value == "cpu":
            return True
        return (
            isinstance(arg, ast.Call)
            and isinstance(arg.func, ast.Attribute)
            and arg.func.attr == "device"
            and bool(arg.args)
            and isinstance(arg.args[0], ast.Constant)
            and arg.args[0].value == "cpu"
        )

    return any(is_cpu(a) for a in call.args) or any(k.arg == "device" and is_cpu(k.value) for k in call.keywords)


def _call_kind(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        name = func.attr
        if name in _HOST_READ_METHODS and not call.args and not call.keywords:
            return _HOST_READ_METHODS[name]
        if name == "numpy" and not isinstance(func.value, ast.Name):
            return "numpy"
        if name == "to" and _to_cpu(call):
            return "to_cpu"
        if name == "synchronize":
            return "sync"
        if name in _DYNAMIC_SHAPE:
            return "dynamic_shape"
        if name == "where" and _is_torch(func, {"where"}) and len(call.args) == 1 and not call.keywords:
            return "dynamic_shape"
        if name == "repeat_interleave":
            if any(k.arg == "output_size" for k in call.keywords):
                return None
            repeats = call.args[1] if _is_torch(func, {"repeat_interleave"}) and len(call.args) > 1 else None
            if not _is_torch(func, {"repeat_interleave"}):
                repeats = (
                    call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "repeats"), None)
                )
            if isinstance(repeats, ast.Constant) and isinstance(repeats.value, int):
                return None
            return "dynamic_shape"
        if _is_torch(func, _TENSOR_BOOL_ANYWHERE):
            return "tensor_bool"
        if _is_torch(func, _ASSERT_FUNCS):
            return "assert"
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name in _CHECK_CALLS and not _is_torch(func, {"divide"}):  # torch.divide is arithmetic
        return "check_call"
    if isinstance(func, ast.Name) and func.id in ("int", "float", "bool") and len(call.args) == 1:
        arg = call.args[0]
        if isinstance(arg, ast.Call) and (
            _is_reduction(arg, _REDUCTIONS | _BOOL_REDUCTIONS)
            or (
                isinstance(arg.func, ast.Attribute)
                and isinstance(arg.func.value, ast.Name)
                and arg.func.value.id == "torch"
            )
        ):
            return "scalar"
    return None


class _Visitor(ast.NodeVisitor):
    def __init__(self, file: str) -> None:
        self.file = file
        self.scope: list[str] = []
        self.found: list[tuple[str, str, str, int]] = []  # qualname, kind, text, line

    @property
    def qualname(self) -> str:
        return ".".join(self.scope) if self.scope else "<module>"

    def _add(self, kind: str, node: ast.AST) -> None:
        self.found.append((self.qualname, kind, ast.unparse(node), node.lineno))  # type: ignore[attr-defined]

    def _scoped(self, name: str, node: ast.AST) -> None:
        self.scope.append(name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for deco in node.decorator_list:
            self.visit(deco)
        self.scope.append(node.name)
        for stmt in [*node.args.defaults, *node.args.kw_defaults, *node.body]:
            if stmt is not None:
                self.visit(stmt)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped(node.name, node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._scoped("<lambda>", node)

    def visit_Assert(self, node: ast.Assert) -> None:
        self._add("assert", node)
        self._bool_context(node.test)
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        if node.exc is not None:
            self._add("raise", node)
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        self._bool_context(node.test)
        self.generic_visit(node)

    visit_While = visit_If  # type: ignore[assignment]

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._bool_context(node.test)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        for value in node.values:
            self._bool_context(value, nested=True)
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            self._bool_context(node.operand, nested=True)
        self.generic_visit(node)

    def _bool_context(self, test: ast.expr, nested: bool = False) -> None:
        """Record a decidable tensor-to-bool conversion; ``and`` / ``or`` / ``not`` report their own operands."""
        if isinstance(test, ast.BoolOp) or (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)):
            return  # visited as BoolOp / UnaryOp
        if _bool_tensor_expr(test) and not getattr(test, "_census_seen", False):
            test._census_seen = True  # type: ignore[attr-defined]
            self._add("tensor_bool", test)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id == "bool" and len(node.args) == 1:
            self._bool_context(node.args[0], nested=True)
        kind = _call_kind(node)
        if kind is not None:
            self._add(kind, node)
        self.generic_visit(node)


def scan_source(source: str, file: str, only: Iterable[str] = ()) -> list[Site]:
    """Every site of one module's source; ``only`` keeps the sites whose qualname starts with one of the given
    prefixes (a file on the path only through some of its functions)."""
    visitor = _Visitor(file)
    visitor.visit(ast.parse(source))
    prefixes = tuple(only)
    seen: dict[tuple[str, str, str], int] = {}
    sites = []
    for qualname, kind, text, line in visitor.found:
        if prefixes and not any(qualname == p or qualname.startswith(p + ".") for p in prefixes):
            continue
        index = seen.get((qualname, kind, text), 0)
        seen[(qualname, kind, text)] = index + 1
        sites.append(Site(file, qualname, kind, text, index, line))
    return sites


def scan_file(path: Path, file: str, only: Iterable[str] = ()) -> list[Site]:
    """:func:`scan_source` of a file on disk."""
    return scan_source(path.read_text(), file, only)


def iter_keys(sites: Iterable[Site]) -> Iterator[tuple[str, str, str, str, int]]:
    return (s.key for s in sites)
