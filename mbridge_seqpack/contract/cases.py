"""The rule cases whose verdict by Megatron-Bridge itself the record keeps: a small GPT SFT config packed offline
at 4096 (global batch 16, world size 8), built from each commit's own config classes (:func:`base_config`), each
case one change of it, judged as
``pretrain()``/``finetune()`` judge it (``runtime_config_update``: the data-parallel size, then ``validate()``)
with the plugin's hook not installed. Cases are the ones the rules cite a bare Megatron-Bridge verdict for
(tests/core/test_hook.py, tests/rules/test_<family>.py); kept few, as each builds a config."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

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

    def build(self, find: Callable[..., Any]) -> Any:
        """The case's config; ``validate()`` on the returned object runs Megatron-Bridge's whole judgement.
        ``find`` looks a class up where this commit keeps it (observations.find)."""
        from mbridge_seqpack.config_paths import set_path

        cfg = base_config(find)
        for path, value in self.changes.items():
            set_path(cfg, path, value)
        return _Judged(cfg, self.world)


def _fields(cls: Any, wanted: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``wanted`` this commit's dataclass has (a field a release lacks is left out)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in wanted.items() if k in names}


def base_config(find: Callable[..., Any]) -> Any:
    """The base case, built from this commit's own classes the way its config allows, one way on every commit:
    Megatron-Bridge's SFT defaults (``_sft_common``), the tests' small GPT, the offline SFT dataset config of this
    commit (``GPTSFTDatasetConfig`` from 2026-07-09, ``FinetuningDatasetConfig`` before), offline packing at
    4096 with ``pad_seq_to_mult`` 1 where the commit has it, global batch 16, micro batch 1, the embedded corpus
    and tokenizer (nothing is read: ``validate()`` does not open the data)."""
    from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir, small_gpt_provider

    sft_common = find("megatron.bridge.recipes.common:_sft_common")
    dataset_cls = find(
        "megatron.bridge.data.builders:GPTSFTDatasetConfig", "megatron.bridge.training.config:FinetuningDatasetConfig"
    )
    specs_cls = find(
        "megatron.bridge.data.packing.config:PackedSequenceSpecs",
        "megatron.bridge.data.datasets.packed_sequence:PackedSequenceSpecs",
    )
    cfg = sft_common()
    model = small_gpt_provider(PACK)
    model.seq_length = PACK
    cfg.model = model
    cfg.dataset = dataset_cls(
        **_fields(
            dataset_cls,
            dict(
                seq_length=PACK,
                dataset_root=str(embedded_data_dir()),
                do_validation=True,
                do_test=False,
                dataset_kwargs={},
                seed=5678,
                dataloader_type="batch",
                num_workers=1,
            ),
        )
    )
    specs = specs_cls(**_fields(specs_cls, dict(packed_sequence_size=PACK, pad_seq_to_mult=1)))
    for name in ("offline_packing_specs", "packed_sequence_specs"):
        if hasattr(cfg.dataset, name):
            setattr(cfg.dataset, name, specs)
    if hasattr(cfg.dataset, "enable_offline_packing"):
        cfg.dataset.enable_offline_packing = True
    cfg.tokenizer.tokenizer_model = str(embedded_tokenizer_dir())
    cfg.train.global_batch_size = 16
    cfg.train.micro_batch_size = 1
    cfg.train.train_iters = 1000
    return cfg


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
