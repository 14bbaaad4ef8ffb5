"""Low-precision (FP8 / MXFP8 / NVFP4) rules for packed rows: what Transformer Engine's quantized GEMMs need of the
token dimension each rank holds."""

from __future__ import annotations

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.offline import row_width_violations
from mbridge_seqpack.rules.registry import rule

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
