"""Low-precision (FP8 / MXFP8 / NVFP4) rules for packed rows: what Transformer Engine's quantized GEMMs need of the
token dimension each rank holds."""

from __future__ import annotations

import math

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import DATASET_KWARGS_READS, FP8_ROW_READS, TOPOLOGY_READS, RuleContext
from mbridge_seqpack.rules.field_types import (
    ANY_INT,
    BOOL,
    OPTIONAL_MICRO_BATCH,
    POSITIVE_INT,
    UNCHECKED,
)
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.row_widths import row_width_violations

#: tokens each rank's GEMM input must hold a multiple of, per TE FP8 recipe (Megatron-Core's fp8_recipe names) and
#: FP4 recipe (fp4_recipe "nvfp4": 16-token blocks)
FP8_TOKEN_MULTIPLE = {"delayed": 16, "tensorwise": 16, "blockwise": 16, "mxfp8": 32, "nvfp4": 16}


def quantized_recipe(ctx: RuleContext) -> str | None:
    """The TE low-precision recipe of the run: the FP8 recipe, else the FP4 one (Megatron-Core refuses both)."""
    return ctx.fp8_recipe or ctx.fp4_recipe


def _row_split(ctx: RuleContext) -> int:
    """Shards of one packed row: CP, then TP under sequence parallelism."""
    topo = ctx.topology
    return topo.cp * (topo.tp if topo.sequence_parallel and topo.tp > 1 else 1)


def fp8_row_multiple(ctx: RuleContext) -> int:
    """The packed row width multiple the FP8 recipe needs (1 without FP8 or for recipes without a known need)."""
    block = FP8_TOKEN_MULTIPLE.get(quantized_recipe(ctx) or "", 1)
    return block * _row_split(ctx) if block > 1 else 1


@rule(
    "fp8.packed_tokens_per_rank",
    "With FP8 / MXFP8 / NVFP4, each rank's share of a packed row (width / CP / TP under SP) must be a multiple of "
    "16 / 32 / 16.",
    severity=ERROR,
    evidence=(
        "transformer_engine/pytorch/module/linear.py and layernorm_linear.py call utils.assert_dim_for_fp8_exec "
        "(ValueError unless the product of the leading dims is divisible by 8) on the rank-local input; the "
        "wgrad GEMM reduces over those tokens and cuBLASLt asserts 'lda % 16 == 0 ... for FP8 GEMM' "
        "(NovaSky-AI/SkyRL#1828), for every FP8 recipe including blockwise (NVIDIA-NeMo/RL#1884 pads blockwise "
        "packs to 128; only the 8/16 requirement is traced in TE 2.20's code, so 16 is what is enforced); "
        "MXFP8 quantizes in blocks of 32 tokens (tensor/mxfp8_tensor.py "
        "MXFP8Quantizer.is_quantizable, quantizer.cpp 'flat_first_dim % MXFP8_BLOCK_SIZE == 0', "
        "modelscope/ms-swift#9723). NVFP4 (model/mixed_precision fp4 with fp4_recipe 'nvfp4', which the FP8 "
        "field does not show) runs the same FP8 input check and quantizes in blocks of 16 tokens "
        "(tensor/nvfp4_tensor.py NVFP4Quantizer.is_quantizable, quantizer.cpp 'First dim for NVFP4 must be "
        "divisible by 16'). Packed rows are packed_sequence_size or pad_seq_length_to_mult (16) wide, "
        "split by CP and, with sequence parallelism, by TP."
    ),
    reads={
        **TOPOLOGY_READS,
        **DATASET_KWARGS_READS,
        **FP8_ROW_READS,
        "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
        "mixed_precision": UNCHECKED,
    },
)
def packed_tokens_per_rank(ctx: RuleContext) -> list[Violation] | None:
    recipe = quantized_recipe(ctx)
    if ctx.specs is None or ctx.specs.packed_sequence_size <= 0 or recipe not in FP8_TOKEN_MULTIPLE:
        return None
    split = _row_split(ctx)
    need = fp8_row_multiple(ctx)
    return row_width_violations(
        ctx,
        need,
        f"is split into {split} shard(s), each a {recipe}{'' if recipe == 'nvfp4' else ' FP8'} GEMM input of "
        f"width/{split} tokens that must be a multiple of {FP8_TOKEN_MULTIPLE[recipe]}",
    )


