"""The loss signal of the equivalence check (issue #38): Megatron-Bridge's masked_next_token_loss and Megatron-Core's
forward_step_calc_loss over the packed and unpacked micro batches, per sequence and as the step reduces it, with
calculate_per_token_loss on and off; a mutant of the loss path fails; configs the check passes, packed == unpacked
on every signal."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.support.equivalence_configs import IN_BATCH, PASSING, make_setup


@pytest.fixture(scope="module")
def megatron(megatron_bridge: Any) -> Any:
    return megatron_bridge


def _signals(setup: Any, loss_fn: Any = None) -> Any:
    from mbridge_seqpack.equivalence.batches import packed_run, unpacked_run
    from mbridge_seqpack.equivalence.loss import loss_signal

    return loss_signal(setup, packed_run(setup), loss_fn), loss_signal(setup, unpacked_run(setup))


def _unmasked(loss_mask: Any, output_tensor: Any, **_: Any) -> Any:
    """Mutant: the loss-mask multiplication dropped (padding and prompts get loss)."""
    import torch

    losses = output_tensor.reshape(-1).float()
    count = torch.tensor(losses.numel(), dtype=torch.int)
    return losses.sum(), count, {"lm loss": torch.stack([losses.sum(), count.float()])}


def _padding_counted(loss_mask: Any, output_tensor: Any, **kwargs: Any) -> Any:
    """Mutant: the masked sum kept, but the token count counts every position (padding included)."""
    import torch
    from megatron.bridge.training.losses import masked_next_token_loss

    loss, _, _ = masked_next_token_loss(loss_mask, output_tensor, **kwargs)
    count = torch.tensor(loss_mask.numel(), dtype=torch.int)
    return loss, count, {"lm loss": torch.stack([loss.detach(), count.float()])}


@pytest.mark.parametrize("per_token", [False, True])
def test_counts_are_the_samples_answer_tokens(megatron: Any, per_token: bool) -> None:
    """Per sequence the token count masked_next_token_loss gives is the sample's own trained labels (its answer
    tokens after the first position), packed and unpacked; sums and the reported loss agree."""
    from mbridge_seqpack.equivalence.sequences import PLAIN

    packed, unpacked = _signals(make_setup(pad_seq_to_mult=4, per_token_loss=per_token))
    truth = [sum(s.answer[1:]) for s in PLAIN]
    assert [c for _, c in packed.per_sample] == truth == [c for _, c in unpacked.per_sample]
    assert [round(s, 6) for s, _ in packed.per_sample] == [round(s, 6) for s, _ in unpacked.per_sample]
    assert packed.reported == pytest.approx(unpacked.reported, rel=1e-6)
    assert packed.reported == pytest.approx(sum(s for s, _ in unpacked.per_sample) / sum(truth), rel=1e-6)
    if per_token:  # the global token mean either way
        assert packed.backward == pytest.approx(packed.reported, rel=1e-6)
        assert unpacked.backward == pytest.approx(unpacked.reported, rel=1e-6)


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize(
    "mutant, expected",
    [
        (_unmasked, "sequences get another loss sum or token count"),
        (_padding_counted, "sequences get another loss sum or token count"),
    ],
    ids=["no_mask_multiplication", "padding_counted"],
)
@pytest.mark.parametrize(
    "changes", [{"pad_seq_to_mult": 4}, {**IN_BATCH, "pad_seq_to_mult": 4}], ids=["offline", "in_batch"]
)
def test_a_mutant_of_the_loss_path_fails(
    megatron: Any, per_token: bool, mutant: Any, expected: str, changes: dict[str, Any]
) -> None:
    from mbridge_seqpack.equivalence.compare import Signals, loss

    setup = make_setup(**changes, per_token_loss=per_token)
    assert loss(Signals(setup, [], [], loss=_signals(setup))) is None
    found = loss(Signals(setup, [], [], loss=_signals(setup, mutant)))
    assert found is not None and found.signal == "loss" and expected in found.effect
    assert "the step reports lm loss" in found.effect


def test_per_sequence_normalisation_differs_offline_and_is_not_compared(megatron: Any) -> None:
    """Without calculate_per_token_loss, forward_step_calc_loss divides each micro batch by its own tokens: a pack
    weighs its sequences by their tokens, one sequence per micro batch weighs each alike. Offline packs and the
    unpacked rows do not share micro batches, so that value is measured but not compared."""
    from mbridge_seqpack.equivalence.compare import Signals, loss

    setup = make_setup(pad_seq_to_mult=4)
    packed, unpacked = _signals(setup)
    assert packed.backward != pytest.approx(unpacked.backward, rel=1e-3)
    assert loss(Signals(setup, [], [], loss=(packed, unpacked))) is None
    flipped = dataclasses.replace(setup, per_token_loss=True)
    assert loss(Signals(flipped, [], [], loss=_signals(flipped))) is None


@pytest.mark.parametrize("per_token", [False, True], ids=["per_seq", "per_token"])
@pytest.mark.parametrize("name, changes", PASSING, ids=[n for n, _ in PASSING])
def test_passing_configs_train_the_same_signal(
    megatron: Any, name: str, changes: dict[str, Any], per_token: bool
) -> None:
    from mbridge_seqpack.equivalence.compare import verdict

    found = verdict(make_setup(**{**changes, "per_token_loss": per_token}))
    assert found.findings == ()
    assert found.seconds < 2.0
    assert len(found.undetermined) == (1 if found.setup.cp > 1 else 0)  # CP=2: TE's partition kernel is CUDA only
