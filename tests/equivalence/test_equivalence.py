"""The equivalence check (issue #38): packed and unpacked runs of the same sequences through Megatron-Bridge's and
Megatron-Core's own code, compared per token; its verdicts as rules on real ConfigContainers; each comparison alone
catching its case; the time it takes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mbridge_seqpack import check
from mbridge_seqpack.config_paths import set_path
from tests.support.equivalence_configs import IN_BATCH, VARIABLE, make_router, make_setup

SPECS = "dataset.offline_packing_specs"
KW = "dataset.dataset_kwargs"
TE_NOTE = (
    "Transformer Engine's attention kernel (CUDA only): the check compares TE's reading of the packed cu_seqlens per "
    "sequence instead"
)


MTP = "MTP labels cross a sequence boundary or differ from the unpacked run's"

#: (name, setup changes, findings as (signal, effect)); at least 12 configs across offline / in-batch, pad
#: multiples 1 / 4 / 16, MoE with aux loss / z-loss / expert bias / capacity, MTP, chat with EOS inside turns, CP=2
TABLE: list[tuple[str, dict[str, Any], list[tuple[str, str]]]] = [
    ("offline_pad1_fixed", {}, []),
    ("offline_pad1_variable", VARIABLE, []),
    ("offline_pad4_fixed", {"pad_seq_to_mult": 4}, []),
    ("offline_pad16_variable", {"pad_seq_to_mult": 16, **VARIABLE}, []),
    ("offline_pad1_mtp", {"mtp_layers": 1}, []),
    ("offline_pad4_mtp", {"pad_seq_to_mult": 4, "mtp_layers": 1}, [("mtp", f"13 of 34 {MTP}")]),
    ("offline_pad16_mtp2", {"pad_seq_to_mult": 16, "mtp_layers": 2}, [("mtp", f"35 of 67 {MTP}")]),
    ("offline_chat_eos_in_turns", {"chat": True, "pad_seq_to_mult": 4}, []),
    (
        "offline_chat_full_loss",
        {"chat": True, "answer_only_loss": False},
        [
            ("loss_mask", "9 tokens the unpacked run does not train get loss packed"),
            ("loss", "4 of 5 sequences get another loss sum or token count; the step reports lm loss 1.5 vs 1.462"),
        ],
    ),
    (
        "offline_moe_aux",
        {"router": make_router()},
        [
            (
                "router",
                "27.1% of routed tokens are padding (13 of 48); tokens per expert move by 37.1% of the real load; "
                "load-balancing loss 1.114 vs 1.031 on real tokens only",
            )
        ],
    ),
    ("offline_moe_coeff_without_aux_type", {"router": make_router(load_balancing_type="none")}, []),
    (
        "offline_moe_seq_aux",
        {"router": make_router(load_balancing_type="seq_aux_loss")},
        [
            (
                "router",
                "27.1% of routed tokens are padding (13 of 48); tokens per expert move by 37.1% of the real load; "
                "load-balancing loss 1.114 vs 1.031 on real tokens only",
            )
        ],
    ),
    ("offline_moe_aux_no_padding", {"router": make_router(), "row_mult": 1, **VARIABLE}, []),
    (
        "offline_moe_zloss_bias_capacity_pad4",
        {
            "router": make_router(
                aux_loss_coeff=0.0, z_loss_coeff=0.001, expert_bias=True, score_function="sigmoid", capacity_factor=1.0
            ),
            "pad_seq_to_mult": 4,
        },
        [
            (
                "router",
                "45.3% of routed tokens are padding (29 of 64); tokens per expert move by 43.9% of the real load; "
                "z-loss 8.03 vs 7.554",
            )
        ],
    ),
    ("in_batch_mult1_mtp_moe", {**IN_BATCH, "pad_seq_to_mult": 1, "mtp_layers": 1, "router": make_router()}, []),
    (
        "in_batch_mult2_moe",
        {**IN_BATCH, "pad_seq_to_mult": 2, "router": make_router()},
        [
            (
                "router",
                "4.8% of routed tokens are padding (2 of 42); tokens per expert move by 5.0% of the real load; "
                "load-balancing loss 3.432 vs 3.544 on real tokens only",
            )
        ],
    ),
    ("in_batch_cp2_mult4_mtp", {**IN_BATCH, "pad_seq_to_mult": 4, "cp": 2, "mtp_layers": 1}, []),
    ("offline_cp2_pad4_mtp", {"pad_seq_to_mult": 4, "cp": 2, "mtp_layers": 1}, []),
]


@pytest.fixture(scope="module")
def megatron(megatron_bridge: Any) -> Any:
    return megatron_bridge


@pytest.mark.evidence("equivalence.mtp_labels")
def test_the_issue_example_rolls_across_the_boundary(megatron: Any) -> None:
    """Issue #38's reproduction, by Megatron-Bridge's get_packed_seq_params and Megatron-Core's roll_tensor alone:
    the roll uses the logical cu_seqlens_q, and sequence 2's first token is pulled into sequence 1."""
    import torch
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params
    from megatron.core.transformer.multi_token_prediction import roll_tensor

    tokens = torch.tensor([[11, 12, 13, 14, 2, 2, 2, 21, 22, 23, 24, 25, 26, 2, 2, 2]])
    params = get_packed_seq_params(
        {
            "cu_seqlens_q": torch.tensor([0, 4, 10, 10], dtype=torch.int32),
            "cu_seqlens_q_padded": torch.tensor([0, 7, 14, 16], dtype=torch.int32),
            "max_seqlen_q": 7,
        }
    )
    assert params.cu_seqlens_q.tolist() == [0, 4, 10, 10]
    rolled, _ = roll_tensor(tokens, shifts=-1, dims=-1, packed_seq_params=params)
    assert rolled[0, :10].tolist() == [12, 13, 14, 0, 2, 2, 21, 22, 23, 0]


