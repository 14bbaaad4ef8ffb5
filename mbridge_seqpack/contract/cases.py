"""The rule cases whose verdict by Megatron-Bridge itself the record keeps: a small GPT SFT config packed offline
at 4096 (global batch 16, world size 8, the tests' ``packed_cfg``), each case one change of it, judged as
``pretrain()``/``finetune()`` judge it (``runtime_config_update``: the data-parallel size, then ``validate()``)
with the plugin's hook not installed. Cases are the ones the rules cite a bare Megatron-Bridge verdict for
(tests/core/test_hook.py, tests/rules/test_rules.py); kept few, as each builds a config."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ValidateCase", "VALIDATE_CASES"]

PACK = 4096


@dataclass(frozen=True)
class ValidateCase:
    name: str
    world: int
    changes: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> str:
        """The case as a reviewer reads it: the world size and the changed fields."""
        changed = " ".join(f"{k}={v!r}" for k, v in self.changes.items())
        return f"packed SFT {PACK}, GBS 16, world {self.world}" + (f", {changed}" if changed else "")

    def build(self) -> Any:
        """The case's config; ``validate()`` on the returned object runs Megatron-Bridge's whole judgement."""
        from mbridge_seqpack.compose.mixins import OfflinePacking, apply
        from mbridge_seqpack.config_paths import set_path
        from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

        cfg = apply(
            sft_base(small_gpt_provider(PACK), seq_length=PACK, global_batch_size=16), OfflinePacking(pack_size=PACK)
        )
        for path, value in self.changes.items():
            set_path(cfg, path, value)
        return _Judged(cfg, self.world)


class _Judged:
    """``validate()`` as ``runtime_config_update`` runs it, at the case's world size."""

    def __init__(self, cfg: Any, world: int) -> None:
        self.cfg, self.world = cfg, world

    def validate(self) -> None:
        from megatron.bridge.training.config import runtime_config_update

        saved = os.environ.get("WORLD_SIZE")
        os.environ["WORLD_SIZE"] = str(self.world)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                runtime_config_update(self.cfg)
        finally:
            if saved is None:
                os.environ.pop("WORLD_SIZE", None)
            else:
                os.environ["WORLD_SIZE"] = saved


CP2_LOSS = {
    "model.context_parallel_size": 2,
    "model.calculate_per_token_loss": True,
    "ddp.average_in_collective": False,
}

VALIDATE_CASES: tuple[ValidateCase, ...] = (
    ValidateCase("base", 8),
    ValidateCase("cp2_per_token_loss_pad1", 8, CP2_LOSS),
    ValidateCase("tp4_world6", 6, {"model.tensor_model_parallel_size": 4}),
    ValidateCase("cp0", 8, {"model.context_parallel_size": 0}),
    ValidateCase("seq_length_over_pack", 8, {"model.seq_length": 2 * PACK, "dataset.seq_length": 2 * PACK}),
)
