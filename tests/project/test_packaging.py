"""The wheel ships the recipes, the embedded corpus and tokenizer, and finds its recipes when installed; it is
self-contained: the code that only regenerates shipped data lives in devtools/, which nothing in it imports."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.expected_recipes import EXPECTED_RECIPES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [uv, "build", "--wheel", "--out-dir", str(out), str(ROOT)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.glob("mbridge_seqpack-*.whl")
    return path


def _run_installed(wheel: Path, site: Path, code: str) -> str:
    """Run ``code`` in a fresh interpreter that sees only the unpacked wheel; its stdout."""
    zipfile.ZipFile(wheel).extractall(site)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=site,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


#: capture/ as the wheel ships it: the verdicts' cache and reader, the features and fixes the rules ask about, the CPU
#: world the minimal launch and the equivalence checks build in; the runs that compute the cache (recorder,
#: iteration, layers, kernels) are devtools/capture/ (issue #51 item 4)
SHIPPED_CAPTURE = [
    f"mbridge_seqpack/capture/{name}"
    for name in ("__init__.py", "conditions.py", "cpu_world.py", "stand_ins.py", "verdicts.json", "verdicts.py")
]


def test_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "mbridge_seqpack/data/tokenizer/tokenizer.json",
        "mbridge_seqpack/data/sft_sample/training.jsonl",
        "mbridge_seqpack/rules/catalog.py",
    ):
        assert required in names, required
    # the checkout's top-level recipes/ are what the wheel ships, file for file
    top_level = {f"mbridge_seqpack/recipes/packaged/{p.name}" for p in (ROOT / "recipes").glob("*.py")}
    assert top_level and {n for n in names if n.startswith("mbridge_seqpack/recipes/packaged/")} == top_level
    assert not any(name.startswith(("tests/", "recipes/", "devtools/", "scripts/")) for name in names)
    assert not any(name.startswith(("mbridge_seqpack/census/", "mbridge_seqpack/packing/")) for name in names)
    assert sorted(n for n in names if n.startswith("mbridge_seqpack/capture/")) == SHIPPED_CAPTURE
    assert "mbridge_seqpack_autoload.pth" in names  # the zero-code startup hook lands in site-packages
    assert "mbridge_seqpack/placement/_bfd.so" in names  # the packer's C kernel, built by hatch_build.py
    assert "mbridge_seqpack/placement/bfd.c" in names
    assert "-py3-none-any" not in wheel.name  # a platform wheel, since it carries a compiled library


def test_the_wheel_is_manylinux_tagged_and_needs_no_newer_glibc(wheel: Path) -> None:
    """A package index refuses ``linux_x86_64``; the kernel is loaded with ctypes (any CPython 3), and the glibc
    symbol versions it needs (what ``auditwheel show`` reads: GLIBC_2.2.5 here) are within the tag's."""
    import platform
    import re

    arch = platform.machine()
    assert wheel.name == f"mbridge_seqpack-0.1.0-py3-none-manylinux_2_17_{arch}.whl"
    tags = [
        line
        for line in zipfile.ZipFile(wheel).read("mbridge_seqpack-0.1.0.dist-info/WHEEL").decode().splitlines()
        if line.startswith("Tag:")
    ]
    assert tags == [f"Tag: py3-none-manylinux_2_17_{arch}"]
    library = zipfile.ZipFile(wheel).read("mbridge_seqpack/placement/_bfd.so")
    needed = {int(m) for m in re.findall(rb"GLIBC_2\.(\d+)", library)}
    assert needed and max(needed) <= 17


def test_installed_wheel_packs_with_its_c_kernel(wheel: Path, tmp_path: Path) -> None:
    out = _run_installed(
        wheel,
        tmp_path,
        "from mbridge_seqpack.placement.packer import native_kernel, pack_lengths; "
        "assert native_kernel() is not None; print(pack_lengths([5, 3, 2, 6], 8).tolist())",
    )
    assert sorted(out.split("[")[1].split("]")[0].replace(" ", "").split(",")) == ["0", "0", "1", "1"]


def test_installed_wheel_lists_the_packaged_recipes(wheel: Path, tmp_path: Path) -> None:
    code = "import mbridge_seqpack.recipes as r; print(r.recipes_dir()); print(','.join(r.list_recipes()))"
    out = _run_installed(wheel, tmp_path, code)
    where, names = out.splitlines()
    assert where == str(tmp_path / "mbridge_seqpack" / "recipes" / "packaged")
    assert names.split(",") == EXPECTED_RECIPES


def test_installed_wheel_reads_the_capture_verdicts_without_devtools(wheel: Path, tmp_path: Path) -> None:
    """The CUDA-graph rules' verdicts load from the wheel alone, importing neither devtools nor torch: the
    injection's verdict is the one host read tests/devtools/test_capture_runs.py finds without it."""
    code = (
        "import sys; from mbridge_seqpack.capture.verdicts import load; v = load(); "
        "print(v.baseline_clean(), [r.describe() for r in v.injection_removes()]); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'devtools', 'torch', 'megatron'}))"
    )
    first, second = _run_installed(wheel, tmp_path, code).splitlines()
    site = "megatron/bridge/training/gpt_step.py:268 get_batch_from_iterator"
    assert first == f"True ['device-to-host copy (.cpu()) at {site}']"
    assert second == "[]"