@pytest.mark.evidence("equivalence.labels", "equivalence.mtp_labels", "equivalence.router_padding")
@pytest.mark.parametrize("name, changes, expected", TABLE, ids=[t[0] for t in TABLE])
def test_packed_against_unpacked(megatron: Any, name: str, changes: dict[str, Any], expected: list) -> None:
    from mbridge_seqpack.equivalence.compare import verdict

    found = verdict(make_setup(**changes))
    assert [(f.signal, f.effect) for f in found.findings] == expected
    assert found.not_run[0] == TE_NOTE
    # CP=2 with MTP: the MTP roll's CP branch (not compared) and TE's partition kernel (a stand-in) are not run here
    assert len(found.not_run) == (3 if changes.get("cp", 1) > 1 else 1)
    assert len(found.undetermined) == (1 if changes.get("cp", 1) > 1 else 0)


def test_mtp_targets_against_the_samples_own_tokens(megatron: Any) -> None:
    """The reference is the sample's own tokens: MTP depth 1 at input position j trains token j+2 of the sample.
    Unpacked (and packed without alignment padding) every position but the last gets it; with pad_seq_to_mult=16
    the packed rows give other targets."""
    from mbridge_seqpack.equivalence.batches import packed_run, unpacked_run
    from mbridge_seqpack.equivalence.sequences import PLAIN
    from mbridge_seqpack.equivalence.signals import token_signals

    truth = [[s.ids[j + 2] for j in range(s.inputs - 1)] for s in PLAIN]
    for changes in ({"mtp_layers": 1}, {"mtp_layers": 1, "pad_seq_to_mult": 16}):
        setup = make_setup(**changes)
        for run in (unpacked_run(setup),) + ((packed_run(setup),) if changes.get("pad_seq_to_mult", 1) == 1 else ()):
            tokens = token_signals(setup, run)
            assert [[t.mtp[0][0] for t in sample[:-1]] for sample in tokens] == truth
            assert all(t.mtp[0][1] for sample in tokens for t in sample[:-1])
    packed = token_signals(
        make_setup(mtp_layers=1, pad_seq_to_mult=16), packed_run(make_setup(mtp_layers=1, pad_seq_to_mult=16))
    )
    got = [[t.mtp[0][0] if t.mtp[0][1] else None for t in sample[:-1]] for sample in packed]
    assert sum(g != w for gs, ws in zip(got, truth) for g, w in zip(gs, ws)) > 0


def _hand_signals(field: str) -> Any:
    """Signals whose packed side differs from the unpacked side in one field of one token (for the comparisons
    no Megatron-Bridge 0.6.2 config here reaches: labels, attention)."""
    from mbridge_seqpack.equivalence.compare import Signals
    from mbridge_seqpack.equivalence.signals import Token

    unpacked = [[Token(label=5, trained=True, offset=0), Token(label=6, trained=True, offset=1)]]
    changed = dataclasses.replace(unpacked[0][1], **{field: {"label": 7, "offset": None}[field]})
    return Signals(make_setup(), [[unpacked[0][0], changed]], unpacked)


