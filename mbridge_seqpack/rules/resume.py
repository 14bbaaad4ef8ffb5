"""``resume.*``: the packed training split a resumed run continues in (a checkpoint keeps the sampler's row
count)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mbridge_seqpack.errors import ADVISORY, Violation
from mbridge_seqpack.rules.context import PACK_FINGERPRINT_READS, RuleContext
from mbridge_seqpack.rules.field_types import (
    BOOL,
    OPTIONAL_PATH,
    UNCHECKED,
)
from mbridge_seqpack.rules.registry import rule
from mbridge_seqpack.rules.shared import packed_split_files, parquet_rows


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
    reads={
        **PACK_FINGERPRINT_READS,
        "checkpoint.ckpt_step": UNCHECKED,
        "checkpoint.finetune": UNCHECKED,
        "checkpoint.load": OPTIONAL_PATH,
        "dataset.enable_offline_packing": BOOL,
        "dataset.offline_packing_specs.packed_train_data_path": OPTIONAL_PATH,
    },
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
