"""``eval.*``: the packed validation split the first evaluation samples from (Megatron-Bridge's samplers count
rows)."""

from __future__ import annotations

from typing import Any

from mbridge_seqpack.errors import ERROR, Violation
from mbridge_seqpack.rules.context import (
    BATCH_READS,
    DATASET_KWARGS_READS,
    PACK_FINGERPRINT_READS,
    SPECS,
    TOPOLOGY_READS,
    RuleContext,
)
from mbridge_seqpack.rules.field_types import (
    BOOL,
    OPTIONAL_NAME,
    OPTIONAL_PATH,
    UNCHECKED,
)
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.shared import packed_split_files, parquet_rows


@rule(
    "eval.packed_split_rows",
    "A packed validation split must hold at least one evaluation batch of rows (the global batch for the batch "
    "sampler, micro batch x DP otherwise).",
    severity=ERROR,
    evidence=(
        "megatron/bridge/data/loaders.py builds the validation loader with drop_last (the default) and wraps it in "
        "cyclic_iter, which first iterates at the first evaluation, after eval_interval training steps: "
        "data/samplers.py MegatronPretrainingBatchSampler._active_total_samples asserts 'drop_last=True requires "
        "at least one full global batch' (run on CPU on a packed split), MegatronPretrainingRandomSampler divides "
        "by the rows left after dropping the last partial micro batch x DP (ZeroDivisionError), and "
        "MegatronPretrainingSampler yields nothing (StopIteration). Nothing checks the validation split's size "
        "before that; the training split has its own check at setup."
    ),
    reads={
        **PACK_FINGERPRINT_READS,
        **TOPOLOGY_READS,
        **BATCH_READS,
        **DATASET_KWARGS_READS,
        "dataset.dataloader_type": OPTIONAL_NAME,
        "dataset.dataset_root": UNCHECKED,
        "dataset.do_validation": UNCHECKED,
        "dataset.enable_offline_packing": BOOL,
        "dataset.offline_packing_specs.packed_val_data_path": OPTIONAL_PATH,
        "dataset.offline_packing_specs.tokenizer_model_name": UNCHECKED,
    },
)
def packed_split_rows(ctx: RuleContext) -> list[Violation] | None:
    validation = getattr(ctx.cfg, "validation", None)
    dp = ctx.topology.data_parallel
    eval_iters = getattr(validation, "eval_iters", 0) or 0
    if ctx.specs is None or not ctx.offline_packing or dp is None or eval_iters <= 0:
        return None
    if not getattr(ctx.dataset, "do_validation", True):
        return None
    files = packed_split_files(ctx, "validation")
    rows = parquet_rows(files) if files else None
    if rows is None:
        return None
    gbs = getattr(validation, "eval_global_batch_size", None) or ctx.train.global_batch_size
    mbs = getattr(validation, "eval_micro_batch_size", None) or ctx.train.micro_batch_size
    if gbs is None or mbs is None:
        return None
    sampler = getattr(ctx.dataset, "dataloader_type", None)
    step = mbs * dp
    need = gbs if sampler == "batch" else step
    if rows >= need:
        return []
    fields: dict[str, Any] = {
        f"{SPECS}.packed_val_data_path": str(ctx.specs.packed_val_data_path or files[0]),
        "validation rows": rows,
        "validation.eval_global_batch_size" if sampler == "batch" else "eval micro batch x DP": need,
        "dataset.dataloader_type": sampler,
    }
    if sampler == "batch" and rows >= step:
        fix: dict[str, Any] = {"validation.eval_global_batch_size": rows // step * step}
    else:
        fix = {"validation.eval_iters": 0}
    return [
        Violation(
            fields,
            f"the {sampler} sampler needs {need} validation rows per evaluation batch and the packed split holds "
            f"{rows}: the first evaluation fails, after eval_interval training steps",
            fix="; ".join(f"cfg.{k} = {v!r}" for k, v in fix.items())
            + " (or pack more validation data into the split)",
            assignments=fix,
        )
    ]
