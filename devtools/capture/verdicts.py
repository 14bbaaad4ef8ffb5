"""Compute the capture-safety verdicts the CUDA-graph rules read, and refresh the package's cache of them.

``compute()`` runs every full-iteration probe (:data:`~mbridge_seqpack.capture.conditions.FULL_ITERATION_PROBES`,
the baseline with and without mbridge_seqpack's ``data_read`` injection) and every TE per-layer scope over every
layer kind; ``python -m devtools.capture.verdicts --write`` writes the result to
``mbridge_seqpack/capture/verdicts.json`` (about a minute on a CPU once Megatron is imported), which a test recomputes
and compares (tests/devtools/test_capture_runs.py).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from devtools.capture.iteration import run_iteration
from devtools.capture.layers import HYBRID_KINDS, run_gpt_scope, run_hybrid_scope
from mbridge_seqpack.capture import verdicts
from mbridge_seqpack.capture.conditions import BASELINE, FULL_ITERATION_PROBES, NO_INJECTION
from mbridge_seqpack.capture.verdicts import MOE_KINDS, TE_KINDS, TE_MODULES, HostRead

__all__ = ["compute", "main", "read_entry"]


def read_entry(read: HostRead) -> dict[str, Any]:
    """``read`` as the cache holds it (what :meth:`HostRead.from_dict` reads back)."""
    return {"op": read.op, "site": read.site, "stack": list(read.stack)}


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("megatron-bridge", "megatron-core", "transformer-engine", "torch")}


def compute() -> dict[str, Any]:
    """Run everything; the JSON-able result (what ``mbridge_seqpack.capture.verdicts.CACHE`` holds)."""
    full: dict[str, Any] = {}
    for name, settings, injected in [
        (BASELINE, {}, True),
        (NO_INJECTION, {}, False),
        *((p.name, p.settings, True) for p in FULL_ITERATION_PROBES),
    ]:
        run = run_iteration(settings, injected=injected)
        full[name] = {
            "settings": settings,
            "injected": injected,
            "reads": [read_entry(r) for r in run.reads],
            "stopped_at": run.stopped_at,
            "stood_in": run.stood_in,
            "refused": run.refused,
        }
    te: dict[str, Any] = {}
    te_moe: dict[str, Any] = {kind: {} for kind in MOE_KINDS}
    for module in TE_MODULES:
        modules = [m for m in module.split("+") if m]
        te[module] = {}
        for kind in TE_KINDS:
            run = run_hybrid_scope(modules, kind) if kind in HYBRID_KINDS else run_gpt_scope(modules, kind)
            te[module][kind] = _scope_entry(run)
        for kind in MOE_KINDS:
            te_moe[kind][module] = _scope_entry(run_gpt_scope(modules, kind))
    return {"versions": _versions(), "full_iteration": full, "te_layers": te, "te_moe": te_moe}


def _scope_entry(run: Any) -> dict[str, Any]:
    return {
        "graphed": run.graphed,
        "outcome": run.outcome,
        "message": run.message,
        "site": run.site,
        "reads": [read_entry(r) for r in run.reads],
        "non_tensor_inputs": run.non_tensor_inputs,
    }


def main(argv: list[str] | None = None) -> int:
    """Print the computed verdicts, or with ``--write`` replace the package's cache with them."""
    args = sys.argv[1:] if argv is None else argv
    text = json.dumps(compute(), indent=1, sort_keys=True) + "\n"
    if "--write" in args:
        verdicts.CACHE.write_text(text)
        verdicts._cached.cache_clear()
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
