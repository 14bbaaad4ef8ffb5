"""CUDA-graph and fixed-width rules for packed batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mbridge_seqpack.analysis.graph_paths import (
    COMPUTED_FULL,
    COMPUTED_TE,
    FULL_ITER_READ,
    HOST_MAX_SEQLEN,
    MAMBA_REPLAY,
    TE_REPLAY,
    TE_SAMPLES,
)
from mbridge_seqpack.errors import ERROR, UNDETERMINED, Violation
from mbridge_seqpack.rules.context import (
    DATASET_KWARGS_READS,
    GRAPH_PATH_READS,
    MOE_READS,
    PACK_FINGERPRINT_READS,
    PACK_PATH_READS,
    SPECS,
    TOPOLOGY_READS,
    RuleContext,
)
from mbridge_seqpack.rules.field_types import (
    ANY_INT,
    BOOL,
    OPTIONAL_NAME,
    OPTIONAL_NON_NEGATIVE_INT,
    OPTIONAL_STR,
    POSITIVE_INT,
    UNCHECKED,
)
from mbridge_seqpack.rules.registry import rule


def _verdicts() -> Any:
    from mbridge_seqpack.capture.verdicts import load

    return load()


def _layer_kinds(ctx: RuleContext) -> set[str]:
    from mbridge_seqpack.capture.conditions import model_layer_kinds

    return model_layer_kinds(ctx.cfg)


@rule(
    "cuda_graphs.pad_cu_seqlens_needs_fixed_width",
    "pad_cu_seqlens=True needs pad_to_max_length=True.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError "
        "'offline_packing_specs.pad_cu_seqlens=True requires dataset pad_to_max_length=True.'; "
        "data/packing/gpt_sft.py GPTSFTPackedDataset.__init__ asserts it again."
    ),
    reads={**DATASET_KWARGS_READS, "dataset.offline_packing_specs.pad_cu_seqlens": BOOL},
)
def pad_cu_seqlens_needs_fixed_width(ctx: RuleContext) -> list[Violation] | None:
    if ctx.specs is None or not ctx.specs.pad_cu_seqlens:
        return None
    if ctx.pad_to_max_length:
        return []
    return [
        Violation(
            {f"{SPECS}.pad_cu_seqlens": True, ctx.pad_to_max_length_path: False},
            "static cu_seqlens only make sense for rows of a static width",
            assignments=ctx.pad_to_max_length_fix(),
        )
    ]


@rule(
    "cuda_graphs.training_graphs_need_fixed_width",
    "Offline packing with training CUDA graphs (full-iteration or TE) needs pad_to_max_length=True.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError 'Offline packing with CUDA graphs "
        "requires dataset pad_to_max_length=True.'"
    ),
    reads={
        **DATASET_KWARGS_READS,
        "dataset.offline_packing_specs.pad_cu_seqlens": BOOL,
        "model.cuda_graph_impl": OPTIONAL_STR,
    },
)
def training_graphs_need_fixed_width(ctx: RuleContext) -> list[Violation] | None:
    if ctx.specs is None or not ctx.training_cuda_graphs:
        return None
    if ctx.pad_to_max_length:
        return []
    if ctx.specs.pad_cu_seqlens:
        return []  # reported once, by cuda_graphs.pad_cu_seqlens_needs_fixed_width
    return [
        Violation(
            {"model.cuda_graph_impl": ctx.cuda_graph_impl, ctx.pad_to_max_length_path: False},
            "a captured graph replays one token width; packed rows must be padded to packed_sequence_size",
            assignments=ctx.pad_to_max_length_fix(),
        )
    ]


@rule(
    "cuda_graphs.attention_graphs_need_pad_cu_seqlens",
    "Full-iteration graphs over offline packs need offline_packing_specs.pad_cu_seqlens=True.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError 'Packed attention CUDA graphs require "
        "offline_packing_specs.pad_cu_seqlens=True.'; without it the collate emits one cu_seqlens entry per "
        "sequence and megatron/core/full_cuda_graph.py StaticBufferLoader copy_()s it into the first batch's buffer. "
        "TE graphs holding attention are reported by cuda_graphs.te_attention_over_packed instead (they fail "
        "even with it)."
    ),
    reads={
        **DATASET_KWARGS_READS,
        "dataset.offline_packing_specs.pad_cu_seqlens": BOOL,
        "model.cuda_graph_impl": OPTIONAL_STR,
    },
)
def attention_graphs_need_pad_cu_seqlens(ctx: RuleContext) -> list[Violation] | None:
    if ctx.specs is None or not ctx.full_iteration_graph:
        return None
    if ctx.specs.pad_cu_seqlens:
        return []
    return [
        Violation(
            {"model.cuda_graph_impl": ctx.cuda_graph_impl, f"{SPECS}.pad_cu_seqlens": False},
            "captured attention replays a fixed cu_seqlens length; without padding it, every batch with a "
            "different number of sequences breaks the graph",
            assignments={f"{SPECS}.pad_cu_seqlens": True, **ctx.pad_to_max_length_fix()},
        )
    ]


def _graphs_after_attention(ctx: RuleContext) -> dict[str, Any]:
    """A TE scope the capture-safety run certifies for this model's layer kinds: the configured modules it
    certifies, else the first of ``mlp`` / ``moe_router`` it does (``moe_router`` where every layer is MoE:
    Megatron-Core refuses ``mlp`` there; ``mlp`` for a hybrid model's MLP layers, never ``mamba``); with none,
    graphs off. Never a scope the run saw fail."""
    scope = _verdicts().safe_scope(_layer_kinds(ctx), keep=ctx.graph_modules)
    fix: dict[str, Any] = {"model.cuda_graph_modules": scope} if scope else {"model.cuda_graph_impl": "none"}
    if getattr(ctx.model, "cuda_graph_scope", None) is not None:
        fix["model.cuda_graph_scope"] = None  # the deprecated spelling; Megatron-Core refuses both together
    return fix


def _per_layer_graphs(ctx: RuleContext) -> dict[str, Any]:
    """Leave full-iteration graphs for TE per-layer graphs of a certified scope (or none)."""
    fix = _graphs_after_attention(ctx)
    if fix.get("model.cuda_graph_impl") == "none":
        return fix
    return {"model.cuda_graph_impl": "transformer_engine", **fix}


def _packing_field(ctx: RuleContext) -> dict[str, Any]:
    if ctx.in_batch_packing:
        return {"dataset.enable_in_batch_packing": True}
    return {"dataset.enable_offline_packing": True}


@rule(
    "cuda_graphs.te_attention_over_packed",
    "TE per-layer graphs over packed rows must leave attention out (cuda_graph_modules without attn, not empty).",
    severity=ERROR,
    evidence=TE_REPLAY
    + ". Megatron-Bridge's validate() accepts (and recommends) attention capture with pad_cu_seqlens. "
    + COMPUTED_TE
    + ": the replay asserts on every kind with attention (docs/graph-paths.md). The fix keeps only the configured "
    "modules the run certifies (never mamba over packed rows).",
    reads={**GRAPH_PATH_READS, **DATASET_KWARGS_READS, "dataset.enable_offline_packing": BOOL},
)
def te_attention_over_packed(ctx: RuleContext) -> list[Violation] | None:
    cell = ctx.graph_path
    if cell is None or cell.impl != "transformer_engine" or ctx.in_batch_packing:
        return None
    if not (cell.fails and cell.rule_id == "cuda_graphs.te_attention_over_packed"):
        return []
    return [
        Violation(
            {"model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_modules": ctx.graph_modules}
            | _packing_field(ctx),
            "a TE graph takes tensors only: with attention inside it (whole layer or attn), the first replay "
            "asserts on packed_seq_params; capture the part after attention and run attention eagerly",
            assignments=_graphs_after_attention(ctx),
        )
    ]


@rule(
    "cuda_graphs.te_capture_width",
    "TE per-layer graphs over offline packs need packed_sequence_size == model.seq_length.",
    severity=ERROR,
    evidence=TE_SAMPLES + "; a row of packed_sequence_size tokens is copy_()d into a surface of seq_length tokens.",
    reads={
        **DATASET_KWARGS_READS,
        "dataset.enable_in_batch_packing": BOOL,
        "dataset.enable_offline_packing": BOOL,
        "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
        "model.cuda_graph_impl": OPTIONAL_STR,
        **MOE_READS,
        "model.seq_length": POSITIVE_INT,
    },
)
def te_capture_width(ctx: RuleContext) -> list[Violation] | None:
    cell = ctx.graph_path
    if cell is None or cell.impl != "transformer_engine" or cell.packing != "offline_fixed":
        return None
    size, seq = ctx.specs.packed_sequence_size, ctx.model.seq_length
    if size == seq:
        return []
    return [
        Violation(
            {
                f"{SPECS}.packed_sequence_size": size,
                "model.seq_length": seq,
                "model.cuda_graph_impl": ctx.cuda_graph_impl,
            },
            f"TE captures each layer for rows of model.seq_length ({seq}) tokens; packed rows of {size} tokens do "
            "not fit the captured input",
            assignments={f"{SPECS}.packed_sequence_size": seq},
        )
    ]


@rule(
    "cuda_graphs.te_scope_inputs",
    "TE per-layer graphs over packed rows must not capture a module whose replay gets non-tensor inputs "
    "(mamba: HybridStack passes packed_seq_params).",
    severity=ERROR,
    evidence=MAMBA_REPLAY
    + ". "
    + COMPUTED_TE
    + ": [mamba] asserts on Mamba layers ('CUDA graph accepts only Tensor inputs.') at the first replay, after the "
    "GPUs are allocated; Megatron-Bridge's validate() checks only attention capture. The fix keeps the configured "
    "modules the run certifies, else mlp / moe_router, else graphs off.",
    reads={**GRAPH_PATH_READS, **DATASET_KWARGS_READS, "dataset.enable_offline_packing": BOOL},
)
def te_scope_inputs(ctx: RuleContext) -> list[Violation] | None:
    cell = ctx.graph_path
    if cell is None or cell.impl != "transformer_engine" or ctx.in_batch_packing or not ctx.graph_modules:
        return None  # the whole layer holds attention: cuda_graphs.te_attention_over_packed
    modules = [m for m in ctx.graph_modules if m != "attn"]
    if not modules:
        return []  # attention alone: cuda_graphs.te_attention_over_packed
    failing = [v for v in _verdicts().failing_modules(modules, _layer_kinds(ctx)) if v.outcome == "asserts"]
    if not failing:
        return []
    kinds = ", ".join(sorted({v.kind for v in failing}))
    first = failing[0]
    return [
        Violation(
            {
                "model.cuda_graph_impl": "transformer_engine",
                "model.cuda_graph_modules": ctx.graph_modules,
                "layer kinds": kinds,
            }
            | _packing_field(ctx),
            f"[{', '.join(sorted({v.module for v in failing}))}] graphs {kinds} layers, whose replay gets "
            f"packed_seq_params (not a tensor) and asserts at the first step: '{first.message}' ({first.site})",
            assignments=_graphs_after_attention(ctx),
        )
    ]


@rule(
    "cuda_graphs.capture_host_reads",
    "A CUDA graph over packed rows must not read device values on the host: each feature whose captured code "
    "does (found by running it) is refused, with the fix that removes it.",
    severity=ERROR,
    evidence=COMPUTED_FULL
    + ", once per feature over a baseline with none, and "
    + COMPUTED_TE
    + ". A host read (.item(), .tolist(), bool(tensor), .cpu(), a tensor slice bound, nonzero / masked_select / "
    "repeat_interleave without output_size, torch.cuda.synchronize, Event.synchronize, a barrier) inside "
    "torch.cuda.graph fails the capture ('operation not permitted when stream is capturing') or bakes one step's "
    "values into every replay. Found: non-fused THD RoPE (rope_utils._apply_rotary_pos_emb_thd), the DDP NaN / "
    "large-grad checks (param_and_grad_buffer.check_grads -> rerun_state_machine.validate_result), the spiky-loss "
    "check, timers at timing_log_level >= 1 (timers.Timer.start/stop: torch.cuda.synchronize), a hybrid model's "
    "seq_idx (PackedSeqParams.__post_init__ repeat_interleave), MTP's packed roll, dropless MoE dispatch; "
    "docs/graph-paths.md lists each with its site.",
    reads={
        **DATASET_KWARGS_READS,
        **TOPOLOGY_READS,
        "dataset.enable_in_batch_packing": BOOL,
        "dataset.enable_offline_packing": BOOL,
        "ddp.check_for_large_grads": BOOL,
        "ddp.check_for_nan_in_grad": BOOL,
        "ddp.overlap_grad_reduce": BOOL,
        "logger.timing_log_level": ANY_INT,
        "model.apply_rope_fusion": BOOL,
        "model.cuda_graph_impl": OPTIONAL_STR,
        **MOE_READS,
        "model.is_hybrid_model": BOOL,
        "model.mtp_num_layers": OPTIONAL_NON_NEGATIVE_INT,
        "model.position_embedding_type": OPTIONAL_NAME,
        "rerun_state_machine.check_for_spiky_loss": BOOL,
    },
)
def capture_host_reads(ctx: RuleContext) -> list[Violation] | None:
    cell = ctx.graph_path
    if cell is None or cell.packing != "offline_fixed" or cell.impl not in ("full_iteration", "transformer_engine"):
        return None
    verdicts = _verdicts()
    if cell.impl == "transformer_engine":
        return _te_host_reads(ctx, verdicts)
    found = verdicts.present_conditions(ctx.cfg)
    out = _full_iteration_unknowns(ctx, verdicts)
    if not found:
        return out + _sizes_not_run(ctx)
    leave = [p.name for p, _ in found if p.fix is None or p.fix(ctx.cfg) is None]
    out = []
    for probe, reads in found:
        why = (
            f"{probe.title}: the captured step reads device values on the host ("
            + "; ".join(r.describe() for r in reads)
            + "), which fails the capture or replays one step's values"
        )
        if probe.name in leave:
            reason = probe.why_leave or "no setting removes it"
            assignments = _per_layer_graphs(ctx)
            why += f"; {reason}: capture per layer instead (that code then runs eagerly)"
        elif leave:
            assignments = _per_layer_graphs(ctx)
            why += f"; {', '.join(leave)} already needs per-layer graphs, which run this eagerly"
        else:
            assignments = probe.fix(ctx.cfg)
        out.append(Violation({"model.cuda_graph_impl": ctx.cuda_graph_impl} | probe.fields(ctx.cfg), why,
                             assignments=assignments))  # fmt: skip
    return out


def _sizes_not_run(ctx: RuleContext) -> list[Violation]:
    """A clean capture ran in a one-rank world: at TP or PP > 1 the step also runs the tensor-parallel collectives and
    the pipeline schedule (its send/receive of each micro batch's activations, whose shapes a variable-length step
    reads on the host), which that run never had, so its verdict is not determined there, never shown as OK."""
    tp, pp = ctx.topology.tp, ctx.topology.pp
    named = {"TP": ("model.tensor_model_parallel_size", tp), "PP": ("model.pipeline_model_parallel_size", pp)}
    sizes = {path: size for path, size in named.values() if size > 1}
    if not sizes:
        return []
    return [
        Violation(
            {"model.cuda_graph_impl": ctx.cuda_graph_impl} | sizes,
            "whether the full-iteration graph's step reads the host at these parallel sizes is not determined here "
            "(the capture found no host read in a one-rank world)",
            fix="run one training step under the full-iteration graph on the GPUs first, or capture per layer: "
            + "; ".join(f"cfg.{k} = {v!r}" for k, v in _per_layer_graphs(ctx).items()),
            severity=UNDETERMINED,
            not_run="the capture ran in a one-rank CPU world; "
            + " and ".join(f"{name}={size}" for name, (_, size) in named.items() if size > 1)
            + " (tensor-parallel collectives, the pipeline schedule's sends and receives) was not run",
        )
    ]


def _full_iteration_unknowns(ctx: RuleContext, verdicts: Any) -> list[Violation]:
    """The config's features whose probe config Megatron-Core refuses (an error, its message), and those whose run
    stopped before the step's end (undetermined: where it stopped; never certified)."""
    out = []
    fields = {"model.cuda_graph_impl": ctx.cuda_graph_impl}
    for probe in verdicts.present_refusals(ctx.cfg):
        out.append(
            Violation(
                fields | probe.fields(ctx.cfg),
                f"{probe.title}: Megatron-Core refuses this config ({verdicts.refused(probe.name)})",
                assignments=probe.fix(ctx.cfg) if probe.fix is not None and probe.fix(ctx.cfg) else {},
                fix="" if probe.fix is not None and probe.fix(ctx.cfg) else "change the MoE settings it names",
            )
        )
    for probe in verdicts.present_undetermined(ctx.cfg):
        out.append(
            Violation(
                fields | probe.fields(ctx.cfg),
                f"{probe.title}: whether the captured step reads the host is not determined here",
                fix="run the step once under torch.cuda.graph on a GPU, or capture per layer: "
                + "; ".join(f"cfg.{k} = {v!r}" for k, v in _per_layer_graphs(ctx).items()),
                severity=UNDETERMINED,
                not_run=f"the capture run stopped at {verdicts.stopped_at(probe.name)}",
            )
        )
    return out


def _te_host_reads(ctx: RuleContext, verdicts: Any) -> list[Violation]:
    """TE per-layer scopes: a graphed part that reads the host, a scope Megatron-Core refuses for this model (its
    assert, e.g. moe_preprocess with a capacity factor on alltoall), and a scope on a kind the run could not decide
    (undetermined)."""
    kinds = _layer_kinds(ctx)
    modules = ctx.graph_modules
    out = [
        Violation(
            {"model.cuda_graph_modules": modules, "layer kinds": v.kind},
            f"the [{v.module}] graph of {v.kind} layers reads the host: " + "; ".join(r.describe() for r in v.reads),
            assignments=_graphs_after_attention(ctx),
        )
        for v in verdicts.scope_for(modules, kinds)
        if v.reads and v.outcome != "asserts"
    ]
    out += [
        Violation(
            {"model.cuda_graph_modules": modules, "layer kinds": v.kind},
            f"Megatron-Core refuses the [{v.module.replace('+', ', ')}] scope for {v.kind} layers: '{v.message}' "
            f"({v.site})",
            assignments=_graphs_after_attention(ctx),
        )
        for v in verdicts.scope_refusals(modules, kinds)
    ]
    out += [
        Violation(
            {"model.cuda_graph_modules": modules, "layer kinds": kind},
            f"whether the [{module or 'whole layer'}] graph of {kind} layers replays without host reads is not "
            "determined here",
            fix="run one step under TE graphs on a GPU first, or capture a scope the run certifies: "
            + "; ".join(f"cfg.{k} = {v!r}" for k, v in _graphs_after_attention(ctx).items()),
            severity=UNDETERMINED,
            not_run=why,
        )
        for module, kind, why in verdicts.scope_undetermined(modules, kinds)
        if module not in ("", "attn")  # attention inside the graph: cuda_graphs.te_attention_over_packed refuses it
    ]
    return out


@rule(
    "cuda_graphs.full_iteration_needs_injection",
    "Full-iteration graphs over offline packs need mbridge_seqpack's host-side max_seqlen injected into "
    "FullCudaGraphWrapper.data_read of the process that trains.",
    severity=ERROR,
    evidence=FULL_ITER_READ + "; " + HOST_MAX_SEQLEN + ". " + COMPUTED_FULL + ", with and without "
    "mbridge_seqpack.thd.inject's data_read wrapper: without it the step's only host read is that .cpu(). In the "
    "process that trains (the plugin installed there) the wrapper must be on the class when validate() runs; a "
    "pre-launch check accepts MBRIDGE_SEQPACK_MODE only with the start-up hook (mbridge_seqpack_autoload.pth) present "
    "in the environment.",
    reads={**GRAPH_PATH_READS, **DATASET_KWARGS_READS, "dataset.enable_offline_packing": BOOL},
)
def full_iteration_needs_injection(ctx: RuleContext) -> list[Violation] | None:
    from mbridge_seqpack.thd.inject import AUTOLOAD_PTH, injection_state

    cell = ctx.graph_path
    if cell is None or cell.verdict != "works_with_injection":
        return None
    state = injection_state()
    if state in ("installed", "launch"):
        return []
    reads = "; ".join(r.describe() for r in _verdicts().injection_removes())
    fields = {"model.cuda_graph_impl": ctx.cuda_graph_impl, "dataset.enable_offline_packing": True}
    if state == "replaced":
        return [
            Violation(
                fields | {"FullCudaGraphWrapper.data_read": "not mbridge_seqpack's wrapper"},
                "mbridge_seqpack is installed in this process but FullCudaGraphWrapper.data_read is no longer its "
                f"wrapper (reassigned, or megatron.core.full_cuda_graph reloaded, after install()); the captured step "
                f"would read the host ({reads})",
                fix="call mbridge_seqpack.install() after whatever replaces FullCudaGraphWrapper.data_read, or "
                "capture per layer: " + "; ".join(f"cfg.{k} = {v!r}" for k, v in _per_layer_graphs(ctx).items()),
                assignments=_per_layer_graphs(ctx),
            )
        ]
    from mbridge_seqpack.modes import ACTIVE_MODES, MODE_ENV, env_mode

    launch = (
        f"{MODE_ENV} is set but this environment has no {AUTOLOAD_PTH}, so a launched process would not install the "
        "plugin"
        if env_mode() in ACTIVE_MODES
        else f"launch with {MODE_ENV}=error (the plugin hands the step a host max_seqlen)"
    )
    return [
        Violation(
            fields,
            f"the captured step reads max_seqlen back from the device ({reads}), illegal inside capture; {launch}, "
            "or capture per layer",
            assignments=_per_layer_graphs(ctx),
        )
    ]


@rule(
    "cuda_graphs.local_per_layer",
    "Packed training cannot use local per-layer CUDA graphs (Megatron-Bridge allows local for full-iteration only).",
    severity=ERROR,
    evidence=(
        "megatron/bridge/utils/cuda_graph.py validate_cuda_graph_configuration raises ValueError 'Megatron Bridge "
        'supports model.cuda_graph_impl="local" only for full-iteration CUDA graphs\''
    ),
    reads={**GRAPH_PATH_READS, **DATASET_KWARGS_READS, "dataset.enable_offline_packing": BOOL},
)
def local_per_layer(ctx: RuleContext) -> list[Violation] | None:
    cell = ctx.graph_path
    if cell is None or cell.impl != "local":
        return None
    fix: dict[str, Any] = {"model.cuda_graph_impl": "none"}
    if getattr(ctx.model, "cuda_graph_scope", None) is not None:
        fix["model.cuda_graph_scope"] = None
    if ctx.offline_packing:
        fix = {"model.cuda_graph_impl": "transformer_engine", **_graphs_after_attention(ctx)}
    return [
        Violation(
            {"model.cuda_graph_impl": "local", "model.cuda_graph_modules": ctx.graph_modules} | _packing_field(ctx),
            "Megatron-Bridge builds local CUDA graphs only for the full iteration",
            assignments=fix,
        )
    ]


@rule(
    "cuda_graphs.pad_cu_seqlens_needs_metadata",
    "pad_cu_seqlens with explicit packed paths needs an existing packed_metadata_path.",
    severity=ERROR,
    evidence=(
        "data/packing/gpt_sft.py GPTSFTPackedDataset.__init__ asserts 'a metadata json file is required when "
        "pad_cu_seqlens is enabled' and open()s it (FileNotFoundError), at dataset build after the GPUs are "
        "allocated. With packed_metadata_path unset, data/builders/gpt_sft.py GPTSFTDatasetBuilder.pack_metadata "
        "passes the builder's default location (<dataset_root>/packed/<tokenizer>_pad_seq_to_mult<M>_sft_<digest>/"
        "<N>_metadata.jsonl, artifact/builder_location.py): a file there builds."
    ),
    reads={
        **PACK_FINGERPRINT_READS,
        **PACK_PATH_READS,
        **DATASET_KWARGS_READS,
        "dataset.hf_dataset": UNCHECKED,
        "dataset.offline_packing_specs.pad_cu_seqlens": BOOL,
    },
)
def pad_cu_seqlens_needs_metadata(ctx: RuleContext) -> list[Violation] | None:
    from mbridge_seqpack.artifact.builder_location import builder_location

    specs = ctx.specs
    if specs is None or not specs.pad_cu_seqlens or specs.packed_train_data_path is None:
        return None  # builder-managed paths write their metadata next to the pack
    meta = specs.packed_metadata_path
    if meta is not None and Path(str(meta)).is_file():
        return []
    default = builder_location(ctx.cfg) if meta is None else None
    if default is not None and default.metadata.is_file():
        return []  # the builder passes its default location's metadata (GPTSFTDatasetBuilder.pack_metadata)
    guess = Path(str(specs.packed_train_data_path)).parent / f"{specs.packed_sequence_size}_metadata.jsonl"
    return [
        Violation(
            {
                f"{SPECS}.packed_metadata_path": None if meta is None else str(meta),
                f"{SPECS}.packed_train_data_path": str(specs.packed_train_data_path),
            },
            "static cu_seqlens are sized from the pack metadata (max_samples_per_bin, dataset_max_seqlen); "
            + ("it is not set" if meta is None else "the file does not exist"),
            fix=f"cfg.{SPECS}.packed_metadata_path = '<metadata JSON written with the pack, e.g. {guess}>'",
        )
    ]
