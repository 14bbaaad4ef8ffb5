"""The ``cp.*`` rule cases (run by ``tests/rules/test_cp.py``)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from tests.support.rule_cases import CP2_LOSS, Case, seq_lengths, set_fields


def _cp(n: int) -> Callable[[Any, Any], None]:
    """Context parallelism ``n`` with every field that follows from it derived (compose/derive.py)."""

    def mutate(cfg: Any, tmp_path: Any) -> None:
        from mbridge_seqpack.compose.mixins import derive

        cfg.model.context_parallel_size = n
        derive(cfg)

    return mutate


def _old_mcore(monkeypatch: pytest.MonkeyPatch) -> None:
    from mbridge_seqpack.rules import cp

    monkeypatch.setattr(cp, "_mcore_version", lambda: (0, 17, 1))


def _eval_cp(cfg: Any, tmp_path: Any) -> None:
    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import ContextParallel

    apply(cfg, ContextParallel(2))
    cfg.dist.eval_context_parallel_size = 4


CASES = [
    Case(
        "cp.seq_length_divisible",
        "unpacked_cfg",
        8,
        set_fields(**CP2_LOSS, **seq_lengths(4094)),
        {"model.seq_length": 4094, "model.context_parallel_size": 2},
        {"model.seq_length": 4096, "dataset.seq_length": 4096},
    ),
    Case(
        "cp.finetune_per_token_loss",
        "unpacked_cfg",
        8,
        set_fields(**{**CP2_LOSS, "model__calculate_per_token_loss": False}),
        {"model.calculate_per_token_loss": False, "model.context_parallel_size": 2},
        {"model.calculate_per_token_loss": True},
    ),
    Case(
        "cp.finetune_average_in_collective",
        "unpacked_cfg",
        8,
        set_fields(**{**CP2_LOSS, "ddp__average_in_collective": True}),
        {"ddp.average_in_collective": True, "model.context_parallel_size": 2},
        {"ddp.average_in_collective": False},
    ),
    Case(
        "cp.hierarchical_sizes_required",
        "unpacked_cfg",
        16,
        set_fields(**{**CP2_LOSS, "model__context_parallel_size": 16}, model__cp_comm_type="a2a+p2p"),
        {"model.cp_comm_type": "a2a+p2p", "model.hierarchical_context_parallel_sizes": None},
        {"model.hierarchical_context_parallel_sizes": [4, 4]},  # 12 heads: the a2a level must divide them
        also=("gpt_sft.row_width_alignment",),  # unpacked rows padded to 16 cannot split over CP 16
    ),
    Case(
        "cp.hierarchical_sizes_product",
        "unpacked_cfg",
        8,
        set_fields(
            **{**CP2_LOSS, "model__context_parallel_size": 8},
            model__cp_comm_type="a2a+p2p",
            model__hierarchical_context_parallel_sizes=[2, 2],
        ),
        {"model.hierarchical_context_parallel_sizes": [2, 2], "model.context_parallel_size": 8},
        {"model.hierarchical_context_parallel_sizes": [4, 2]},
    ),
    Case(
        "cp.sliding_window_comm_type",
        "packed_cfg",
        8,
        set_fields(
            **CP2_LOSS,
            model__window_size=(512, 0),
            model__attention_dropout=0.0,  # TE's FusedAttention takes windows without dropout only
            dataset__offline_packing_specs__pad_seq_to_mult=4,
        ),
        {
            "model.window_size": [512, 0],
            "model.cp_comm_type": None,
            "model.context_parallel_size": 2,
            "sliding-window layers": 12,
        },
        {"model.cp_comm_type": "all_gather"},
    ),
    Case(
        "cp.softmax_type_comm_type",
        "packed_cfg",
        8,
        # a sink over THD needs cuDNN >= 9.26 for its backward (cudnn-frontend's ragged + sink rule): declared,
        # else attention.backend_available is not determined across the cuDNN versions TE gates on
        set_fields(**CP2_LOSS, model__softmax_type="off-by-one", dataset__offline_packing_specs__pad_seq_to_mult=4),
        {"model.softmax_type": "off-by-one", "model.cp_comm_type": None, "model.context_parallel_size": 2},
        {"model.cp_comm_type": "a2a"},
        patch=lambda mp: mp.setenv("MBRIDGE_SEQPACK_CUDNN_VERSION", "9.26.0"),
    ),
    Case(
        "cp.a2a_heads_divisible",
        "packed_cfg",
        8,
        set_fields(
            **{**CP2_LOSS, "model__context_parallel_size": 4},
            model__num_query_groups=2,
            model__cp_comm_type="a2a",
            dataset__offline_packing_specs__pad_seq_to_mult=8,
        ),
        {
            "model.num_attention_heads": 12,
            "model.num_query_groups": 2,
            "model.tensor_model_parallel_size": 1,
            "model.cp_comm_type": "a2a",
            "a2a group size": 4,
        },
        {"model.cp_comm_type": "p2p"},
    ),
    Case(
        "cp.hybrid_context_parallel",
        "pretrain_cfg",
        8,
        set_fields(model__hybrid_context_parallel=True),
        {"model.hybrid_context_parallel": True, "model.pipeline_model_parallel_size": 1},
        {"model.hybrid_context_parallel": False},
    ),
    Case(
        "cp.comm_type_known",
        "packed_cfg",
        8,
        set_fields(**CP2_LOSS, dataset__offline_packing_specs__pad_seq_to_mult=4, model__cp_comm_type="allgather"),
        {"model.cp_comm_type": "allgather", "model.context_parallel_size": 2},
        {"model.cp_comm_type": "all_gather"},
    ),
    Case(
        "cp.thd_mcore_version",
        "packed_cfg",
        8,
        _cp(2),
        {"megatron.core.__version__": "0.17.1", "model.context_parallel_size": 2},
        fix="pip install 'megatron-core>=0.18' (or set cfg.model.context_parallel_size = 1)",
        patch=_old_mcore,
        repair=_cp(1),
    ),
    Case(
        "cp.eval_cp_has_no_effect",
        "packed_cfg",
        8,
        _eval_cp,
        {"dist.eval_context_parallel_size": 4, "model.context_parallel_size": 2},
        {"dist.eval_context_parallel_size": None},
    ),
]