@rule(
    "fp8.row_tokens_per_rank",
    "With FP8 / MXFP8 / NVFP4, every micro batch's rank-local tokens (micro batch x row width / CP / TP under SP) "
    "must be a multiple of 16 / 32 / 16 for unpacked and collate-packed rows too.",
    severity=ERROR,
    evidence=(
        "The same Transformer Engine checks as fp8.packed_tokens_per_rank (utils.assert_dim_for_fp8_exec on the "
        "product of the leading dims, cuBLASLt's lda % 16 for the FP8 wgrad GEMM, MXFP8Quantizer / NVFP4Quantizer "
        "block sizes), reached by rows the offline rule does not see: GPT SFT batches padded to "
        "pad_seq_length_to_mult (data/datasets/gpt_sft.py collate_fn), Hugging Face / VLM batches padded to the "
        "collate multiple, and collate-packed THD rows whose length is a sum of sequences each padded only to the "
        "CP/SP multiple (data/packing/in_batch.py build_mcore_thd_sequence_batch_from_rows: run on CPU), which at "
        "CP=1 can be any length."
    ),
    reads={
        **TOPOLOGY_READS,
        **DATASET_KWARGS_READS,
        **FP8_ROW_READS,
        "dataset.defer_in_batch_packing_to_step": BOOL,
        "dataset.enable_in_batch_packing": BOOL,
        "dataset.enable_offline_packing": BOOL,
        "dataset.pad_to_max_length": BOOL,
        "dataset.seq_length": POSITIVE_INT,
        "mixed_precision": UNCHECKED,
        "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
    },
)
def row_tokens_per_rank(ctx: RuleContext) -> list[Violation] | None:
    from mbridge_seqpack.rules.row_widths import row_widths, width_fix

    recipe = quantized_recipe(ctx)
    if recipe not in FP8_TOKEN_MULTIPLE or (ctx.offline_packing and ctx.specs is not None):
        return None  # offline packs: fp8.packed_tokens_per_rank
    widths = row_widths(ctx)
    if widths is None:
        return None
    split = _row_split(ctx)
    need = FP8_TOKEN_MULTIPLE[recipe] * split
    if widths.tokens_divisible(need):
        return []
    per_width = need // math.gcd(need, widths.rows)
    fix = (
        {"dataset.enable_in_batch_packing": False}
        if ctx.in_batch_packing
        else width_fix(ctx, widths.fields, per_width)
    )
    return [
        Violation(
            {
                "train.micro_batch_size": widths.rows if not ctx.in_batch_packing else ctx.train.micro_batch_size,
                **widths.fields,
                "model.context_parallel_size": ctx.topology.cp,
                "model.tensor_model_parallel_size": ctx.topology.tp,
                "model.sequence_parallel": ctx.topology.sequence_parallel,
            },
            f"each micro batch is split into {split} shard(s), each a {recipe} GEMM input whose tokens must be a "
            f"multiple of {FP8_TOKEN_MULTIPLE[recipe]}; these rows are as wide as multiples of "
            f"{' or '.join(str(g) for g in widths.generators)}"
            + (" (collate-packed rows: any sum of sequences)" if ctx.in_batch_packing else ""),
            assignments=fix,
        )
    ]


@rule(
    "fp8.mxfp8_attention_sequence",
    "MXFP8 attention (fp8_dot_product_attention with the MXFP8 recipe) needs every row's rank-local length a "
    "multiple of 128 and head dims a multiple of 32.",
    severity=ERROR,
    evidence=(
        "transformer_engine/pytorch/attention/dot_product_attention/utils.py combine_and_quantize asserts 'MXFP8 "
        "quantization requires s_q % 128 == 0, s_kv % 128 == 0, d_qk % 32 == 0, d_v % 32 == 0' for the BSHD / SBHD "
        "rows MXFP8 attention quantizes (run on CPU); get_attention_backend checks the architecture, cuDNN and the "
        "THD format (packed rows: attention.backend_available), not the length. Each CP rank holds width / CP tokens "
        "of a row."
    ),
    reads={
        **TOPOLOGY_READS,
        **DATASET_KWARGS_READS,
        **FP8_ROW_READS,
        "dataset.enable_offline_packing": BOOL,
        "dataset.seq_length": POSITIVE_INT,
        "mixed_precision": UNCHECKED,
        "mixed_precision.fp8_dot_product_attention": UNCHECKED,
        "model.kv_channels": UNCHECKED,
        "model.multi_latent_attention": UNCHECKED,
        "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
    },
)
def mxfp8_attention_sequence(ctx: RuleContext) -> list[Violation] | None:
    from mbridge_seqpack.rules.row_widths import row_widths, width_fix

    source = ctx.precision_source
    if ctx.fp8_recipe != "mxfp8" or source is None or not getattr(source[1], "fp8_dot_product_attention", False):
        return None
    if ctx.any_packing:
        return None  # THD rows: TE's backend selection refuses MXFP8 attention over them
    widths = row_widths(ctx)
    m = ctx.model
    found = []
    head_dim = getattr(m, "kv_channels", None) or (
        m.hidden_size // m.num_attention_heads if getattr(m, "num_attention_heads", None) else None
    )
    need = 128 * ctx.topology.cp
    if widths is not None and not widths.widths_divisible(need):
        found.append(
            Violation(
                {**widths.fields, "model.context_parallel_size": ctx.topology.cp, f"{source[0]}.fp8_recipe": "mxfp8"},
                f"MXFP8 attention needs each CP rank's share of a row in 128-token blocks: every row width must be a "
                f"multiple of {need}, and these rows are as wide as multiples of "
                f"{' or '.join(str(g) for g in widths.generators)}",
                assignments=width_fix(ctx, widths.fields, need),
            )
        )
    if not getattr(m, "multi_latent_attention", False) and isinstance(head_dim, int) and head_dim % 32:
        found.append(
            Violation(
                {"model.kv_channels": head_dim, f"{source[0]}.fp8_dot_product_attention": True},
                "MXFP8 attention quantizes the head dimension in 32-wide blocks: the first attention asserts",
                assignments={f"{source[0]}.fp8_dot_product_attention": False},
            )
        )
    return found
