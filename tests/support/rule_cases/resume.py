"""The ``resume.*`` rule cases (run by ``tests/rules/test_resume.py``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.support.rule_cases import Case, set_fields


def _checkpoint_before_the_pack(cfg: Any, tmp_path: Any) -> None:
    """A checkpoint as Megatron-Bridge writes one, older than the pack the config reads."""
    from tests.support.checkpoints import write_checkpoint

    local = write_checkpoint(cfg, tmp_path / "ckpt", step=10, consumed=80)
    pack = Path(cfg.dataset.offline_packing_specs.packed_train_data_path).parent
    oldest = min(p.stat().st_mtime for p in pack.glob("*.parquet")) - 60
    os.utime(local, (oldest, oldest))


CASES = [
    Case(
        "resume.repacked_data",
        "pack_cfg",
        8,
        _checkpoint_before_the_pack,
        lambda cfg, tmp_path: {
            "checkpoint.load": str(tmp_path / "ckpt"),
            "checkpoint step": 10,
            "consumed_train_samples": 80,
            "training rows now": 40,
            "changed since the checkpoint": ["the pack was written after the checkpoint"],
        },
        repair=set_fields(checkpoint__finetune=True),
    ),
]
