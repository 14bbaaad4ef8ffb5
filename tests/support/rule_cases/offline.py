"""The ``offline.*`` rule cases (run by ``tests/rules/test_offline.py``)."""

from __future__ import annotations

from typing import Any

from tests.support.rule_cases import CP2_LOSS, KW, SPECS, Case, seq_lengths, set_fields


def _specs_repair(cfg: Any, tmp_path: Any) -> None:
    from megatron.bridge.data.packing.config import PackedSequenceSpecs

    cfg.dataset.offline_packing_specs = PackedSequenceSpecs(packed_sequence_size=4096, pad_seq_to_mult=1)


CASES = [
    Case(
        "offline.specs_required",
        "packed_cfg",
        8,
        set_fields(**{SPECS.replace(".", "__"): None}),
        {"dataset.enable_offline_packing": True, SPECS: None},
        fix=f"cfg.{SPECS} = PackedSequenceSpecs(packed_sequence_size=4096, pad_seq_to_mult=1)",
        repair=_specs_repair,
    ),
    Case(
        "offline.flag_required",
        "packed_cfg",
        8,
        set_fields(dataset__enable_offline_packing=False),
        {"dataset.enable_offline_packing": False, SPECS: "PackedSequenceSpecs"},
        fix=f"cfg.dataset.enable_offline_packing = True (or cfg.{SPECS} = None to train unpacked)",
        repair=set_fields(dataset__enable_offline_packing=True),
    ),
    Case(
        "offline.micro_batch_one",
        "packed_cfg",
        8,
        set_fields(train__micro_batch_size=2),
        {"train.micro_batch_size": 2, "train.global_batch_size": 16},
        {"train.micro_batch_size": 1},
        fix="cfg.train.micro_batch_size = 1 (global_batch_size then counts 16 packed rows of 4096); to keep the "
        "row count and tokens of one micro batch instead, also set cfg.train.global_batch_size = 8 and pack "
        "to 8192 (model/dataset seq_length and packed_sequence_size = 8192)",
    ),
    Case(
        "offline.pack_size_positive",
        "packed_cfg",
        8,
        set_fields(dataset__offline_packing_specs__packed_sequence_size=0),
        {f"{SPECS}.packed_sequence_size": 0},
        {f"{SPECS}.packed_sequence_size": 4096},
    ),
    Case(
        "offline.pack_size_matches_seq_length",
        "packed_cfg",
        8,
        set_fields(dataset__offline_packing_specs__packed_sequence_size=2048),
        {f"{SPECS}.packed_sequence_size": 2048, "model.seq_length": 4096, "dataset.seq_length": 4096},
        {f"{SPECS}.packed_sequence_size": 4096, "dataset.seq_length": 4096},
    ),
    Case(
        "offline.max_single_within_pack",
        "packed_cfg",
        8,
        set_fields(dataset__offline_packing_specs__max_single_sequence_length=8192),
        {f"{SPECS}.max_single_sequence_length": 8192, f"{SPECS}.packed_sequence_size": 4096},
        {f"{SPECS}.max_single_sequence_length": 4096},
    ),
    Case(
        "offline.alignment_multiple",
        "packed_cfg",
        8,
        set_fields(**CP2_LOSS),
        {f"{SPECS}.pad_seq_to_mult": 1, "model.context_parallel_size": 2},
        {f"{SPECS}.pad_seq_to_mult": 4},
    ),
    Case(
        "offline.row_width_alignment",
        "packed_cfg",
        8,
        set_fields(
            model__tensor_model_parallel_size=4,
            model__sequence_parallel=True,
            **{"dataset__dataset_kwargs['pad_to_max_length']": True},
            **seq_lengths(4094, packed=True),
        ),
        {
            f"{SPECS}.packed_sequence_size": 4094,
            KW: True,
            "model.context_parallel_size": 1,
            "model.tensor_model_parallel_size": 4,
            "model.sequence_parallel": True,
        },
        {f"{SPECS}.packed_sequence_size": 4096, "model.seq_length": 4096, "dataset.seq_length": 4096},
    ),
    Case(
        "offline.row_width_alignment",
        "packed_cfg",
        32,
        set_fields(model__tensor_model_parallel_size=32, model__sequence_parallel=True, train__global_batch_size=32),
        {
            f"{SPECS}.packed_sequence_size": 4096,
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 16,
            KW: False,
            "model.context_parallel_size": 1,
            "model.tensor_model_parallel_size": 32,
            "model.sequence_parallel": True,
        },
        {"dataset.dataset_kwargs.pad_seq_length_to_mult": 32},
        base_world=8,
    ),
    Case(
        "offline.eval_micro_batch_one",
        "packed_cfg",
        8,
        set_fields(validation__eval_micro_batch_size=2, validation__eval_global_batch_size=32),
        {"validation.eval_micro_batch_size": 2, "validation.eval_global_batch_size": 32},
        {"validation.eval_micro_batch_size": 1},
    ),
]
