"""Hatchling build hook: compile the packer's C kernel (``mbridge_seqpack/packing/native/bfd.c``) into a shared
library loaded with ctypes. No Python C API, so one build serves any CPython. Without a C compiler the build
still succeeds and the packer uses its pure-Python path, which places every sequence identically (tested)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("mbridge_seqpack/packing/native/bfd.c")
LIBRARY = Path("mbridge_seqpack/packing/native/_bfd.so")


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


class NativeKernelHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        built = compile_kernel(Path(self.root))
        if built is None:
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":  # an editable install loads it from the source tree
            build_data["force_include"][str(built)] = str(LIBRARY)
