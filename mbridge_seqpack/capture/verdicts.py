"""Capture-safety verdicts: computed by running the captured code on CPU, cached in ``verdicts.json`` next to this
module, read by the CUDA-graph rules.

The runs live outside the wheel (``devtools/capture/``: every full-iteration probe of
:data:`conditions.FULL_ITERATION_PROBES`, the baseline with and without mbridge_seqpack's ``data_read`` injection,
and every TE per-layer scope over every layer kind); ``python -m devtools.capture.verdicts --write`` refreshes the
cache (about a minute on a CPU once Megatron is imported), and a test recomputes it and compares, so the rules never
read a verdict the runs do not give. Reading the cache (:func:`load`) costs a JSON parse: ``validate()`` stays fast.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mbridge_seqpack.capture.conditions import (
    BASELINE,
    FULL_ITERATION_PROBES,
    MOE_DISPATCHERS,
    MOE_MODES,
    NO_INJECTION,
    Probe,
)

__all__ = [
    "CACHE",
    "HostRead",
    "Verdicts",
    "ScopeVerdict",
    "load",
    "TE_MODULES",
    "TE_KINDS",
    "MOE_KINDS",
    "SAFE_SCOPE_ORDER",
]

CACHE = Path(__file__).with_name("verdicts.json")
#: the TE scopes run: whole layer ("") and each CudaGraphModule (moe_preprocess only beside moe_router)
TE_MODULES = ("", "attn", "mlp", "moe", "moe_router", "moe_router+moe_preprocess", "mamba")
TE_KINDS = ("dense", "moe", "attention", "mlp_layer", "mamba")
#: the MoE layer kinds a config may have (``conditions.moe_kind``), each run under every scope: verdicts for a MoE
#: model come from its own dispatcher and capacity mode, never from another's
MOE_KINDS = tuple(f"moe:{d}:{m}" for d in MOE_DISPATCHERS for m in MOE_MODES)
#: the scopes a fix may propose, in order of preference (after attention, tensor inputs, no host read)
SAFE_SCOPE_ORDER = ("mlp", "moe_router")


@dataclass(frozen=True)
class HostRead:
    """One host read: what it was (``op``), where (``site``: the innermost library frame) and the library frames
    that led there (outermost first)."""

    op: str
    site: str
    stack: tuple[str, ...] = field(default=(), compare=False)

    def describe(self) -> str:
        return f"{self.op} at {self.site}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HostRead":
        return cls(data["op"], data["site"], tuple(data.get("stack", ())))


@dataclass(frozen=True)
class ScopeVerdict:
    """A TE scope module on one layer kind."""

    module: str
    kind: str
    graphed: bool
    outcome: str
    message: str
    site: str
    reads: tuple[HostRead, ...]
    non_tensor_inputs: tuple[str, ...]

    @property
    def fails(self) -> bool:
        return self.outcome == "asserts" or bool(self.reads)

    @property
    def undetermined(self) -> bool:
        """The run could not build or finish this scope here (a one-rank world, a TE kernel without stand-in)."""
        return self.outcome == "not run"


class Verdicts:
    """The computed verdicts, with the questions the rules ask of them."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.full = data["full_iteration"]
        self.te = data["te_layers"]
        self.te_moe = data.get("te_moe", {})

    # ---- full iteration --------------------------------------------------------------------------------------
    def reads(self, probe: str) -> list[HostRead]:
        return [HostRead.from_dict(r) for r in self.full[probe]["reads"]]

    def stopped_at(self, probe: str) -> str | None:
        """Where the probe's run stopped, with what could not run there (None: it finished)."""
        return self.full[probe]["stopped_at"]

    def stood_in(self, probe: str) -> list[str]:
        """The TE kernels the probe's run stood in for (CPU stand-ins with the kernel's shapes), with their sites."""
        return list(self.full[probe].get("stood_in", []))

    def refused(self, probe: str) -> str | None:
        """Megatron-Core's refusal of the probe's config (its finalize() raised: nothing ran), else None."""
        return self.full[probe].get("refused")

    def added_reads(self, probe: str) -> list[HostRead]:
        """What the probe's run reads that the baseline's (injected) does not."""
        base = {(r.op, r.site) for r in self.reads(BASELINE)}
        return [r for r in self.reads(probe) if (r.op, r.site) not in base]

    def baseline_clean(self) -> bool:
        return not self.reads(BASELINE)

    def injection_removes(self) -> list[HostRead]:
        """The host reads of Megatron-Bridge's step that mbridge_seqpack's ``data_read`` injection removes."""
        return self.added_reads(NO_INJECTION)

    def conditions(self) -> list[Probe]:
        """The probes whose runs add host reads: the named conditions."""
        return [p for p in FULL_ITERATION_PROBES if self.added_reads(p.name)]

    def certified(self) -> list[Probe]:
        """The probes whose runs finish (stood-in kernels allowed) and add no host read: capture-safe features. A
        run that stopped certifies nothing, nor does a config Megatron-Core refuses."""
        return [
            p
            for p in FULL_ITERATION_PROBES
            if not self.added_reads(p.name) and self.stopped_at(p.name) is None and self.refused(p.name) is None
        ]

    def undetermined(self) -> list[Probe]:
        """The probes whose runs stopped before the end of the step, with no host read found before: nothing is
        known of what follows."""
        return [
            p for p in FULL_ITERATION_PROBES if self.stopped_at(p.name) is not None and not self.added_reads(p.name)
        ]

    def refusals(self) -> list[Probe]:
        return [p for p in FULL_ITERATION_PROBES if self.refused(p.name) is not None]

    def present_conditions(self, cfg: Any) -> list[tuple[Probe, list[HostRead]]]:
        return [(p, self.added_reads(p.name)) for p in self.conditions() if p.present(cfg)]

    def present_undetermined(self, cfg: Any) -> list[Probe]:
        return [p for p in self.undetermined() if p.present(cfg)]

    def present_refusals(self, cfg: Any) -> list[Probe]:
        return [p for p in self.refusals() if p.present(cfg)]

    # ---- TE per-layer scopes ---------------------------------------------------------------------------------
    def scope(self, module: str, kind: str) -> ScopeVerdict | None:
        """(``module``, ``kind``)'s verdict; a MoE kind of a config (``moe:<dispatcher>:<mode>``) from its own run."""
        if kind.startswith("moe:"):
            entry = self.te_moe.get(kind, {}).get(module)
        else:
            entry = self.te.get(module, {}).get(kind)
        if entry is None:
            return None
        return ScopeVerdict(
            module,
            kind,
            entry["graphed"],
            entry["outcome"],
            entry["message"],
            entry["site"],
            tuple(HostRead.from_dict(r) for r in entry["reads"]),
            tuple(entry["non_tensor_inputs"]),
        )

    def _scope_names(self, modules: list[str]) -> list[str]:
        names = [""] if not modules else [m for m in modules if m != "moe_preprocess"]
        if "moe_preprocess" in modules and "moe_router" in names:
            names = [("moe_router+moe_preprocess" if m == "moe_router" else m) for m in names]
        return names

    def scope_for(self, modules: list[str], kinds: set[str]) -> list[ScopeVerdict]:
        """The verdicts of a configured scope (``cuda_graph_modules``) on a model's layer kinds: each module's own
        (``moe_preprocess`` with ``moe_router``; the whole layer for an empty scope), graphed kinds only."""
        out = []
        for name in self._scope_names(modules):
            for kind in sorted(kinds):
                verdict = self.scope(name, kind)
                if verdict is not None and verdict.graphed and not verdict.undetermined:
                    out.append(verdict)
        return out

    def scope_refusals(self, modules: list[str], kinds: set[str]) -> list[ScopeVerdict]:
        """Megatron-Core's refusals of a configured scope module that graphs none of this model's kinds (a refusal
        on one kind where another kind is graphed is the probe model's, not the config's: an ``mlp`` scope over a
        model with dense and MoE layers)."""
        out = []
        for name in self._scope_names(modules):
            entries = [self.scope(name, kind) for kind in sorted(kinds)]
            known = [e for e in entries if e is not None]
            if any(e.graphed or e.undetermined for e in known):
                continue
            out += [e for e in known if e.outcome == "refused"][:1]
        return out

    def scope_undetermined(self, modules: list[str], kinds: set[str]) -> list[tuple[str, str, str]]:
        """(module, kind, what was not run) for each configured module on each kind the run could not decide: not
        built or finished here, or a kind no run covers."""
        out = []
        for name in self._scope_names(modules):
            for kind in sorted(kinds):
                verdict = self.scope(name, kind)
                if verdict is None:
                    out.append((name, kind, f"no capture run covers [{name or 'whole layer'}] on {kind} layers"))
                elif verdict.undetermined:
                    out.append((name, kind, f"the capture run stopped at {verdict.site}: {verdict.message}"))
        return out

    def failing_modules(self, modules: list[str], kinds: set[str]) -> list[ScopeVerdict]:
        return [v for v in self.scope_for(modules, kinds) if v.fails]

    def module_safe(self, module: str, kinds: set[str]) -> bool:
        """``module`` graphs some kind of this model, and replays every kind it graphs with tensor inputs and no host
        read; kinds the run did not build make it unsafe (not certified)."""
        entries = {kind: self.scope(module, kind) for kind in kinds}
        if any(entry is None for entry in entries.values()):
            return False
        graphed = [e for e in entries.values() if e is not None and e.graphed]
        unknown = any(e is not None and e.undetermined for e in entries.values())
        return bool(graphed) and not unknown and not any(e.fails or e.outcome == "refused" for e in graphed)

    def safe_scope(self, kinds: set[str], keep: list[str] = ()) -> list[str]:
        """The scope a fix proposes: the configured modules that are safe on this model, else the first safe one of
        :data:`SAFE_SCOPE_ORDER`; empty when none is (then graphs go off)."""
        kept = [m for m in keep if m not in ("attn", "moe_preprocess") and self.module_safe(m, kinds)]
        if kept:
            preprocess = self.module_safe("moe_router+moe_preprocess", kinds)
            if "moe_preprocess" in keep and "moe_router" in kept and preprocess:
                kept.append("moe_preprocess")
            return kept
        return [m for m in SAFE_SCOPE_ORDER if self.module_safe(m, kinds)][:1]


@functools.lru_cache(maxsize=1)
def _cached() -> Verdicts:
    return Verdicts(json.loads(CACHE.read_text()))


def load() -> Verdicts:
    """The cached verdicts (recomputed and compared by tests/devtools/test_capture_runs.py)."""
    return _cached()
