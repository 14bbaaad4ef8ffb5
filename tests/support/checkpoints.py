"""A checkpoint as Megatron-Bridge writes one, for the rules that read what a run resumes from."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch


def write_checkpoint(cfg: Any, root: Path, *, step: int, consumed: int) -> Path:
    """The train state at ``step`` (``consumed`` samples), its ``latest`` copy and the iteration's run_config.yaml,
    under ``root``, as training/checkpointing.py save_checkpoint leaves them; ``cfg.checkpoint.load`` points there.
    Returns the iteration's train-state file (its mtime is when the checkpoint was taken)."""
    from megatron.bridge.training.state import TrainState
    from megatron.bridge.training.utils.checkpoint_utils import (
        get_checkpoint_name,
        get_checkpoint_run_config_filename,
        get_checkpoint_train_state_filename,
    )

    cfg.checkpoint.load = str(root)
    state = TrainState()
    state.step, state.consumed_train_samples = step, consumed
    iteration = Path(get_checkpoint_name(str(root), step))
    iteration.mkdir(parents=True)
    local = get_checkpoint_train_state_filename(str(iteration))
    torch.save(state.state_dict(), local)  # checkpointing.py save_checkpoint's train_state_finalize_fn
    shutil.copy(local, get_checkpoint_train_state_filename(str(root), prefix="latest"))
    cfg.to_yaml(get_checkpoint_run_config_filename(str(iteration)))
    return Path(local)
