"""Equivalence-check setups and routers with fields changed, and the packing modes they name (shared by the
equivalence tests)."""

from __future__ import annotations

import dataclasses
from typing import Any


def make_router(**changes: Any) -> Any:
    """A softmax top-2 router over four experts with aux loss, ``changes`` applied."""
    from mbridge_seqpack.equivalence.setup import Router

    base = Router(
        experts=4,
        topk=2,
        score_function="softmax",
        load_balancing_type="aux_loss",
        aux_loss_coeff=0.01,
        z_loss_coeff=None,
        expert_bias=False,
        capacity_factor=None,
        drop_policy="probs",
        pad_to_capacity=False,
        num_groups=None,
        group_topk=None,
        pre_softmax=False,
        topk_scaling_factor=None,
        per_token_loss=False,
    )
    return dataclasses.replace(base, **changes)


def make_setup(**changes: Any) -> Any:
    """An offline, fixed-width, answer-only setup on one micro batch, ``changes`` applied."""
    from mbridge_seqpack.equivalence.setup import Setup

    base = dict(
        mode="offline",
        pad_seq_to_mult=1,
        pad_cu_seqlens=True,
        fixed_width=True,
        row_mult=16,
        answer_only_loss=True,
        chat=False,
        micro_batch=1,
        cp=1,
        mtp_layers=0,
        mtp_loss_scale=0.1,
        per_token_loss=False,
        router=None,
    )
    return Setup(**{**base, **changes})


VARIABLE = {"fixed_width": False, "pad_cu_seqlens": False}
IN_BATCH = {"mode": "in_batch", "micro_batch": 2, "pad_cu_seqlens": False, "fixed_width": False, "row_mult": 1}
IN_BATCH |= {"chat": True}