MUTANT_CASES = {
    "labels": ("hand", "label"),
    "attention": ("hand", "offset"),
    "loss_mask": ("setup", {"chat": True, "answer_only_loss": False}),
    "mtp": ("setup", {"pad_seq_to_mult": 16, "mtp_layers": 1}),
    "router": ("setup", {"router": make_router()}),
    "loss": ("mutant", {}),
}


def _unmasked_loss(loss_mask: Any, output_tensor: Any, **_: Any) -> Any:
    """A mutant of masked_next_token_loss: no loss-mask multiplication, every position counted."""
    import torch

    losses = output_tensor.reshape(-1).float()
    count = torch.tensor(losses.numel(), dtype=torch.int)
    return losses.sum(), count, {"lm loss": torch.stack([losses.sum(), count.float()])}


@pytest.mark.parametrize("name", list(MUTANT_CASES))
def test_each_comparison_alone_catches_its_case(megatron: Any, name: str) -> None:
    """Removing one comparison from the verdict leaves its case undetected (the mutant): each is needed."""
    from mbridge_seqpack.equivalence import compare

    kind, data = MUTANT_CASES[name]
    # a trained-token difference also moves the loss counts: the loss comparison is left out of the others' cases
    comparisons = tuple(c for c in compare.COMPARISONS if c.__name__ != "loss" or name == "loss")
    without = tuple(c for c in comparisons if c.__name__ != name)
    assert len(without) == len(comparisons) - 1
    if kind == "mutant":
        from mbridge_seqpack.equivalence.batches import packed_run, unpacked_run
        from mbridge_seqpack.equivalence.loss import loss_signal
        from mbridge_seqpack.equivalence.signals import token_signals

        setup = make_setup(pad_seq_to_mult=4, fixed_width=False)
        packed, unpacked = packed_run(setup), unpacked_run(setup)
        signals = compare.Signals(
            setup,
            token_signals(setup, packed),
            token_signals(setup, unpacked),
            loss=(loss_signal(setup, packed, _unmasked_loss), loss_signal(setup, unpacked)),
        )
        assert [f.signal for c in comparisons if (f := c(signals))] == [name]
        assert [c(signals) for c in without] == [None] * len(without)
    elif kind == "hand":
        signals = _hand_signals(data)
        assert [f.signal for c in compare.COMPARISONS if (f := c(signals))] == [name]
        assert [c(signals) for c in without] == [None] * len(without)
    else:
        assert [f.signal for f in compare.verdict(make_setup(**data), comparisons).findings] == [name]
        assert compare.verdict(make_setup(**data), without).findings == ()


# ---- as rules, on real ConfigContainers -----------------------------------------------------------------------
def _apply(cfg: Any, assignments: dict[str, Any]) -> None:
    for path, value in assignments.items():
        set_path(cfg, path, value)


def _ids(found: list) -> list[str]:
    return sorted(v.rule_id for v in found)


def test_mtp_rule_on_padded_packs(packed_cfg: Any) -> None:
    set_path(packed_cfg, "model.mtp_num_layers", 1)
    set_path(packed_cfg, f"{SPECS}.pad_seq_to_mult", 16)
    found = check(packed_cfg, world_size=8)
    assert _ids(found) == ["equivalence.mtp_labels", "mtp.no_packing"]
    (v,) = [v for v in found if v.rule_id == "equivalence.mtp_labels"]
    assert v.severity == "error"
    assert v.fields == {
        "model.mtp_num_layers": 1,
        "dataset.enable_offline_packing": True,
        f"{SPECS}.pad_seq_to_mult": 16,
        f"{SPECS}.pad_cu_seqlens": False,
        f"{KW}.pad_to_max_length": False,
        "measured": f"16 of 34 {MTP}",
    }
    assert v.assignments == {f"{SPECS}.pad_seq_to_mult": 1}
    assert v.fix == f"cfg.{SPECS}.pad_seq_to_mult = 1 (and repack: the pack's sequences carry the alignment padding)"
    assert v.not_run == TE_NOTE
    _apply(packed_cfg, v.assignments)
    assert _ids(check(packed_cfg, world_size=8)) == ["mtp.no_packing"]


def test_mtp_advisory_no_longer_claims_correct_training(packed_cfg: Any) -> None:
    set_path(packed_cfg, "model.mtp_num_layers", 1)
    (v,) = check(packed_cfg, world_size=8)
    assert v.rule_id == "mtp.no_packing"
    assert "trains correctly" not in v.rule and "equivalence.mtp_labels" in v.rule


