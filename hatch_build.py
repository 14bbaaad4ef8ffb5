"""Hatchling build hook: compile the packer's C kernel (``mbridge_seqpack/placement/bfd.c``) into a shared
library loaded with ctypes. No Python C API, so one build serves any CPython: the wheel is tagged
``py3-none-manylinux_2_<N>_<arch>`` from the glibc symbol versions the library actually needs (2.17 at least), a tag
package indexes accept. Without a C compiler the build still succeeds and the packer uses its pure-Python path,
which places every sequence identically (tested)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("mbridge_seqpack/placement/bfd.c")
LIBRARY = Path("mbridge_seqpack/placement/_bfd.so")


def compile_kernel(root: Path) -> Path | None:
    """Build ``_bfd.so`` next to its source; None (with a message on stderr) if no compiler works."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        print("mbridge-seqpack: no C compiler; the packer will use its pure-Python path", file=sys.stderr)
        return None
    target = root / LIBRARY
    tmp = target.with_suffix(".so.tmp")
    cmd = [compiler, "-O3", "-fPIC", "-shared", "-std=c99", str(root / SOURCE), "-o", str(tmp)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        print(
            f"mbridge-seqpack: compiling the packer kernel failed ({' '.join(cmd)}):\n{done.stderr}"
            "the packer will use its pure-Python path",
            file=sys.stderr,
        )
        return None
    os.replace(tmp, target)
    return target


def manylinux_tag(library: Path) -> str | None:
    """``manylinux_2_<minor>_<arch>`` for a Linux/glibc build: the newest ``GLIBC_2.x`` symbol version the library
    needs, never below 2.17 (manylinux2014, what package indexes and pip everywhere accept); None elsewhere."""
    import platform
    import re

    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return None
    needed = [int(m) for m in re.findall(rb"GLIBC_2\.(\d+)", library.read_bytes())]
    return f"manylinux_2_{max([17, *needed])}_{platform.machine()}"


class NativeKernelHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        built = compile_kernel(Path(self.root))
        if built is None:
            return
        build_data["pure_python"] = False
        tag = manylinux_tag(built)
        if tag is None:
            build_data["infer_tag"] = True
        else:  # loaded with ctypes, no Python C API: one wheel for every CPython 3, on any glibc it can run on
            build_data["tag"] = f"py3-none-{tag}"
        if version != "editable":  # an editable install loads it from the source tree
            build_data["force_include"][str(built)] = str(LIBRARY)
