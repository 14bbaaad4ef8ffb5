"""Transformer Engine's userbuffer TP overlap: the token count it fixes, for every precision."""

from __future__ import annotations

import math
from typing import Any

from mbridge_seqpack.analysis.topology import round_up
from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import DATASET_KWARGS_READS, SPECS, TOPOLOGY_READS, TP_OVERLAP_READS, RuleContext
from mbridge_seqpack.rules.field_types import (
    ANY_INT,
    BOOL,
    OPTIONAL_MICRO_BATCH,
    POSITIVE_INT,
    UNCHECKED,
)
from mbridge_seqpack.rules.registry import rule


def _overlap_fix(ctx: RuleContext) -> dict[str, Any]:
    """Turn the userbuffer overlap off where the config sets it (comm_overlap wins over the model field)."""
    if getattr(ctx.cfg, "comm_overlap", None) is not None:
        return {"comm_overlap.tp_comm_overlap": False}
    return {"model.tp_comm_overlap": False}


def _token_count_problem(ctx: RuleContext) -> tuple[str, dict[str, Any]] | None:
    """Why a training micro batch does not hold exactly seq_length * micro_batch tokens, and the fix; None when it
    does (or the dataset kind is not one whose widths are known)."""
    seq = ctx.model.seq_length
    if ctx.in_batch_packing or ctx.energon_packing:
        return "collate-time / online packing gives every micro batch its own token count", _overlap_fix(ctx)
    if ctx.offline_packing and ctx.specs is not None:
        size = ctx.specs.packed_sequence_size
        if not ctx.pad_to_max_length:
            return (
                "packed rows are as wide as their content rounded up to pad_seq_length_to_mult",
                ctx.pad_to_max_length_fix() | ({} if size == seq else {f"{SPECS}.packed_sequence_size": seq}),
            )
        if size != seq:
            return f"packed rows are packed_sequence_size = {size} tokens wide", {f"{SPECS}.packed_sequence_size": seq}
        return None
    if ctx.dataset_is("gpt_sft", "direct_hf", "energon", "mock_vlm"):
        if ctx.fixed_width_rows:
            return None
        return "each batch is padded only to its longest row", ctx.pad_to_max_length_fix()
    return None


@rule(
    "tp_comm_overlap.token_count",
    "TP communication overlap needs every micro batch to hold seq_length * micro_batch / CP tokens per rank.",
    severity=ERROR,
    evidence=(
        "megatron/bridge/training/initialize.py _initialize_tp_communicators sizes Transformer Engine's userbuffers "
        "once, for [seq_length * micro_batch_size / context_parallel_size, hidden_size]; "
        "transformer_engine/pytorch/module/base.py fill_userbuffers_buffer_for_all_gather copies each GEMM input "
        "into them and csrc/extensions/comm_gemm_overlap.cpp copy_into_buffer / get_buffer check "
        "'input_size * tp_size == ubuf_size' (NVTE_CHECK), so a micro batch of any other token count fails at its "
        "first TP GEMM (NVIDIA/TransformerEngine#1303: 'the sequence length has to be constant'). Packed rows "
        "without pad_to_max_length, variable-width GPT SFT batches, collate-time and Energon packing, and "
        "evaluation micro batches of another size all give other counts. Megatron-Bridge keeps the overlap only "
        "with TP>1 and sequence parallelism (training/comm_overlap.py)."
    ),
    reads={
        **TOPOLOGY_READS,
        **DATASET_KWARGS_READS,
        **TP_OVERLAP_READS,
        "dataset.enable_offline_packing": BOOL,
        "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
        "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
        "validation.eval_micro_batch_size": OPTIONAL_MICRO_BATCH,
    },
)
def tp_comm_overlap_token_count(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.tp_comm_overlap:
        return None
    topo = ctx.topology
    mbs = ctx.train.micro_batch_size
    problem = _token_count_problem(ctx)
    found = []
    (overlap_field,) = _overlap_fix(ctx)
    fields = {overlap_field: True, "model.seq_length": ctx.model.seq_length, "train.micro_batch_size": mbs}
    if problem is not None:
        why, fix = problem
        found.append(
            Violation(
                fields | {"model.context_parallel_size": topo.cp},
                f"the userbuffers hold seq_length * micro_batch / CP tokens per micro batch and Transformer Engine "
                f"checks every GEMM input against that size; {why}, so the first TP GEMM fails",
                assignments=fix,
            )
        )
    eval_mbs = getattr(getattr(ctx.cfg, "validation", None), "eval_micro_batch_size", None)
    if problem is None and eval_mbs is not None and mbs is not None and eval_mbs != mbs:
        found.append(
            Violation(
                fields | {"validation.eval_micro_batch_size": eval_mbs},
                f"evaluation micro batches hold {eval_mbs} rows where the userbuffers were sized for {mbs}: the "
                "first evaluation fails at its first TP GEMM",
                assignments={"validation.eval_micro_batch_size": mbs},
            )
        )
    return found


@rule(
    "tp_comm_overlap.mxfp8_tokens",
    "TP communication overlap with MXFP8 needs each rank's tokens (seq_length x micro batch / CP / TP) a multiple of "
    "128.",
    severity=ERROR,
    evidence=(
        "transformer_engine/pytorch/module/base.py fill_userbuffers_buffer_for_all_gather raises ValueError "
        "'Userbuffers requires MXFP8 tensor dims that are divisible by 128' for the MXFP8 all-gather of a userbuffer "
        "TP GEMM input, at the first forward; the input holds seq_length x micro_batch / CP / TP tokens "
        "(tp_comm_overlap.token_count keeps every micro batch at that count). fp8.packed_tokens_per_rank asks for the "
        "32-token MXFP8 block only. Needs a GPU and userbuffers: cited."
    ),
    reads={
        **TOPOLOGY_READS,
        **TP_OVERLAP_READS,
        "dataset.enable_offline_packing": BOOL,
        "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
        "dataset.seq_length": POSITIVE_INT,
        "mixed_precision": UNCHECKED,
        "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
    },
)
def mxfp8_userbuffer_tokens(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.tp_comm_overlap or ctx.fp8_recipe != "mxfp8":
        return None
    topo = ctx.topology
    seq, mbs = ctx.model.seq_length, ctx.train.micro_batch_size
    if not isinstance(mbs, int) or not isinstance(seq, int):
        return None
    need = 128 * topo.cp * topo.tp
    if seq * mbs % need == 0:
        return []
    size = round_up(seq, need // math.gcd(need, mbs))
    fix: dict[str, object] = {"model.seq_length": size}
    if hasattr(ctx.dataset, "seq_length"):
        fix["dataset.seq_length"] = size
    if ctx.offline_packing and ctx.specs is not None:
        fix[f"{SPECS}.packed_sequence_size"] = size
    return [
        Violation(
            {
                "model.seq_length": seq,
                "train.micro_batch_size": mbs,
                "model.context_parallel_size": topo.cp,
                "model.tensor_model_parallel_size": topo.tp,
            },
            f"each rank's userbuffer holds seq_length x micro_batch / CP / TP = {seq * mbs / (topo.cp * topo.tp):g} "
            "tokens, and the MXFP8 all-gather of its scales needs a multiple of 128",
            assignments=fix,
        )
    ]
