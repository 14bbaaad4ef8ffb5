"""The failure-point census: every assert, raise, host read of a device value and silent discard on the path
packed, variable-length or CP-split data takes through the installed Megatron-Bridge, Megatron-Core and
Transformer Engine, each mapped to the rule that guards it or the reason it cannot fail a config.

``files.py`` (what is scanned and why), ``scanner.py`` (the AST scan), ``verdicts.py`` and ``mapping/`` (the
verdicts), ``inventory.json`` (every reviewed site), ``silent.py`` (what the scan cannot see), ``census.py``
(the join), ``render.py`` (``docs/failure-points.md``). Nothing here imports Megatron: the installed files are read
as text.
"""

from __future__ import annotations

from devtools.census.census import Census, build, scan_path

__all__ = ["Census", "build", "scan_path"]
