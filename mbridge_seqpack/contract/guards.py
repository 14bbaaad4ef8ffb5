"""The guards of a function, read from its source by AST: every ``raise`` and ``assert`` with the condition under
which it is reached (the enclosing ``if`` tests, ``not (...)`` on an ``else`` branch, the ``except`` clause) and its
message. What the contract's ``census.scan`` compares commit to commit: a changed condition or message is a changed
guard; a moved, reformatted or re-commented line, or a new line that guards nothing (``x.tolist()``), is not.

A guard's fingerprint is (kind, condition, message): a function renamed or moved to another file keeps its guards
(the census compares fingerprints; the file and the function, spelled as CPython spells a code object's
``co_qualname``, ``outer.<locals>.inner``, are shown, never compared).
Part of the plugin (the wheel's ``contract record`` runs it); nothing here imports Megatron.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass

__all__ = ["Guard", "guards_of_source"]


@dataclass(frozen=True)
class Guard:
    qualname: str
    kind: str  # "raise" or "assert"
    condition: str  # the enclosing tests, outermost first, joined by " and "; "" when always reached
    message: str  # the raised expression, or the assert's test and message
    occurrence: int  # tells identical guards of one function apart

    @property
    def fingerprint(self) -> str:
        """What the guard checks and says, wherever it is: ``kind::digest`` of its condition and message."""
        text = f"{self.condition}\n{self.message}"
        return f"{self.kind}::{hashlib.sha1(text.encode()).hexdigest()[:12]}"

    @property
    def key(self) -> str:
        """The guard in its function: ``qualname::kind::digest::occurrence``."""
        return f"{self.qualname}::{self.fingerprint}::{self.occurrence}"

    @property
    def text(self) -> str:
        """The guard as a reviewer reads it: ``if COND: raise X`` or ``assert T, M``."""
        head = f"if {self.condition}: " if self.condition else ""
        return head + (f"raise {self.message}" if self.kind == "raise" else f"assert {self.message}")


class _Visitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.scope: list[str] = []
        self.in_function: list[bool] = []  # per scope: a function (its children are "<locals>")
        self.conditions: list[str] = []
        self.found: list[tuple[str, str, str, str]] = []  # qualname, kind, condition, message

    def _qualname(self) -> str:
        return ".".join(self.scope) if self.scope else "<module>"

    def _enter(self, name: str, node: ast.AST, function: bool) -> None:
        parent_is_function = bool(self.in_function and self.in_function[-1])
        self.scope.append(f"<locals>.{name}" if parent_is_function else name)
        self.in_function.append(function)
        saved, self.conditions = self.conditions, []  # a new scope: its guards' conditions start afresh
        body = node.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else [node.body]
        for stmt in body:
            self.visit(stmt)
        self.conditions = saved
        self.in_function.pop()
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._enter(node.name, node, True)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._enter(node.name, node, False)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._enter("<lambda>", node, True)

    def _under(self, condition: str, stmts: list[ast.stmt]) -> None:
        self.conditions.append(condition)
        for stmt in stmts:
            self.visit(stmt)
        self.conditions.pop()

    def visit_If(self, node: ast.If) -> None:
        test = ast.unparse(node.test)
        self._under(test, node.body)
        if node.orelse:
            self._under(f"not ({test})", node.orelse)

    def visit_Try(self, node: ast.Try) -> None:
        for stmt in [*node.body, *node.orelse, *node.finalbody]:
            self.visit(stmt)
        for handler in node.handlers:
            caught = ast.unparse(handler.type) if handler.type is not None else "BaseException"
            self._under(f"except {caught}", handler.body)

    visit_TryStar = visit_Try  # type: ignore[assignment]

    def visit_Raise(self, node: ast.Raise) -> None:
        if node.exc is not None:  # a bare re-raise passes on a guard found elsewhere
            self.found.append((self._qualname(), "raise", " and ".join(self.conditions), ast.unparse(node.exc)))

    def visit_Assert(self, node: ast.Assert) -> None:
        message = ast.unparse(node.test) + (f", {ast.unparse(node.msg)}" if node.msg is not None else "")
        self.found.append((self._qualname(), "assert", " and ".join(self.conditions), message))


def guards_of_source(source: str) -> dict[str, list[Guard]]:
    """Every guard of one module's source, by the qualname of the function (or class body) it is in."""
    visitor = _Visitor()
    visitor.visit(ast.parse(source))
    seen: dict[tuple[str, str, str, str], int] = {}
    out: dict[str, list[Guard]] = {}
    for found in visitor.found:
        index = seen.get(found, 0)
        seen[found] = index + 1
        out.setdefault(found[0], []).append(Guard(*found, index))
    return out
