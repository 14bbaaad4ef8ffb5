"""The ``gpt_sft.*`` rule cases (run by ``tests/rules/test_gpt_sft.py``)."""

from __future__ import annotations

from typing import Any, Callable

from tests.support.rule_cases import CP2_LOSS, Case, set_fields


def _drop_kwarg(key: str) -> Callable[[Any, Any], None]:
    def mutate(cfg: Any, tmp_path: Any) -> None:
        cfg.dataset.dataset_kwargs.pop(key)

    return mutate


CASES = [
    Case(
        "gpt_sft.row_width_alignment",
        "unpacked_cfg",
        16,
        set_fields(**{**CP2_LOSS, "model__context_parallel_size": 16}),
        {
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 16,
            "dataset.dataset_kwargs.pad_to_max_length": False,
            "model.context_parallel_size": 16,
            "model.tensor_model_parallel_size": 1,
            "model.sequence_parallel": False,
        },
        {"dataset.dataset_kwargs.pad_seq_length_to_mult": 32},
        base_world=8,
    ),
    Case(
        "gpt_sft.dataset_kwargs_accepted",
        "packed_cfg",
        8,
        set_fields(**{"dataset__dataset_kwargs['add_eso']": True}),
        {"dataset.dataset_kwargs.add_eso": True},
        fix="remove it: ~dataset.dataset_kwargs.add_eso (did you mean 'add_eos'? set it with "
        "++dataset.dataset_kwargs.add_eos=...)",
        repair=_drop_kwarg("add_eso"),
    ),
]