#: the edits of ``sys.path`` the package makes, each for code outside it by design: Megatron-Bridge's runner directory
#: (its recipe_runner imports recipe_metadata from beside it) and a checkout's source for ``contract --src``
KNOWN_PATH_EDITS = {"mbridge_seqpack/recipes/runner.py": [90], "mbridge_seqpack/contract/_run.py": [37]}
_PATH_MUTATORS = {"insert", "append", "extend", "remove", "pop", "clear", "__setitem__", "__delitem__"}


def _is_sys_path(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def outside_reach(source: str) -> tuple[list[int], list[int]]:
    """(the lines that import ``devtools``, the lines that edit ``sys.path``) of ``source``: an import statement, an
    ``importlib.import_module`` / ``__import__`` of a literal name; a mutating call on ``sys.path``, an assignment to
    it or to an item of it, ``site.addsitedir``, ``from sys import path``."""
    imports, edits = [], []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
            if node.module == "sys" and any(a.name == "path" for a in node.names):
                edits.append(node.lineno)
        elif isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func in ("importlib.import_module", "import_module", "__import__") and node.args:
                first = node.args[0]
                names = [first.value] if isinstance(first, ast.Constant) and isinstance(first.value, str) else []
            elif isinstance(node.func, ast.Attribute) and node.func.attr in _PATH_MUTATORS:
                edits += [node.lineno] if _is_sys_path(node.func.value) else []
            elif func == "site.addsitedir":
                edits.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            bases = [t.value if isinstance(t, ast.Subscript) else t for t in targets]
            edits += [node.lineno] if any(_is_sys_path(b) for b in bases) else []
        imports += [node.lineno for name in names if name.split(".")[0] == "devtools"]
    return sorted(imports), sorted(edits)


def test_the_package_imports_no_devtools_and_edits_sys_path_only_where_known() -> None:
    """What the wheel holds reaches nothing outside it: devtools/ is not in the wheel, and an edit of the import path
    would make what runs depend on where it runs from."""
    found = {
        str(path.relative_to(ROOT)): outside_reach(path.read_text())
        for path in sorted((ROOT / "mbridge_seqpack").rglob("*.py"))
    }
    assert {name: imports for name, (imports, _) in found.items() if imports} == {}
    assert {name: edits for name, (_, edits) in found.items() if edits} == KNOWN_PATH_EDITS


def test_the_reach_check_sees_each_spelling() -> None:
    source = (
        "import devtools\n"  # 1
        "import devtools.census as c\n"  # 2
        "from devtools.capture import recorder\n"  # 3
        "def f():\n"
        "    import importlib\n"
        "    importlib.import_module('devtools.field_uses')\n"  # 6
        "    __import__('devtools')\n"  # 7
        "    sys.path.insert(0, 'x')\n"  # 8
        "    sys.path.append('x')\n"  # 9
        "    sys.path[:0] = ['x']\n"  # 10
        "    sys.path = []\n"  # 11
        "    sys.path += ['x']\n"  # 12
        "    site.addsitedir('x')\n"  # 13
        "from sys import path\n"  # 14
        "dirs = [*sys.path]\n"  # a read: no edit
        "import devtoolsmore, mydevtools\n"  # other packages
        "from . import devtools\n"  # the package's own module of that name (relative)
        "x = path.insert\n"
    )
    assert outside_reach(source) == ([1, 2, 3, 6, 7], [8, 9, 10, 11, 12, 13, 14])


def test_runtime_requirements_are_ranges(wheel: Path) -> None:
    """No torch / Transformer Engine / Megatron-Core pins in the wheel: it goes into an NGC container as is."""
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    requires = [
        line.split(":", 1)[1].strip()
        for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert "megatron-bridge<0.7,>=0.6.2" in requires
    assert not [
        r
        for r in requires
        if r.split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip()
        in ("torch", "transformer-engine", "megatron-core")
    ]
    assert not any("==" in r.split(";")[0] for r in requires)
    assert "nemo-run>=0.5; extra == 'nemo-run'" in requires  # the NeMo-Run plugin's optional dependency
    assert [r for r in requires if r.startswith("matplotlib")] == ["matplotlib; extra == 'plot'"]  # inspect --png


def test_installing_into_an_existing_megatron_bridge_environment_changes_nothing_else(wheel: Path) -> None:
    """A dry run into this environment (Megatron-Bridge, torch and TE already there) plans only the plugin."""
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    done = subprocess.run(
        [uv, "pip", "install", "--dry-run", "--offline", "--python", sys.executable, str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    planned = [line for line in done.stderr.splitlines() if line.strip().startswith(("+", "-"))]
    assert planned and all("mbridge-seqpack" in line for line in planned), done.stderr
