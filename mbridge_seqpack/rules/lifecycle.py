"""Packed splits over a run's life: the validation split the first evaluation samples from, and the training split a
resumed run continues in (Megatron-Bridge's samplers count rows, and a checkpoint keeps that count)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import SPECS, RuleContext
from mbridge_seqpack.rules.registry import rule


def packed_split_files(ctx: RuleContext, split: str) -> list[Path]:
    """The existing Parquet files Megatron-Bridge's builder will read for a packed split: the explicit packed path
    (file, directory or glob, as data/packing/paths.py resolves it), else the builder's default location when the
    pack is already there; [] when the pack does not exist yet (the builder makes it at launch), is legacy .npy, or
    is stale for this config (``artifact.fingerprint_mismatch`` reports it, and its rows are not what will train)."""
    from megatron.bridge.data.packing.paths import is_packed_parquet_spec, resolve_packed_parquet_paths

    from mbridge_seqpack.packing.builder_location import builder_location
    from mbridge_seqpack.rules.artifacts import pack_matches_config

    field = {"training": "packed_train_data_path", "validation": "packed_val_data_path"}[split]
    spec = getattr(ctx.specs, field, None)
    if spec is not None:
        if not is_packed_parquet_spec(str(spec)):
            return []
        try:
            files = [Path(p) for p in resolve_packed_parquet_paths(str(spec))]
        except ValueError:
            return []  # artifact.fingerprint_mismatch names it
    else:
        location = builder_location(ctx.cfg)
        path = location.split_path(split) if location is not None else None
        files = [path] if path is not None and path.is_file() else []
    return files if files and pack_matches_config(ctx, split, files) else []


def parquet_rows(files: list[Path]) -> int | None:
    """Rows of the Parquet files (from their footers), or None when one cannot be read."""
    import pyarrow.parquet as pq

    try:
        return sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    except (OSError, ValueError):
        return None


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


def _read_train_state(path: Path) -> Any:
    """A checkpoint's TrainState, read as Megatron-Bridge's read_train_state does without torch.distributed (a config
    check runs on every rank and must not enter its broadcast)."""
    import torch
    from megatron.bridge.training.state import TrainState

    state = TrainState()
    state.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return state


def _checkpoint_train_state(ctx: RuleContext) -> tuple[Any, Path, Path] | None:
    """The train state a launch resumes from (``checkpoint.load``, its ``ckpt_step`` or latest tracker), with the
    state file and the checkpoint's run_config.yaml; None when nothing will be resumed."""
    from megatron.bridge.training.utils.checkpoint_utils import (
        TRACKER_PREFIX,
        get_checkpoint_name,
        get_checkpoint_run_config_filename,
        get_checkpoint_train_state_filename,
    )

    checkpoint = getattr(ctx.cfg, "checkpoint", None)
    load = getattr(checkpoint, "load", None)
    if load is None or getattr(checkpoint, "finetune", False) or not Path(str(load)).is_dir():
        return None
    step = getattr(checkpoint, "ckpt_step", None)
    if step is None:
        tracker = Path(get_checkpoint_train_state_filename(str(load), prefix=TRACKER_PREFIX))
        if not tracker.is_file():
            return None
        step = _read_train_state(tracker).step
    iteration = Path(get_checkpoint_name(str(load), step))
    state_file = Path(get_checkpoint_train_state_filename(str(iteration)))
    if not state_file.is_file():
        return None
    return _read_train_state(state_file), state_file, Path(get_checkpoint_run_config_filename(str(iteration)))


def _specs_then(run_config: Path) -> dict[str, Any]:
    """The offline packing specs the checkpointed run trained with (its run_config.yaml, read as
    read_run_config does without torch.distributed), {} when unknown."""
    import yaml

    if not run_config.is_file():
        return {}
    try:
        then = yaml.safe_load(run_config.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    specs = (then.get("dataset") or {}).get("offline_packing_specs") if isinstance(then, dict) else None
    return specs if isinstance(specs, dict) else {}


@rule(
    "resume.repacked_data",
    "A resumed run reads the packed training split its checkpoint counted rows of.",
    severity=ADVISORY,
    evidence=(
        "megatron/bridge/training/checkpointing.py restores train_state.consumed_train_samples, and "
        "data/loaders.py passes it to the training sampler: data/samplers.py MegatronPretrainingBatchSampler "
        "starts the epoch consumed // rows at row consumed % rows of that epoch's permutation (run on CPU: over a "
        "re-made split rows repeat and others are skipped), MegatronPretrainingSampler asserts 'no samples left to "
        "consume' when the new split is shorter than the count. Nothing records which pack a checkpoint "
        "consumed; a pack re-written after the checkpoint, or packed with other settings than its run_config.yaml, "
        "is continued at a position counted in another pack's rows. Whether that is intended is the user's call: "
        "an advisory."
    ),
)
def repacked_data(ctx: RuleContext) -> list[Violation] | None:
    if ctx.specs is None or not ctx.offline_packing:
        return None
    resumed = _checkpoint_train_state(ctx)
    files = packed_split_files(ctx, "training") if resumed else []
    if not resumed or not files:
        return None
    state, state_file, run_config = resumed
    changes = []
    then = _specs_then(run_config)
    for key in ("packed_sequence_size", "pad_seq_to_mult", "packed_train_data_path"):
        now = getattr(ctx.specs, key, None)
        now = str(now) if isinstance(now, Path) else now
        if key in then and then[key] != now:
            changes.append(f"{key} {then[key]!r} -> {now!r}")
    if max(f.stat().st_mtime for f in files) > state_file.stat().st_mtime:
        changes.append("the pack was written after the checkpoint")
    if not changes:
        return []
    rows = parquet_rows(files)
    return [
        Violation(
            {
                "checkpoint.load": str(ctx.cfg.checkpoint.load),
                "checkpoint step": state.step,
                "consumed_train_samples": state.consumed_train_samples,
                "training rows now": rows,
                "changed since the checkpoint": changes,
            },
            f"the checkpoint counted {state.consumed_train_samples} rows of the pack it trained on; resumed over "
            "another pack, the sampler starts at that count in the new rows: rows of the current epoch are repeated "
            "or skipped",
            fix="resume with the pack the checkpoint trained on, or start the new data as a new fine-tuning run "
            "(checkpoint.finetune=true resets the sample count)",
        )
    ]