def test_router_rule_on_packed_moe(packed_cfg: Any) -> None:
    for path, value in {
        "model.num_moe_experts": 4,
        "model.moe_router_topk": 2,
        "model.moe_aux_loss_coeff": 0.01,
    }.items():
        set_path(packed_cfg, path, value)
    found = check(packed_cfg, world_size=8)
    assert _ids(found) == ["equivalence.router_padding"]
    (v,) = found
    assert v.fields == {
        "model.num_moe_experts": 4,
        "router terms": ["moe_aux_loss_coeff"],
        "dataset.enable_offline_packing": True,
        f"{SPECS}.pad_seq_to_mult": 1,
        f"{SPECS}.pad_cu_seqlens": False,
        f"{KW}.pad_to_max_length": False,
        "measured": "27.1% of routed tokens are padding (13 of 48); tokens per expert move by 37.1% of the real "
        "load; load-balancing loss 1.114 vs 1.031 on real tokens only",
    }
    assert v.rule.endswith("this config's rows carry up to 15 tail tokens per row (the width rounds up to 16)")
    assert v.assignments == {f"{KW}.pad_seq_length_to_mult": 1}
    _apply(packed_cfg, v.assignments)
    assert check(packed_cfg, world_size=8) == []


def test_labels_rule_on_chat_full_loss(packed_cfg: Any) -> None:
    packed_cfg.dataset.dataset_kwargs = {"chat": True, "answer_only_loss": False}
    found = check(packed_cfg, world_size=8)
    assert _ids(found) == ["equivalence.labels"]
    (v,) = found
    assert v.fields[f"{KW}.answer_only_loss"] is False
    assert v.fields["measured"] == (
        "9 tokens the unpacked run does not train get loss packed; 4 of 5 sequences get another loss sum or token "
        "count; the step reports lm loss 1.5 vs 1.462"
    )
    assert v.assignments == {f"{KW}.answer_only_loss": True}
    _apply(packed_cfg, v.assignments)
    assert check(packed_cfg, world_size=8) == []


def test_a_difference_in_the_reduced_loss_alone_is_a_violation_not_a_crash(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted bug in Megatron-Bridge's masked_next_token_loss that only its reported "lm loss" shows (it counts
    every position of the micro batch, padding too): every token trains the same, so no finding has a per-token
    example; the violation says what differs (this raised StopIteration out of check() and the hook)."""
    import torch
    from megatron.bridge.training import losses

    from mbridge_seqpack.equivalence.compare import forget_verdicts

    real = losses.masked_next_token_loss

    def padding_reported(loss_mask: Any, output_tensor: Any, **kwargs: Any) -> Any:
        loss, count, report = real(loss_mask, output_tensor, **kwargs)
        return loss, count, {"lm loss": torch.stack([report["lm loss"][0], torch.tensor(float(loss_mask.numel()))])}

    monkeypatch.setattr(losses, "masked_next_token_loss", padding_reported)
    forget_verdicts()
    try:
        packed_cfg.dataset.offline_packing_specs.pad_seq_to_mult = 4
        (v,) = check(packed_cfg, world_size=8)
    finally:
        forget_verdicts()
    assert v.rule_id == "equivalence.labels"
    assert v.fields["measured"] == "the step reports lm loss 0.7839 vs 0.4703"
    assert (
        v.rule
        == "the step reports lm loss 0.7839 vs 0.4703: packed training does not train what unpacked training trains"
    )


def test_the_check_is_cached_and_fast(packed_cfg: Any, capsys: pytest.CaptureFixture) -> None:
    """Inside validate(): each distinct config pays once (the cache key is the fields that decide the verdict)."""
    from mbridge_seqpack.equivalence.compare import forget_verdicts
    from mbridge_seqpack.rules import equivalence

    forget_verdicts()
    equivalence.timings.clear()
    set_path(packed_cfg, "model.mtp_num_layers", 1)
    set_path(packed_cfg, "model.num_moe_experts", 4)
    set_path(packed_cfg, "model.moe_aux_loss_coeff", 0.01)
    check(packed_cfg, world_size=8)
    check(packed_cfg, world_size=8)
    assert len(equivalence.timings) == 1  # the second check is a cache hit
    with capsys.disabled():
        print(f"\nequivalence check inside validate(): {equivalence.timings[0] * 1000:.0f} ms for a new config")
    assert equivalence.timings[0] < 2.0
