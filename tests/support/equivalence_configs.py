"""The equivalence check's setups for tests and the docs' table: a base ``Setup`` changed per case, and the configs
the check passes (packed == unpacked on every signal), across offline / in-batch packing, pad multiples 1 / 4 / 16,
MoE with aux loss / z-loss / expert bias, MTP, chat with EOS inside turns and CP=2 in a CPU world
(``scripts/equivalence_table.py`` runs them for docs/equivalence.md; tests/equivalence/test_equivalence_loss.py
asserts them)."""

from __future__ import annotations

import dataclasses
from typing import Any

VARIABLE = {"fixed_width": False, "pad_cu_seqlens": False}
IN_BATCH = {"mode": "in_batch", "micro_batch": 2, "pad_cu_seqlens": False, "fixed_width": False, "row_mult": 1}
IN_BATCH |= {"chat": True}


def make_router(**changes: Any) -> Any:
    """A 4-expert top-2 softmax router with an aux loss, changed by ``changes``."""
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
    """An offline pack at pad_seq_to_mult=1, full-width rows, prompt / answer data, CP 1, changed by ``changes``."""
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


def _zloss_bias() -> Any:
    return make_router(aux_loss_coeff=0.0, z_loss_coeff=0.001, expert_bias=True, score_function="sigmoid")


#: CP>1 fine-tuning needs calculate_per_token_loss (ConfigContainer.validate, training/config.py:1452)
_CP2 = {"cp": 2, "per_token_loss": True}

#: (name, setup changes): configs the check passes; each packed == unpacked on every signal it compares
PASSING: list[tuple[str, dict[str, Any]]] = [
    ("offline_pad1_fixed", {}),
    ("offline_pad1_variable", VARIABLE),
    ("offline_pad4_fixed", {"pad_seq_to_mult": 4}),
    ("offline_pad4_variable", {"pad_seq_to_mult": 4, **VARIABLE}),
    ("offline_pad16_fixed", {"pad_seq_to_mult": 16}),
    ("offline_pad16_variable", {"pad_seq_to_mult": 16, **VARIABLE}),
    ("offline_pad1_mtp", {"mtp_layers": 1}),
    ("offline_pad1_mtp2_variable", {"mtp_layers": 2, **VARIABLE}),
    ("offline_chat_eos_in_turns_pad1", {"chat": True}),
    ("offline_chat_eos_in_turns_pad4", {"chat": True, "pad_seq_to_mult": 4}),
    ("offline_chat_eos_in_turns_pad16", {"chat": True, "pad_seq_to_mult": 16, **VARIABLE}),
    ("offline_moe_aux_no_padding", {"router": make_router(), "row_mult": 1, **VARIABLE}),
    ("offline_moe_zloss_bias_no_padding", {"router": _zloss_bias(), "row_mult": 1, **VARIABLE}),
    ("offline_moe_aux_type_none", {"router": make_router(load_balancing_type="none")}),
    ("in_batch_mult1", {**IN_BATCH, "pad_seq_to_mult": 1}),
    ("in_batch_mult1_mtp_moe_aux", {**IN_BATCH, "pad_seq_to_mult": 1, "mtp_layers": 1, "router": make_router()}),
    ("in_batch_mult1_moe_zloss_bias", {**IN_BATCH, "pad_seq_to_mult": 1, "router": _zloss_bias()}),
    ("in_batch_mult4", {**IN_BATCH, "pad_seq_to_mult": 4}),
    ("in_batch_mult16", {**IN_BATCH, "pad_seq_to_mult": 16}),
    ("offline_cp2_pad4", {"pad_seq_to_mult": 4, **_CP2}),
    ("offline_cp2_pad16_chat", {"pad_seq_to_mult": 16, "chat": True, **VARIABLE, **_CP2}),
    ("in_batch_cp2_mult4", {**IN_BATCH, "pad_seq_to_mult": 4, **_CP2}),
    ("in_batch_cp2_mult4_mtp", {**IN_BATCH, "pad_seq_to_mult": 4, "mtp_layers": 1, **_CP2}),
]


def compared(found: Any) -> list[str]:
    """The signals the check compared for a verdict's setup, in words."""
    s = found.setup
    out = ["labels", "loss mask", "attention span", "loss per sequence and reduced"]
    if s.mtp_layers and s.cp == 1:
        out.append(f"MTP labels (depth {s.mtp_layers})")
    if s.router is not None and s.router.counting_terms:
        out.append("router counts (" + ", ".join(t.removeprefix("moe_") for t in s.router.counting_terms) + ")")
    if s.cp > 1:
        out.append(f"per CP rank ({s.cp} gloo processes): tokens held, labels, masks, loss contributions, CP loss")
    return out
