"""Which CUDA-graph paths capture and replay packed (THD) batches in Megatron-Bridge 0.6.2 / Megatron-Core 0.19.2 /
TE 2.20, as data: one :class:`GraphPath` per (graph implementation and scope) x packing mode, with the verdict,
the reason, the code that decides it and the rule that reports it when it fails.

The ``cuda_graphs.*`` and ``in_batch.*`` rules read their verdict from :func:`graph_path` (they fire exactly on
the cells this table marks as failing and names them as owner); ``docs/graph-paths.md`` is rendered from it
(:func:`render_markdown`) and a test keeps the two equal. Context parallelism does not change a verdict: TE's
sample arguments are ``seq_length // CP`` tokens (``GraphableMegatronModule.get_layer_static_inputs``) and the
THD CP split gives each rank ``packed_sequence_size // CP`` tokens of a fixed-width row; the full-iteration graph
partitions with TE's ``thd_get_partitioned_indices`` kernel on device tensors (no host read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from mbridge_seqpack.rules.context import RuleContext

__all__ = [
    "GraphPath",
    "GRAPH_PATHS",
    "Impl",
    "Capture",
    "Packing",
    "Verdict",
    "graph_path",
    "classify",
    "render_markdown",
]

Impl = Literal["transformer_engine", "full_iteration", "local"]
#: what a TE per-layer graph holds: the whole layer (empty modules), anything with "attn", or only modules
#: after attention (mlp, moe, moe_router, ...); full-iteration and local graphs hold the whole step / layer
Capture = Literal["whole_layer", "with_attention", "after_attention", "whole_step", "per_layer"]
Packing = Literal["offline_fixed", "offline_variable", "in_batch"]
Verdict = Literal["works", "works_with_injection", "fails"]

TE_REPLAY = (
    "megatron/core/transformer/transformer_layer.py TransformerLayer._te_cuda_graph_replay asserts "
    "packed_seq_params is None unless cuda_graph_modules leaves attention out (then attention runs eagerly "
    "with the packed params and the graph takes hidden_states only)"
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


@dataclass(frozen=True)
class GraphPath:
    """One cell of the matrix: does this graph path capture and replay this packing mode, and why."""

    impl: Impl
    capture: Capture
    packing: Packing
    verdict: Verdict
    reason: str
    evidence: str
    rule_id: str | None = None  # the rule that reports the cell when it fails (or when injection is missing)

    @property
    def fails(self) -> bool:
        return self.verdict == "fails"


def _te(capture: Capture, packing: Packing, verdict: Verdict, reason: str, evidence: str, rule_id: str | None):
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

GRAPH_PATHS: tuple[GraphPath, ...] = (
    *(
        _te(
            capture,
            packing,
            "fails",
            "packed attention is inside the graph, which accepts tensors only: the first replay asserts on "
            "packed_seq_params (and the capture used a dense causal mask)",
            TE_REPLAY + "; transformer_layer.py get_layer_static_inputs captures attention with a dense mask",
            "cuda_graphs.te_attention_over_packed",
        )
        for capture in ("whole_layer", "with_attention")
        for packing in ("offline_fixed", "offline_variable")
    ),
    *(_te(capture, "in_batch", "fails", *_IN_BATCH_TE) for capture in ("whole_layer", "with_attention")),
    _te(
        "after_attention",
        "offline_fixed",
        "works",
        "attention runs eagerly with the packed params; the graph takes hidden states [pack/CP, 1, hidden], the "
        "captured shape when packed_sequence_size == seq_length",
        TE_REPLAY + "; " + TE_SAMPLES,
        "cuda_graphs.te_capture_width",
    ),
    _te("after_attention", "offline_variable", "fails", *_VARIABLE),
    _te("after_attention", "in_batch", "fails", *_IN_BATCH_TE),
    GraphPath(
        "full_iteration",
        "whole_step",
        "offline_fixed",
        "works_with_injection",
        "fixed width and pad_cu_seqlens give static shapes, but max_seqlen is moved to the device by data_read "
        "and read back with .cpu() during capture; mbridge_seqpack's data_read injection hands the step a host "
        "max_seqlen (the pack's constant)",
        FULL_ITER_READ + "; " + HOST_MAX_SEQLEN + "; data/packing/gpt_sft.py collate_fn pads cu_seqlens to "
        "max_samples_per_bin + 2 and sets one max_seqlen from the pack metadata when pad_cu_seqlens=True",
        "cuda_graphs.full_iteration_needs_injection",
    ),
    GraphPath("full_iteration", "whole_step", "offline_variable", "fails", *_VARIABLE),
    GraphPath(
        "full_iteration",
        "whole_step",
        "in_batch",
        "fails",
        "data_read copies each raw micro batch into buffers shaped by the first one: another width or number of "
        "sequences raises in copy_; VLM batches also carry variable-size images",
        FULL_ITER_READ + "; megatron/bridge/data/packing/in_batch.py packs each micro batch to its own width",
        "in_batch.no_cuda_graphs",
    ),
    *(
        GraphPath(
            "local",
            "per_layer",
            packing,
            "fails",
            "Megatron-Bridge refuses local per-layer training graphs",
            "megatron/bridge/utils/cuda_graph.py validate_cuda_graph_configuration raises 'Megatron Bridge supports "
            'model.cuda_graph_impl="local" only for full-iteration CUDA graphs\'',
            "cuda_graphs.local_per_layer",
        )
        for packing in ("offline_fixed", "offline_variable", "in_batch")
    ),
)


def classify(ctx: "RuleContext") -> tuple[Impl, Capture, Packing] | None:
    """The matrix coordinates of a config; None when it has no training graph or no THD packing."""
    if ctx.in_batch_packing:
        packing: Packing = "in_batch"
    elif ctx.offline_packing and ctx.specs is not None:
        packing = "offline_fixed" if ctx.pad_to_max_length else "offline_variable"
    else:
        return None
    if ctx.full_iteration_graph:
        return "full_iteration", "whole_step", packing
    if ctx.cuda_graph_impl == "local":
        return "local", "per_layer", packing
    if ctx.cuda_graph_impl != "transformer_engine":
        return None
    modules = ctx.graph_modules
    if not modules:
        return "transformer_engine", "whole_layer", packing
    return "transformer_engine", "with_attention" if "attn" in modules else "after_attention", packing


def graph_path(ctx: "RuleContext") -> GraphPath | None:
    """The matrix cell for a config (None: no training graph over packed data)."""
    where = classify(ctx)
    if where is None:
        return None
    return next(p for p in GRAPH_PATHS if (p.impl, p.capture, p.packing) == where)


_VERDICT_TEXT = {"works": "works", "works_with_injection": "works with mbridge_seqpack", "fails": "**fails**"}


def render_markdown() -> str:
    """``docs/graph-paths.md``: the matrix as a table, then each cell's evidence."""
    lines = [
        "# CUDA graphs over packed data: which paths work",
        "",
        "Generated from `mbridge_seqpack/rules/graph_paths.py` (`python -m mbridge_seqpack.rules.graph_paths`); a",
        "test keeps this page equal to the data. Versions: Megatron-Bridge 0.6.2, Megatron-Core 0.19.2, TE 2.20.",
        "Every failing cell is an error-level rule (the last column); the rules read their verdict from this table.",
        "Context parallelism changes no verdict (TE samples and fixed-width rows are both split by CP).",
        "",
        "| `cuda_graph_impl` | captured | packing | verdict | why | rule |",
        "|---|---|---|---|---|---|",
    ]
    for p in GRAPH_PATHS:
        lines.append(
            f"| `{p.impl}` | {p.capture.replace('_', ' ')} | {p.packing.replace('_', ' ')} | "
            f"{_VERDICT_TEXT[p.verdict]} | {p.reason} | `{p.rule_id}` |"
        )
    lines += [
        "",
        "Captured: *whole layer* is `cuda_graph_modules=[]`; *with attention* any list holding `attn`; *after",
        "attention* a list without it (`[mlp]`, `[moe_router]`, ...). Packing: *offline fixed* is offline packing",
        "with `pad_to_max_length=True`, *offline variable* without it.",
        "",
        "## Evidence",
        "",
    ]
    for p in GRAPH_PATHS:
        lines.append(f"- `{p.impl}` / {p.capture.replace('_', ' ')} / {p.packing.replace('_', ' ')}: {p.evidence}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
