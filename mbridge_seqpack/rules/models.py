"""Model-feature rules: MTP and per-family packing opt-outs."""

from __future__ import annotations

from mbridge_seqpack.errors import Violation
from mbridge_seqpack.model_family import GLM45, QWEN3_NEXT, QWEN35_VL, detect_model_family
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import rule


def _packing_flags(ctx: RuleContext) -> dict[str, bool]:
    flags = {}
    if ctx.offline_packing:
        flags["dataset.enable_offline_packing"] = True
    if ctx.in_batch_packing:
        flags["dataset.enable_in_batch_packing"] = True
    if ctx.energon_packing:
        flags["dataset.packing_buffer_size"] = ctx.dataset.packing_buffer_size
    return flags


@rule("mtp.no_packing", "Multi-token prediction (mtp_num_layers > 0) is not supported with packed sequences.")
def mtp_no_packing(ctx: RuleContext) -> list[Violation] | None:
    flags = _packing_flags(ctx)
    if ctx.mtp_layers == 0 or not flags:
        return None
    return [
        Violation(
            "mtp.no_packing",
            {"model.mtp_num_layers": ctx.mtp_layers, **flags},
            "MTP rolls labels across the whole row, so in a packed row it predicts the next sequence's tokens "
            "(documented as unsupported for fine-tuning packing)",
            fix="cfg.model.mtp_num_layers = None (or turn packing off: "
            + ", ".join(f"cfg.{k} = {False if isinstance(v, bool) else None!r}" for k, v in flags.items())
            + ")",
            assignments={"model.mtp_num_layers": None},
        )
    ]


@rule("model.offline_packing_opt_out", "Qwen3-Next and GLM-4.5 do not support offline packing.")
def offline_packing_opt_out(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.offline_packing:
        return None
    family = detect_model_family(ctx.model)
    if family not in (QWEN3_NEXT, GLM45):
        return []
    return [
        Violation(
            "model.offline_packing_opt_out",
            {"model": type(ctx.model).__name__, "model family": family, "dataset.enable_offline_packing": True},
            f"Megatron-Bridge ships {family} fine-tuning with offline packing off: packed sequences are not "
            "supported for this family",
            assignments={"dataset.enable_offline_packing": False, "dataset.offline_packing_specs": None},
        )
    ]


@rule("model.in_batch_packing_opt_out", "Qwen3.5-VL does not support in-batch packing.")
def in_batch_packing_opt_out(ctx: RuleContext) -> list[Violation] | None:
    if not ctx.in_batch_packing:
        return None
    family = detect_model_family(ctx.model)
    if family != QWEN35_VL:
        return []
    return [
        Violation(
            "model.in_batch_packing_opt_out",
            {"model": type(ctx.model).__name__, "model family": family, "dataset.enable_in_batch_packing": True},
            "Megatron-Bridge 0.6.2 ships every Qwen3.5-VL recipe with in-batch packing off (its gated-delta-net "
            "layers do not take packed boundaries)",
            assignments={"dataset.enable_in_batch_packing": False},
        )
    ]
