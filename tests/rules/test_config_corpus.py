"""A held-out-style corpus of good and bad configs, written the way users write them: Hydra-style overrides
and YAML files through Megatron-Bridge's own ``process_config_with_overrides``, and ``ConfigContainer``
subclasses. Each row names exactly the error-level rules that must fire (none for the good ones)."""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any

import pytest

import mbridge_seqpack
from mbridge_seqpack import PackingConfigError, check

pytestmark = pytest.mark.slow

CP2_OK = ["model.context_parallel_size=2", "model.calculate_per_token_loss=true", "ddp.average_in_collective=false"]

CORPUS: list[tuple[str, int, list[str], str | None, list[str]]] = [
    # name, world size, overrides, YAML, expected error rule ids
    ("as built", 8, [], None, []),
    (
        "tp8 sp cp1 pad 1",
        8,
        [
            "model.tensor_model_parallel_size=8",
            "model.num_attention_heads=16",
            "model.num_query_groups=8",
            "model.sequence_parallel=true",
        ],
        None,
        [],
    ),
    ("cp2 done right", 8, CP2_OK + ["dataset.offline_packing_specs.pad_seq_to_mult=4"], None, []),
    (
        "row multiple added with +",
        8,
        [
            "model.tensor_model_parallel_size=4",
            "model.sequence_parallel=true",
            "+dataset.dataset_kwargs.pad_seq_length_to_mult=8",
        ],
        None,
        [],
    ),
    ("cp2 the way Megatron-Bridge's messages ask", 8, CP2_OK, None, ["offline.alignment_multiple"]),
    (
        "cp2 alone",
        8,
        ["model.context_parallel_size=2"],
        None,
        ["cp.finetune_per_token_loss", "offline.alignment_multiple"],
    ),
    (
        "micro batch 2",
        8,
        ["train.micro_batch_size=2", "train.global_batch_size=32"],
        None,
        ["offline.micro_batch_one"],
    ),
    ("quoted multiple", 8, ["dataset.offline_packing_specs.pad_seq_to_mult='4'"], None, ["config.types"]),
    ("global batch 12", 8, ["train.global_batch_size=12"], None, ["batch.global_batch_divisible"]),
    (
        "pad_cu_seqlens without fixed width",
        8,
        ["dataset.offline_packing_specs.pad_cu_seqlens=true"],
        None,
        ["cuda_graphs.pad_cu_seqlens_needs_fixed_width"],
    ),
    ("dataset shorter than model", 8, ["dataset.seq_length=2048"], None, ["seq_length.model_matches_dataset"]),
    (
        "tp32 sp variable rows",
        32,
        ["model.tensor_model_parallel_size=32", "model.sequence_parallel=true", "train.global_batch_size=32"],
        None,
        ["offline.row_width_alignment"],
    ),
    (
        "single longer than pack",
        8,
        ["dataset.offline_packing_specs.max_single_sequence_length=8192"],
        None,
        ["offline.max_single_within_pack"],
    ),
    (
        "eval cp 4 from YAML",
        8,
        CP2_OK + ["dataset.offline_packing_specs.pad_seq_to_mult=4"],
        "dist:\n  eval_context_parallel_size: 4\n",
        [],  # evaluation runs at the training CP in 0.6.2: advisory cp.eval_cp_has_no_effect only
    ),
    (
        "odd multiple from YAML",
        8,
        [],
        "model:\n  context_parallel_size: 2\n  calculate_per_token_loss: true\n"
        "dataset:\n  offline_packing_specs:\n    pad_seq_to_mult: 3\n",
        ["offline.alignment_multiple"],
    ),
    (
        "null multiple from YAML",
        8,
        [],
        "dataset:\n  offline_packing_specs:\n    pad_seq_to_mult: null\n",
        ["config.types"],
    ),
]


def _load(base: Any, overrides: list[str], yaml_text: str | None, tmp_path: Any) -> Any:
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    path = None
    if yaml_text is not None:
        path = tmp_path / "override.yaml"
        path.write_text(yaml_text)
    return process_config_with_overrides(
        copy.deepcopy(base), config_filepath=str(path) if path else None, cli_overrides=overrides
    )


@pytest.mark.parametrize("name, world, overrides, yaml_text, expected", CORPUS, ids=[c[0] for c in CORPUS])
def test_corpus(
    packed_cfg: Any,
    tmp_path: Any,
    name: str,
    world: int,
    overrides: list[str],
    yaml_text: str | None,
    expected: list[str],
) -> None:
    cfg = _load(packed_cfg, overrides, yaml_text, tmp_path)
    errors = sorted({v.rule_id for v in check(cfg, world_size=world) if v.severity == "error"})
    assert errors == sorted(expected)


def test_config_container_subclass_is_hooked(packed_cfg: Any) -> None:
    from megatron.bridge.training.config import ConfigContainer, runtime_config_update

    @dataclasses.dataclass(kw_only=True)
    class MyContainer(ConfigContainer):
        note: str = "team recipe"

    cfg = MyContainer(**{f.name: getattr(packed_cfg, f.name) for f in dataclasses.fields(ConfigContainer) if f.init})
    cfg.model.context_parallel_size = 2
    os.environ["WORLD_SIZE"] = "8"
    try:
        with mbridge_seqpack.install(), pytest.raises(PackingConfigError) as info:
            runtime_config_update(cfg)
    finally:
        os.environ.pop("WORLD_SIZE")
    assert info.value.rule_ids == ["cp.finetune_per_token_loss", "offline.alignment_multiple"]
