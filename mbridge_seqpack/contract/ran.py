"""Which functions of one package ran while an observation ran, by ``sys.monitoring`` (Python 3.12): each code
object is reported once (its first start) and then switched off, so watching costs one call per function.

The census of a record scans the guards of these functions and no others: the code the fixed inputs take, found
where this commit keeps it (a function moved to another file is found in its new file)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import CodeType
from typing import Any

__all__ = ["FunctionsRun"]

_NAME = "mbridge-seqpack contract"


class FunctionsRun:
    """A context: inside it, the (file, qualname) of every function under ``root`` that starts is collected."""

    def __init__(self, root: Path) -> None:
        # a code object's file is the path it was imported by (symlinks kept): the root both ways
        self.roots = tuple({str(root), str(root.resolve())})
        self.functions: set[tuple[str, str]] = set()
        self._tool: int | None = None

    def __enter__(self) -> "FunctionsRun":
        mon: Any = getattr(sys, "monitoring", None)
        if mon is None:  # before Python 3.12: nothing is watched, the census is empty
            return self
        for tool in (mon.COVERAGE_ID, 3, 4):
            if mon.get_tool(tool) is None:
                mon.use_tool_id(tool, _NAME)
                self._tool = tool
                break
        else:
            return self
        mon.register_callback(self._tool, mon.events.PY_START, self._started)
        mon.set_events(self._tool, mon.events.PY_START)
        mon.restart_events()  # the functions a previous watch switched off are reported again
        return self

    def _started(self, code: CodeType, offset: int) -> Any:
        if code.co_filename.startswith(self.roots) and code.co_qualname != "<module>":
            self.functions.add((code.co_filename, code.co_qualname))
        return sys.monitoring.DISABLE

    def __exit__(self, *exc: object) -> None:
        if self._tool is None:
            return
        mon: Any = sys.monitoring
        mon.set_events(self._tool, 0)
        mon.register_callback(self._tool, mon.events.PY_START, None)
        mon.free_tool_id(self._tool)
        self._tool = None
