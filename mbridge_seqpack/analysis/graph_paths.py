"""Which CUDA-graph paths capture and replay packed (THD) batches in Megatron-Bridge 0.6.2 / Megatron-Core 0.19.2 /
TE 2.20, as data: one :class:`GraphPath` per (graph implementation and scope) x packing mode, with the verdict,
the reason, the code that decides it and the rule that reports it when it fails.

The capture and replay verdicts are computed, not asserted: the TE per-layer cells and the full-iteration cell over
fixed-width offline packs come from the capture-safety run (``mbridge_seqpack.capture``: Megatron's own step, model,
layers and replay dispatch run on CPU under a host-read recorder, cached in ``capture/verdicts.json``). The cells
that fail before any capture (variable width, in-batch packing, local per-layer graphs) cite the code that refuses
them, which the tests run. The ``cuda_graphs.*`` and ``in_batch.*`` rules read their verdict from :func:`cell_at`
(``RuleContext.graph_path``);
``docs/graph-paths.md`` is rendered from it (:func:`render_markdown`) and a test keeps the two equal.

Context parallelism does not change a verdict: TE's sample arguments are ``seq_length // CP`` tokens
(``GraphableMegatronModule.get_layer_static_inputs``) and the THD CP split gives each rank
``packed_sequence_size // CP`` tokens of a fixed-width row; the full-iteration graph partitions with TE's
``thd_get_partitioned_indices`` kernel on device tensors (a kernel with no CPU path, and a one-rank world here: not
run, read).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from mbridge_seqpack.capture.verdicts import Verdicts

__all__ = [
    "GraphPath",
    "graph_paths",
    "Impl",
    "Capture",
    "Packing",
    "GraphPathVerdict",
    "cell_at",
    "classify",
    "render_markdown",
    "TE_SCOPE_MODULES",
]

Impl = Literal["transformer_engine", "full_iteration", "local"]
#: what a TE per-layer graph holds: the whole layer (empty modules), a list with "attn", or one module after
#: attention (a list without attn is placed in the cell of its failing module, else its first one);
#: full-iteration and local graphs hold the whole step / layer
Capture = Literal["whole_layer", "with_attention", "mlp", "moe", "moe_router", "mamba", "whole_step", "per_layer"]
Packing = Literal["offline_fixed", "offline_variable", "in_batch"]
GraphPathVerdict = Literal["works", "works_with_injection", "fails"]
#: the TE scope modules after attention that have a cell (``moe_preprocess`` goes with ``moe_router``)
TE_SCOPE_MODULES: tuple[str, ...] = ("mlp", "moe", "moe_router", "mamba")
_KIND_TEXT = {
    "dense": "dense layers",
    "moe": "MoE layers (alltoall; each dispatcher and capacity mode in the MoE table below)",
    "attention": "hybrid attention layers",
    "mlp_layer": "hybrid MLP layers",
    "mamba": "Mamba layers",
}

TE_REPLAY = (
    "megatron/core/transformer/transformer_layer.py TransformerLayer._te_cuda_graph_replay asserts "
    "packed_seq_params is None unless cuda_graph_modules leaves attention out (then attention runs eagerly "
    "with the packed params and the graph takes hidden_states only)"
)
MAMBA_REPLAY = (
    "megatron/core/models/hybrid/hybrid_block.py HybridStack.forward calls every non-TransformerLayer layer with "
    "packed_seq_params=...; megatron/core/ssm/mamba_layer.py MambaLayer._te_cuda_graph_replay hands its kwargs to "
    "megatron/core/transformer/module.py GraphableMegatronModule._te_cuda_graph_replay, which asserts every input is "
    "a tensor or None"
)
TE_SAMPLES = (
    "megatron/core/transformer/cuda_graphs.py TECudaGraphHelper._get_sample_arguments sizes every layer input from "
    "get_layer_static_inputs(model.seq_length, train.micro_batch_size): [seq_length/CP(/TP with SP), micro_batch, "
    "hidden]; transformer_engine/pytorch/graph.py Graphed.forward copy_()s each real input into that surface"
)
FULL_ITER_READ = (
    "megatron/core/full_cuda_graph.py FullCudaGraphWrapper.data_read copies every raw batch into static device "
    "buffers (StaticBufferLoader: copy_tensors_in_struct, then clone_tensors_in_struct -> Tensor.copy_) before "
    "the forward step runs"
)
HOST_MAX_SEQLEN = (
    "megatron/bridge/training/gpt_step.py get_batch_from_iterator reads max_seqlen_q/kv back with .cpu() "
    "(_CURRENT_PACKED_SEQ_HOST_KEYS); after data_read they are device tensors, and a device-to-host copy inside "
    "capture is illegal"
)
COMPUTED_TE = (
    "computed: devtools.capture.layers runs each layer kind (GPTModel's TransformerBlock through "
    "Megatron-Bridge's gpt_step; a HybridStack as HybridModel.forward calls it) with Megatron-Bridge's packed "
    "PackedSeqParams and, on the layers Megatron-Core's _layer_is_graphable selects, a stand-in for TE's graphed "
    "callable that takes tensors only and runs the layer's _te_cuda_graph_capture under the host-read recorder"
)
COMPUTED_FULL = (
    "computed: devtools.capture.iteration runs FullCudaGraphWrapper.data_read (as installed) and then "
    "Megatron-Core's forward_backward_no_pipelining with Megatron-Bridge's gpt_step over its packed collate, a "
    "GPTModel in Megatron-Core's DDP, finalize_model_grads and Megatron's timers under the host-read recorder"
)


@dataclass(frozen=True)
class GraphPath:
    """One cell of the matrix: does this graph path capture and replay this packing mode, and why."""

    impl: Impl
    capture: Capture
    packing: Packing
    verdict: GraphPathVerdict
    reason: str
    evidence: str
    rule_id: str | None = None  # the rule that reports the cell when it fails (or when injection is missing)

    @property
    def fails(self) -> bool:
        return self.verdict == "fails"


def _te(
    capture: Capture, packing: Packing, verdict: GraphPathVerdict, reason: str, evidence: str, rule_id: str | None
):
    return GraphPath("transformer_engine", capture, packing, verdict, reason, evidence, rule_id)


_VARIABLE = (
    "rows are as wide as their content; a graph replays one token width",
    "megatron/bridge/training/config.py ConfigContainer.validate raises 'Offline packing with CUDA graphs "
    "requires dataset pad_to_max_length=True.'",
    "cuda_graphs.training_graphs_need_fixed_width",
)
_IN_BATCH_TE = (
    "in-batch packing concatenates the micro batch into one row: hidden states [micro_batch*seq/CP, 1, hidden] "
    "never fit the captured [seq/CP, micro_batch, hidden] surface (and attention inside a TE graph asserts on "
    "packed_seq_params); no TE scope works",
    TE_SAMPLES + "; megatron/bridge/data/packing/in_batch.py packs each micro batch into a single row; " + TE_REPLAY,
    "in_batch.no_cuda_graphs",
)


def _kinds_text(kinds: list[str]) -> str:
    return ", ".join(_KIND_TEXT.get(k, k) for k in kinds)


def _te_cell(verdicts: "Verdicts", module: str, capture: Capture) -> GraphPath:
    """A TE scope over fixed-width offline packs, from the run: fails where a graphed kind asserts or reads the
    host, works where every graphed kind replays clean."""
    entries = [verdicts.scope(module, kind) for kind in sorted(verdicts.te[module])]
    graphed = [e for e in entries if e is not None and e.graphed]
    failing = [e for e in graphed if e.fails]
    refused = sorted({e.message for e in entries if e is not None and e.outcome == "refused"})
    if failing:
        first = failing[0]
        groups: dict[str, list[str]] = {}
        for e in failing:
            what = (
                f"the replay asserts before the graph: '{e.message}' ({e.site})"
                if e.outcome == "asserts"
                else "the captured part reads the host: " + "; ".join(r.describe() for r in e.reads)
            )
            groups.setdefault(what, []).append(e.kind)
        reason = "; ".join(f"on {_kinds_text(kinds)} {what}" for what, kinds in groups.items())
        attention = capture in ("whole_layer", "with_attention")
        rule_id = "cuda_graphs.te_attention_over_packed" if attention else "cuda_graphs.te_scope_inputs"
        if first.reads and first.outcome != "asserts":
            rule_id = "cuda_graphs.capture_host_reads"
        evidence = (TE_REPLAY if attention else MAMBA_REPLAY) + "; " + COMPUTED_TE
        return _te(capture, "offline_fixed", "fails", reason, evidence, rule_id)
    kinds = _kinds_text([e.kind for e in graphed])
    reason = (
        f"replays on {kinds} with tensor inputs only and no host read inside the graph; attention runs eagerly with "
        "the packed params; the graph takes hidden states [pack/CP, 1, hidden], the captured shape when "
        "packed_sequence_size == seq_length"
    )
    if refused:
        reason += "; Megatron-Core refuses the scope where it graphs nothing (" + "; ".join(refused) + ")"
    return _te(capture, "offline_fixed", "works", reason, TE_REPLAY + "; " + TE_SAMPLES + "; " + COMPUTED_TE,
               "cuda_graphs.te_capture_width")  # fmt: skip


def _full_iteration_cell(verdicts: "Verdicts") -> GraphPath:
    removed = "; ".join(r.describe() for r in verdicts.injection_removes())
    conditions = ", ".join(p.name for p in verdicts.conditions())
    if not verdicts.baseline_clean():
        left = "; ".join(r.describe() for r in verdicts.reads("baseline"))
        return GraphPath(
            "full_iteration",
            "whole_step",
            "offline_fixed",
            "fails",
            f"even with the data_read injection the captured step reads the host: {left}",
            FULL_ITER_READ + "; " + COMPUTED_FULL,
            "cuda_graphs.capture_host_reads",
        )
    return GraphPath(
        "full_iteration",
        "whole_step",
        "offline_fixed",
        "works_with_injection",
        "fixed width and pad_cu_seqlens give static shapes; without mbridge_seqpack the captured step reads the host "
        f"({removed}); its data_read injection hands the step a host max_seqlen, after which the baseline step reads "
        f"nothing, unless the config turns on one of the conditions the run finds ({conditions}: "
        "cuda_graphs.capture_host_reads)",
        FULL_ITER_READ + "; " + HOST_MAX_SEQLEN + "; data/packing/gpt_sft.py collate_fn pads cu_seqlens to "
        "max_samples_per_bin + 2 and sets one max_seqlen from the pack metadata when pad_cu_seqlens=True; "
        + COMPUTED_FULL,
        "cuda_graphs.full_iteration_needs_injection",
    )


def _build(verdicts: "Verdicts") -> tuple[GraphPath, ...]:
    attention_cells = {capture: _te_cell(verdicts, module, capture) for capture, module in
                       (("whole_layer", ""), ("with_attention", "attn"))}  # fmt: skip
    module_cells = {m: _te_cell(verdicts, m, m) for m in TE_SCOPE_MODULES}  # type: ignore[arg-type]
    cells: list[GraphPath] = []
    for capture in ("whole_layer", "with_attention"):
        fixed = attention_cells[capture]
        cells.append(fixed)
        cells.append(GraphPath(**{**fixed.__dict__, "packing": "offline_variable"}))
        cells.append(_te(capture, "in_batch", "fails", *_IN_BATCH_TE))  # type: ignore[arg-type]
    for module in TE_SCOPE_MODULES:
        fixed = module_cells[module]
        cells.append(fixed)
        cells.append(_te(module, "offline_variable", "fails", *_VARIABLE))  # type: ignore[arg-type]
        cells.append(_te(module, "in_batch", "fails", *_IN_BATCH_TE))  # type: ignore[arg-type]
    cells.append(_full_iteration_cell(verdicts))
    cells.append(GraphPath("full_iteration", "whole_step", "offline_variable", "fails", *_VARIABLE))
    cells.append(
        GraphPath(
            "full_iteration",
            "whole_step",
            "in_batch",
            "fails",
            "data_read copies each raw micro batch into buffers shaped by the first one: another width or number of "
            "sequences raises in copy_; VLM batches also carry variable-size images",
            FULL_ITER_READ + "; megatron/bridge/data/packing/in_batch.py packs each micro batch to its own width",
            "in_batch.no_cuda_graphs",
        )
    )
    for packing in ("offline_fixed", "offline_variable", "in_batch"):
        cells.append(
            GraphPath(
                "local",
                "per_layer",
                packing,  # type: ignore[arg-type]
                "fails",
                "Megatron-Bridge refuses local per-layer training graphs",
                "megatron/bridge/utils/cuda_graph.py validate_cuda_graph_configuration raises 'Megatron Bridge "
                'supports model.cuda_graph_impl="local" only for full-iteration CUDA graphs\'',
                "cuda_graphs.local_per_layer",
            )
        )
    return tuple(cells)


@functools.lru_cache(maxsize=1)
def graph_paths() -> tuple[GraphPath, ...]:
    """The matrix, built from the cached capture-safety verdicts."""
    from mbridge_seqpack.capture.verdicts import load

    return _build(load())


def __getattr__(name: str) -> object:
    if name == "GRAPH_PATHS":  # the matrix as a module constant, built on first use
        return graph_paths()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _te_capture(modules: list[str], cfg: Any) -> Capture:
    if not modules:
        return "whole_layer"
    if "attn" in modules:
        return "with_attention"
    from mbridge_seqpack.capture.conditions import model_layer_kinds
    from mbridge_seqpack.capture.verdicts import load

    named = ["moe_router" if m == "moe_preprocess" else m for m in modules]
    known = [m for m in dict.fromkeys(named) if m in TE_SCOPE_MODULES]
    if not known:
        return "mlp"
    failing = {v.module for v in load().failing_modules(known, model_layer_kinds(cfg))}
    return next((m for m in known if m in failing), known[0])  # type: ignore[return-value]


def classify(
    packing: Packing | None, *, full_iteration: bool, impl: str, modules: list[str], cfg: Any
) -> tuple[Impl, Capture, Packing] | None:
    """The matrix coordinates of a config from its packing mode, graph implementation and per-layer capture scope
    (``cfg``: the config whose layer kinds a TE scope after attention is placed by); None when it has no training
    graph or no THD packing."""
    if packing is None:
        return None
    if full_iteration:
        return "full_iteration", "whole_step", packing
    if impl == "local":
        return "local", "per_layer", packing
    if impl != "transformer_engine":
        return None
    return "transformer_engine", _te_capture(modules, cfg), packing


def cell_at(where: tuple[Impl, Capture, Packing] | None) -> GraphPath | None:
    """The matrix cell at some coordinates (None: no training graph over packed data)."""
    if where is None:
        return None
    return next(p for p in graph_paths() if (p.impl, p.capture, p.packing) == where)


_VERDICT_TEXT = {"works": "works", "works_with_injection": "works with mbridge_seqpack", "fails": "**fails**"}


def _conditions_table(verdicts: "Verdicts") -> list[str]:
    from mbridge_seqpack.capture.conditions import FULL_ITERATION_PROBES

    lines = [
        "| feature (probe) | host reads its run adds to the baseline | fix |",
        "|---|---|---|",
    ]
    for probe in FULL_ITERATION_PROBES:
        added = verdicts.added_reads(probe.name)
        stopped = verdicts.stopped_at(probe.name)
        refused = verdicts.refused(probe.name)
        found = "<br>".join(f"{r.op} at `{r.site}`" for r in added) or "none: **capture-safe**"
        if refused:
            found = f"**refused** by Megatron-Core: {refused}"
        elif stopped and not added:
            found = f"**not determined**: the run stops at `{stopped}`"
        elif stopped:
            found += f" (then the run stops at `{stopped}`)"
        stood_in = verdicts.stood_in(probe.name)
        if stood_in:
            found += " (CPU stand-in for " + ", ".join(f"`{k}`" for k in stood_in) + ")"
        if not added:
            fix = "-"
        elif probe.fix is None:
            fix = f"TE per-layer graphs of a certified scope ({probe.why_leave})"
        else:
            fix = probe.fix_text
        settings = ", ".join(f"`{k}={v}`" for k, v in probe.settings.items() if "router_dtype" not in k)
        lines.append(f"| {probe.title} `{probe.name}` ({settings}) | {found} | {fix} |")
    return lines


def _te_table(verdicts: "Verdicts") -> list[str]:
    from mbridge_seqpack.capture.verdicts import TE_KINDS, TE_MODULES

    lines = ["| scope | " + " | ".join(_KIND_TEXT[k] for k in TE_KINDS) + " |", "|---|" + "---|" * len(TE_KINDS)]
    for module in TE_MODULES:
        row = []
        for kind in TE_KINDS:
            v = verdicts.scope(module, kind)
            if v is None:
                row.append("not run")
            elif v.outcome == "asserts":
                row.append(f"**asserts** (`{v.site}`)")
            elif v.outcome == "replays":
                row.append("replays" + (" **reads**" if v.reads else ""))
            else:
                row.append(v.outcome)
        label = f"`[{module.replace('+', ', ')}]`" if module else "`[]` (whole layer)"
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    return lines


def _te_moe_table(verdicts: "Verdicts") -> list[str]:
    from mbridge_seqpack.capture.verdicts import MOE_KINDS, TE_MODULES

    labels = [f"`[{m.replace('+', ', ')}]`" if m else "`[]`" for m in TE_MODULES]
    lines = ["| MoE kind | " + " | ".join(labels) + " |", "|---|" + "---|" * len(TE_MODULES)]
    for kind in MOE_KINDS:
        row = []
        for module in TE_MODULES:
            v = verdicts.scope(module, kind)
            if v is None or v.undetermined:
                row.append("**not determined**" + (f" (`{v.site}`: {v.message})" if v is not None else ""))
            elif v.outcome == "replays":
                row.append("replays" + (" **reads**" if v.reads else ""))
            elif v.outcome == "refused":
                row.append(f"refused (`{v.site}`)")
            else:
                row.append(v.outcome)
        lines.append(f"| `{kind}` | " + " | ".join(row) + " |")
    return lines


def render_markdown() -> str:
    """``docs/graph-paths.md``: the matrix as a table, the computed conditions and scopes, then each cell's
    evidence."""
    from mbridge_seqpack.capture.verdicts import load

    verdicts = load()
    versions = ", ".join(f"{k} {v}" for k, v in sorted(verdicts.data["versions"].items()))
    lines = [
        "# CUDA graphs over packed data: which paths work",
        "",
        "Generated from `mbridge_seqpack/analysis/graph_paths.py`",
        "(`python -m mbridge_seqpack.analysis.graph_paths`) and the capture-safety verdicts it reads",
        "(`mbridge_seqpack/capture/verdicts.json`, recomputed by",
        "`python -m devtools.capture.verdicts --write`); tests keep this page equal to the data and the data",
        f"equal to a fresh run. Computed with {versions}.",
        "Every failing cell is an error-level rule (the last column); the rules read their verdict from this table.",
        "Context parallelism changes no verdict (TE samples and fixed-width rows are both split by CP).",
        "",
        "| `cuda_graph_impl` | captured | packing | verdict | why | rule |",
        "|---|---|---|---|---|---|",
    ]
    for p in graph_paths():
        lines.append(
            f"| `{p.impl}` | {p.capture.replace('_', ' ')} | {p.packing.replace('_', ' ')} | "
            f"{_VERDICT_TEXT[p.verdict]} | {p.reason} | `{p.rule_id}` |"
        )
    lines += [
        "",
        "Captured: *whole layer* is `cuda_graph_modules=[]`; *with attention* any list holding `attn`; a list",
        "without it sits in the cell of its first module that fails on the model's layer kinds, else of its first",
        "module (`moe_preprocess` with `moe_router`). Packing: *offline fixed* is offline packing with",
        "`pad_to_max_length=True`, *offline variable* without it.",
        "",
        "## Full-iteration graphs: what the captured step reads (computed)",
        "",
        "One Megatron-Bridge packed SFT iteration, captured as `FullCudaGraphWrapper` captures it, run once per",
        "feature over a baseline with none (every read found is attributed to the feature whose run adds it; a",
        "config's verdict is the union over its features). With the injection the baseline reads nothing;",
        "without it: " + "; ".join(f"{r.op} at `{r.site}`" for r in verdicts.injection_removes()) + ".",
        "Each feature with reads is a condition `cuda_graphs.capture_host_reads` reports with its fix.",
        "",
        *_conditions_table(verdicts),
        "",
        "## TE per-layer scopes over packed rows (computed)",
        "",
        "Each scope module on each layer kind: *not graphed* (Megatron-Core's `_layer_is_graphable` leaves the",
        "kind eager), *asserts* (the replay's tensor-only check, before the graph), *replays* (tensor inputs; the",
        "captured function runs under the recorder: **reads** when it reads the host), *refused* (Megatron-Core's",
        "TransformerConfig refuses the scope for a model of only that kind). Hybrid MoE layers (`E`) are taken as",
        "the MoE kind.",
        "",
        *_te_table(verdicts),
        "",
        "A MoE model's verdict comes from its own dispatcher and capacity mode (`moe:<dispatcher>:<mode>`: dropless,",
        "a capacity factor without padding, drop-and-pad), each run under every scope; *not determined* where the",
        "one-rank CPU world cannot build the dispatcher (the rules then say so, never OK):",
        "",
        *_te_moe_table(verdicts),
        "",
        "## Evidence",
        "",
    ]
    for p in graph_paths():
        lines.append(f"- `{p.impl}` / {p.capture.replace('_', ' ')} / {p.packing.replace('_', ' ')}: {p.evidence}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
