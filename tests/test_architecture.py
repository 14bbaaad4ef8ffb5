"""The layout the folders promise: no import circles between modules (function-level imports included), and the
low layers never reach up (the rule catalog and the packer know nothing of the command line)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mbridge_seqpack"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the plugin modules it imports anywhere in its body (``from pkg import submodule`` resolved)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "packaged" not in p.parts}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [
                    f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                    for alias in node.names
                ]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_import_circles() -> None:
    assert _cycles(import_graph()) == []


def test_no_circles_between_packages() -> None:
    """Package level: rules/ never reaches into compose/, packing/ never into thd/, and so on."""

    def top(module: str) -> str:  # "mbridge_seqpack.rules.offline" -> "rules"; the package __init__ -> "__init__"
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else "__init__"

    packages: dict[str, set[str]] = {}
    for name, imports in import_graph().items():
        packages.setdefault(top(name), set()).update(top(i) for i in imports if top(i) not in (top(name), "__init__"))
    assert _cycles({k: packages.get(k, set()) & set(packages) for k in packages}) == []


def test_low_layers_do_not_import_the_command_line() -> None:
    graph = import_graph()
    for name, imports in graph.items():
        if name.startswith(
            (
                "mbridge_seqpack.rules",
                "mbridge_seqpack.packing",
                "mbridge_seqpack.thd",
                "mbridge_seqpack.compose",
                "mbridge_seqpack.recipes",
                "mbridge_seqpack.integrations",
            )
        ):
            assert not [i for i in imports if i.startswith("mbridge_seqpack.cli")], name


def test_composition_never_reaches_up_to_the_recipes() -> None:
    """The recipes are written with compose/ (mixins, derive); the planner, which builds recipes, is the CLI's."""
    graph = import_graph()
    for name, imports in graph.items():
        if name.startswith("mbridge_seqpack.compose"):
            assert not [i for i in imports if i.startswith("mbridge_seqpack.recipes")], name
    assert "mbridge_seqpack.recipes.targets" in graph["mbridge_seqpack.cli.plan"]
