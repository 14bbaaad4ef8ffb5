"""The plugin's import graph, read from the source with ``ast`` (nothing is imported): the architecture test holds
it to the layers, and ``scripts/generate.py`` draws the package diagram of ``docs/architecture.md`` from it."""

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


def top(module: str) -> str:
    """``mbridge_seqpack.rules.offline`` -> ``rules``; a top-level module is its own name, the package ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def package_graph() -> dict[str, set[str]]:
    """Top-level package (or top-level module) -> the ones it imports anywhere."""
    packages: dict[str, set[str]] = {}
    for name, imports in import_graph().items():
        packages.setdefault(top(name), set()).update(top(i) for i in imports if top(i) not in (top(name), "__init__"))
    return packages


def subpackages() -> list[str]:
    """The folders of the package that hold Python modules (``data/`` and ``packaged/`` hold none)."""
    return sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py")))
