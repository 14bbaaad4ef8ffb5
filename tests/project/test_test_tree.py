"""The test tree: no test module imports another (shared helpers live in tests/support, shared fixtures in a
conftest), so each test file can be read, moved and run on its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
#: an import statement inside a string (code a test runs in a process of its own)
IMPORT_TEXT = re.compile(r"\b(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))")


def _is_test_module(name: str) -> bool:
    return name.rsplit(".", 1)[-1].startswith("test_")


def imported_test_modules(source: str) -> list[str]:
    """The test modules ``source`` imports: by import statement (absolute or relative) or in code held in a string."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if node.module and _is_test_module(node.module):
                found.append(module)
            elif not node.module:  # from . import test_x
                found += [module + a.name for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [
                m for match in IMPORT_TEXT.finditer(node.value) for m in match.groups() if m and _is_test_module(m)
            ]
    return found


def test_no_test_imports_another_test_module() -> None:
    files = sorted(f for f in TESTS.rglob("test_*.py") if f != Path(__file__).resolve())  # (its own samples below)
    assert len(files) > 60
    found = {str(f.relative_to(TESTS.parent)): imported_test_modules(f.read_text()) for f in files}
    assert {f: names for f, names in found.items() if names} == {}


def test_the_check_sees_every_way_of_importing_a_test_module() -> None:
    source = (
        "import tests.rules.test_rules\n"
        "from tests.test_artifacts import DATA\n"
        "from test_equivalence import IN_BATCH\n"
        "from .test_balance import x\n"
        "from . import test_mixins\n"
        "def f():\n"
        "    from tests.test_rule_evidence import tiny_pack\n"
        "SCRIPT = 'import torch; from tests.test_attention_backend import _records'\n"
        "from tests.support.packs import run_pack\n"
        "import testing, pytest\n"
    )
    assert sorted(imported_test_modules(source)) == sorted(
        [
            "tests.rules.test_rules",
            "tests.test_artifacts",
            "test_equivalence",
            ".test_balance",
            ".test_mixins",
            "tests.test_attention_backend",
            "tests.test_rule_evidence",
        ]
    )


#: test folders that name no subpackage: the top-level modules (hook, modes, errors, ...), the project as a whole,
#: the dev tools outside the wheel and the docs' runnable examples
OTHER_FOLDERS = {"core", "project", "devtools", "docs"}


def test_the_test_folders_mirror_the_package() -> None:
    """Every test file sits in ``tests/<folder>/``, and the folder names a subpackage of ``mbridge_seqpack``."""
    package = TESTS.parent / "mbridge_seqpack"
    subpackages = {p.name for p in package.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    folders = {f.relative_to(TESTS).parts[:-1] for f in TESTS.rglob("test_*.py")}
    assert () not in folders, "a test file directly in tests/"
    assert {f[0] for f in folders} - subpackages - OTHER_FOLDERS == set()
    assert all(len(f) == 1 for f in folders), sorted(f for f in folders if len(f) > 1)


#: a test file cited by path (docs, docstrings, evidence strings, scripts)
CITED_TEST = re.compile(r"\btests/[\w/]+\.py")


def test_every_test_file_cited_by_path_exists() -> None:
    """A moved or renamed test leaves no page, docstring or script pointing at where it was."""
    root = TESTS.parent
    sources = [*root.glob("*.md"), *(root / "docs").rglob("*.md"), *(root / "scripts").rglob("*.py")]
    sources += [*(root / "mbridge_seqpack").rglob("*.py"), *(root / "devtools").rglob("*.py"), *TESTS.rglob("*.py")]
    cited = {(str(s.relative_to(root)), m) for s in sources for m in CITED_TEST.findall(s.read_text())}
    assert sorted((where, path) for where, path in cited if not (root / path).is_file()) == []
