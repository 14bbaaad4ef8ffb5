"""CUDA-graph and fixed-width rules for packed batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import SPECS, RuleContext
from mbridge_seqpack.rules.graph_paths import (
    FULL_ITER_READ,
    HOST_MAX_SEQLEN,
    TE_REPLAY,
    TE_SAMPLES,
    graph_path,
)
from mbridge_seqpack.rules.registry import rule


@rule(
    "cuda_graphs.pad_cu_seqlens_needs_fixed_width",
    "pad_cu_seqlens=True needs pad_to_max_length=True.",
    severity=ERROR,
    evidence=(
        "training/config.py ConfigContainer.validate raises ValueError "
        "'offline_packing_specs.pad_cu_seqlens=True requires dataset pad_to_max_length=True.'; "
        "data/packing/gpt_sft.py GPTSFTPackedDataset.__init__ asserts it again."
    ),
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
    """The working TE scope: the configured modules without attention, else the layer's MLP part
    (``moe_router`` where every layer is MoE: Megatron-Core refuses ``mlp`` there)."""
    kept = [m for m in ctx.graph_modules if m != "attn"]
    fix: dict[str, Any] = {
        "model.cuda_graph_modules": kept or (["mlp"] if ctx.has_dense_mlp_layers else ["moe_router"])
    }
    if getattr(ctx.model, "cuda_graph_scope", None) is not None:
        fix["model.cuda_graph_scope"] = None  # the deprecated spelling; Megatron-Core refuses both together
    return fix


def _packing_field(ctx: RuleContext) -> dict[str, Any]:
    if ctx.in_batch_packing:
        return {"dataset.enable_in_batch_packing": True}
    return {"dataset.enable_offline_packing": True}


@rule(
    "cuda_graphs.te_attention_over_packed",
    "TE per-layer graphs over packed rows must leave attention out (cuda_graph_modules without attn, not empty).",
    severity=ERROR,
    evidence=TE_REPLAY
    + ". Megatron-Bridge's validate() accepts (and recommends) attention capture with pad_cu_seqlens.",
)
def te_attention_over_packed(ctx: RuleContext) -> list[Violation] | None:
    cell = graph_path(ctx)
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
)
def te_capture_width(ctx: RuleContext) -> list[Violation] | None:
    cell = graph_path(ctx)
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
    "cuda_graphs.full_iteration_needs_injection",
    "Full-iteration graphs over offline packs need mbridge_seqpack's host-side max_seqlen (MBRIDGE_SEQPACK_MODE).",
    severity=ERROR,
    evidence=FULL_ITER_READ + "; " + HOST_MAX_SEQLEN + ". mbridge_seqpack.thd.inject wraps data_read so the step gets "
    "a host max_seqlen; installed by mbridge_seqpack.install() and MBRIDGE_SEQPACK_MODE.",
)
def full_iteration_needs_injection(ctx: RuleContext) -> list[Violation] | None:
    cell = graph_path(ctx)
    if cell is None or cell.verdict != "works_with_injection":
        return None
    if ctx.static_thd_injected:
        return []
    fix: dict[str, Any] = {"model.cuda_graph_impl": "transformer_engine"}
    fix.update(_graphs_after_attention(ctx))
    return [
        Violation(
            {"model.cuda_graph_impl": ctx.cuda_graph_impl, "dataset.enable_offline_packing": True},
            "the captured step reads max_seqlen back from the device (.cpu()), illegal inside capture; launch with "
            "MBRIDGE_SEQPACK_MODE=error (the plugin hands the step a host max_seqlen), or capture per layer",
            assignments=fix,
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
)
def local_per_layer(ctx: RuleContext) -> list[Violation] | None:
    cell = graph_path(ctx)
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
        "allocated."
    ),
)
def pad_cu_seqlens_needs_metadata(ctx: RuleContext) -> list[Violation] | None:
    specs = ctx.specs
    if specs is None or not specs.pad_cu_seqlens or specs.packed_train_data_path is None:
        return None  # builder-managed paths write their metadata next to the pack
    meta = specs.packed_metadata_path
    if meta is not None and Path(str(meta)).is_file():
        return []
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


@rule(
    "fixed_width.gpt_sft_pipeline",
    "GPT SFT with PP>1 outside the 'batch' dataloader needs dataset_kwargs['pad_to_max_length']=True.",
    severity=ERROR,
    evidence=(
        "With PP>1 and variable_seq_lengths=False, megatron/core/pipeline_parallel/schedules.py get_tensor_shapes "
        "sizes every p2p buffer from the seq_length training/train.py passes: the width of the current global batch "
        "for dataloader_type='batch' (data/batch_utils.py prepare_finetuning_batch, Megatron-Bridge's SFT default), "
        "else model.seq_length, while data/packing/gpt_sft.py and data/datasets/gpt_sft.py collate_fn emit rows only "
        "as wide as their content."
    ),
)
def gpt_sft_pipeline(ctx: RuleContext) -> list[Violation] | None:
    topo = ctx.topology
    if not ctx.dataset_is("gpt_sft") or topo.pp <= 1 or getattr(ctx.model, "variable_seq_lengths", False) is True:
        return None
    if getattr(ctx.dataset, "dataloader_type", None) == "batch":
        return None  # the training loop takes each global batch's own width
    if ctx.pad_to_max_length:
        return []
    return [
        Violation(
            {
                ctx.pad_to_max_length_path: False,
                "model.pipeline_model_parallel_size": topo.pp,
                "dataset.dataloader_type": getattr(ctx.dataset, "dataloader_type", None),
            },
            "pipeline stages exchange activations through buffers of seq_length tokens; variable-width rows "
            "do not fit them",
            assignments=ctx.pad_to_max_length_fix(),
        )
    ]


@rule(
    "fixed_width.gpt_sft_experts",
    "GPT SFT with EP>1: Megatron-Bridge pads rows to full width for expert parallelism on its other datasets.",
    severity=ADVISORY,
    evidence=(
        "training/config.py ConfigContainer.validate sets pad_to_max_length=True for EP>1 on DirectHF/Energon/"
        "MockVLM datasets; no Megatron-Core code fails on variable-width rows with EP>1 for the alltoall/allgather "
        "dispatchers (they take any token count), so for GPT SFT this is a consistency/performance advisory; "
        "HybridEP, which does need equal counts, is moe.hybridep_uneven_inputs."
    ),
)
def gpt_sft_experts(ctx: RuleContext) -> list[Violation] | None:
    topo = ctx.topology
    if not ctx.dataset_is("gpt_sft") or topo.ep <= 1:
        return None
    if ctx.pad_to_max_length:
        return []
    return [
        Violation(
            {ctx.pad_to_max_length_path: False, "model.expert_model_parallel_size": topo.ep},
            "Megatron-Bridge pads rows to full width under expert parallelism for its HF/VLM datasets; GPT SFT "
            "rows stay variable-width",
            assignments=ctx.pad_to_max_length_fix(),
        )
    ]


@rule(
    "moe.hybridep_uneven_inputs",
    "HybridEP dispatch over variable-width GPT SFT rows needs moe_hybridep_pad_uneven_dispatch_inputs.",
    severity=ERROR,
    evidence=(
        "megatron/core/transformer/moe/token_dispatcher.py _HybridEPManager.setup_metadata: 'HybridEP dispatch "
        "expects equal per-rank input sizes' and pads to the group maximum only when "
        "moe_hybridep_pad_uneven_dispatch_inputs is set; Megatron-Bridge 0.6.2 sets it itself only for THD "
        "packing without CUDA graphs (models/transformer_config.py _enable_safe_hybridep_dispatch). Unequal "
        "token counts across the EP group hang HybridEP's buffer all-gather or corrupt routing "
        "(deepseek-ai/DeepEP#604)."
    ),
)
def hybridep_uneven_inputs(ctx: RuleContext) -> list[Violation] | None:
    model = ctx.model
    if (
        getattr(model, "moe_token_dispatcher_type", None) != "flex"
        or getattr(model, "moe_flex_dispatcher_backend", None) != "hybridep"
        or ctx.topology.ep <= 1
        or not ctx.dataset_is("gpt_sft")
    ):
        return None
    if getattr(model, "moe_hybridep_pad_uneven_dispatch_inputs", False) or ctx.pad_to_max_length:
        return []
    if (ctx.offline_packing or ctx.in_batch_packing) and getattr(model, "cuda_graph_impl", "none") in (None, "none"):
        return []  # Megatron-Bridge turns the padding on for THD packing without CUDA graphs
    return [
        Violation(
            {
                "model.moe_flex_dispatcher_backend": "hybridep",
                "model.expert_model_parallel_size": ctx.topology.ep,
                ctx.pad_to_max_length_path: False,
                "model.moe_hybridep_pad_uneven_dispatch_inputs": False,
            },
            "each EP rank dispatches its own micro batch, as wide as its longest row; HybridEP expects the same "
            "token count on every rank and hangs or mis-routes otherwise",
            assignments={"model.moe_hybridep_pad_uneven_dispatch_inputs": True},
        )
    ]
