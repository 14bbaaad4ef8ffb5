"""The opt-in correction router_padding_mask (``mbridge_seqpack/corrections/router_padding.py``, Megatron-Bridge PR
5470 backported): its mask against the PR's own collate output, the real step handing it to a real MoE model's router
on CPU (exact expert-bias counts, and mutants of the wrapper caught), where it installs, and what the equivalence rule
and ``check`` say with it on and off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from mbridge_seqpack.config_paths import set_path

FIXTURE = Path(__file__).parents[1] / "contract_fixtures" / "pr5470_child_23743e2f7.json"
MOE = {"model.num_moe_experts": 4, "model.moe_router_topk": 2, "model.moe_aux_loss_coeff": 0.01}


@pytest.fixture(autouse=True)
def _no_correction(megatron_bridge: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts and ends with the correction off and unrequested."""
    from mbridge_seqpack.corrections import CORRECTIONS_ENV, router_padding

    monkeypatch.delenv(CORRECTIONS_ENV, raising=False)
    router_padding.uninstall()
    router_padding.request(())
    yield
    router_padding.uninstall()
    router_padding.request(())


# ---- the mask ----------------------------------------------------------------------------------------------------
def test_the_mask_is_the_one_pr5470s_collate_emits() -> None:
    """Megatron-Bridge 23743e2f7's collate, recorded by the contract (tests/contract_fixtures): the same batch without
    its padding_mask key gives the same mask here (True at the row tail past token_count; cu_seqlens_q counts the
    tail as one more sequence, so the mask is not derivable from it)."""
    from mbridge_seqpack.corrections.router_padding import padding_mask_of

    observed = json.loads(FIXTURE.read_text())["observations"]["collate.packed.mult1"]["value"]
    assert len(observed) == 3
    for label, batch in observed.items():
        tensors = {k: torch.tensor(batch[k]) for k in ("tokens", "cu_seqlens_q")}
        tensors["token_count"] = batch["token_count"]
        assert padding_mask_of(tensors).tolist() == batch["padding_mask"], label


def test_the_mask_with_physical_offsets_is_each_segments_tail() -> None:
    """pad_seq_to_mult > 1: sequence k is real for its logical length from its physical start (the MTP example of
    issue #38: cu_seqlens [0,4,10,10], padded [0,7,14,16])."""
    from mbridge_seqpack.corrections.router_padding import padding_mask_of

    batch = {
        "tokens": torch.tensor([[11, 12, 13, 14, 2, 2, 2, 21, 22, 23, 24, 25, 26, 2, 2, 2]]),
        "cu_seqlens_q": torch.tensor([[0, 4, 10, 10]], dtype=torch.int32),
        "cu_seqlens_q_padded": torch.tensor([[0, 7, 14, 16]], dtype=torch.int32),
        "token_count": [16],  # ignored where physical offsets exist
    }
    assert padding_mask_of(batch).int().tolist() == [[0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1]]
    assert padding_mask_of({"tokens": batch["tokens"]}) is None  # unpacked: no mask
    loss_mask = torch.tensor([[0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0]])
    # prompt tokens are masked in the loss and real for the router: the loss mask is not the padding
    assert int((padding_mask_of(batch) != (loss_mask == 0)).sum()) == 4  # positions 0, 1, 7, 8


# ---- the real step, a real MoE model, on CPU ------------------------------------------------------------------
#: tokens the expert-bias counts see over the capture's three packed rows of 64 (real: 42, 53 and 44), top-2, two
#: MoE layers: every token uncorrected, the real ones with the correction
ALL_TOKENS, REAL_TOKENS = 3 * 64 * 2 * 2, (42 + 53 + 44) * 2 * 2


def _expert_bias_counts() -> int:
    """One forward-backward of Megatron-Bridge's gpt_step.forward_step (get_batch, get_packed_seq_params, the model
    call) over Megatron-Bridge's packed collate with a Megatron-Core GPTModel whose two layers are MoE with expert
    bias; the tokens its routers counted (TopKRouter.local_tokens_per_expert, read after each router forward: the
    grad finalization spends and zeroes it)."""
    from megatron.core.transformer.moe.router import TopKRouter

    from devtools.capture.iteration import build_step, forward_backward, packed_batches, probe_config
    from mbridge_seqpack.capture.cpu_world import cpu_world

    cfg = probe_config(
        {
            "model.num_moe_experts": 4,
            "model.moe_router_topk": 2,
            "model.moe_router_score_function": "sigmoid",
            "model.moe_router_enable_expert_bias": True,
            "model.moe_aux_loss_coeff": 0.0,
            "model.moe_token_dispatcher_type": "alltoall",
            "model.moe_grouped_gemm": False,
            "model.moe_router_dtype": "fp64",  # fp32/bf16 gating is TE's general_gemm (CUDA only)
        }
    )
    batches = packed_batches(1)
    counted: dict[int, int] = {}
    with cpu_world() as recorder:
        parts = build_step(cfg, recorder)
        routers = [m for m in parts.model.modules() if isinstance(m, TopKRouter)]
        assert len(routers) == 2
        for router in routers:
            router.register_forward_hook(
                lambda module, args, out: counted.__setitem__(id(module), int(module.local_tokens_per_expert.sum()))
            )
        forward_backward(parts, iter(batches), len(batches))
    return sum(counted.values())


def test_the_step_hands_the_router_the_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    from mbridge_seqpack.corrections import router_padding

    assert _expert_bias_counts() == ALL_TOKENS  # Megatron-Bridge 0.6.2 as it is: padding counted
    with router_padding.installed(True):
        assert _expert_bias_counts() == REAL_TOKENS
        # mutants of the wrapper: the mask inverted, or never handed to the model
        real = router_padding.padding_mask_of
        monkeypatch.setattr(router_padding, "padding_mask_of", lambda b: None if real(b) is None else ~real(b))
        assert _expert_bias_counts() == ALL_TOKENS - REAL_TOKENS
        monkeypatch.setattr(router_padding, "padding_mask_of", real)
        monkeypatch.setattr(router_padding, "model_padding_mask", lambda mask, model: None)
        assert _expert_bias_counts() == ALL_TOKENS
    assert _expert_bias_counts() == ALL_TOKENS  # uninstalled: Megatron-Bridge's own functions again


# ---- installing --------------------------------------------------------------------------------------------------
def _functions() -> list[Any]:
    from megatron.bridge.training import gpt_step
    from megatron.core.transformer.moe.router import TopKRouter

    return [
        gpt_step.get_batch_from_iterator,
        gpt_step._packed_metadata_for_forward,
        gpt_step._forward_step_common,
        TopKRouter.__dict__["_apply_expert_bias"],
    ]


def test_install_by_argument_or_variable_and_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import mbridge_seqpack
    from mbridge_seqpack.corrections import CORRECTIONS_ENV, router_padding

    before = _functions()
    assert router_padding.state().describe() == "correction router_padding_mask: off"
    with mbridge_seqpack.install(corrections=["router_padding_mask"]):
        assert router_padding.is_wrapped()
        assert router_padding.state().describe() == "correction router_padding_mask: installed in this process"
    assert _functions() == before and router_padding.state().state == "off"
    with mbridge_seqpack.install():
        assert not router_padding.is_wrapped()  # nothing is on by default
    monkeypatch.setenv(CORRECTIONS_ENV, "router_padding_mask")
    with mbridge_seqpack.install():
        assert router_padding.is_wrapped()
    assert _functions() == before


def test_an_unknown_name_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import mbridge_seqpack
    from mbridge_seqpack.corrections import CORRECTIONS_ENV
    from mbridge_seqpack.errors import UsageError

    with pytest.raises(UsageError) as raised:
        mbridge_seqpack.install(corrections=["router_mask"])
    assert str(raised.value) == (
        "corrections: unknown correction 'router_mask'; known: router_padding_mask. "
        "Fix: corrections=router_padding_mask"
    )
    monkeypatch.setenv(CORRECTIONS_ENV, "router_padding_mask,zloss")
    with pytest.raises(UsageError, match=f"^{CORRECTIONS_ENV}: unknown correction 'zloss'"):
        mbridge_seqpack.install()


def test_other_versions_get_no_correction_and_check_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import mbridge_seqpack
    from mbridge_seqpack.corrections import router_padding

    before = _functions()
    monkeypatch.setattr(
        router_padding, "_versions", lambda: {"megatron-bridge": "0.7.0", "megatron-core": "0.19.2+53c9d68"}
    )
    why = "megatron-bridge 0.7.0, megatron-core 0.19.2+53c9d68 here; it is written for megatron-bridge 0.6.2 with "
    why += "megatron-core 0.19.2 only"
    assert router_padding.not_installable() == why
    with mbridge_seqpack.install(corrections=["router_padding_mask"]):
        assert _functions() == before
        assert router_padding.state().describe() == (
            f"correction router_padding_mask: requested but not installable ({why})"
        )
    with pytest.raises(router_padding.CorrectionNotApplicableError, match="cannot be installed: megatron-bridge 0.7"):
        router_padding.install()


def test_a_pre_launch_check_sees_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from mbridge_seqpack.corrections import CORRECTIONS_ENV, router_padding
    from mbridge_seqpack.thd import inject

    monkeypatch.setenv(CORRECTIONS_ENV, "router_padding_mask")
    monkeypatch.delenv("MBRIDGE_SEQPACK_MODE", raising=False)
    assert router_padding.state().describe() == (
        "correction router_padding_mask: requested but not installed at launch (the plugin installs it: set "
        "MBRIDGE_SEQPACK_MODE=error too)"
    )
    monkeypatch.setenv("MBRIDGE_SEQPACK_MODE", "error")
    monkeypatch.setattr(inject, "autoload_present", lambda: True)
    assert router_padding.state().describe() == (
        f"correction router_padding_mask: requested ({CORRECTIONS_ENV}); the launched process installs it"
    )


# ---- the equivalence rule and check -------------------------------------------------------------------------------
def _router_violations(cfg: Any) -> list[Any]:
    from mbridge_seqpack import check

    return [v for v in check(cfg, world_size=8) if v.rule_id == "equivalence.router_padding"]


def test_the_rule_passes_with_the_correction_and_offers_it_without(packed_cfg: Any) -> None:
    from mbridge_seqpack.corrections import router_padding

    for path, value in {**MOE, "dataset.dataset_kwargs.pad_seq_length_to_mult": 1}.items():
        set_path(packed_cfg, path, value)
    set_path(packed_cfg, "dataset.offline_packing_specs.pad_seq_to_mult", 4)  # alignment padding between sequences
    (v,) = _router_violations(packed_cfg)
    assert v.fields["measured"] == (
        "20.5% of routed tokens are padding (9 of 44); tokens per expert move by 25.7% of the real load; "
        "load-balancing loss 1.082 vs 1.031 on real tokens only"
    )
    assert v.fix.endswith(
        "or turn on the correction router_padding_mask (MBRIDGE_SEQPACK_CORRECTIONS=router_padding_mask with "
        "MBRIDGE_SEQPACK_MODE, or mbridge_seqpack.install(corrections=['router_padding_mask'])): Megatron-Bridge PR "
        "5470 backported, the same check passes with it"
    )
    with router_padding.installed(True):
        assert _router_violations(packed_cfg) == []


def test_capacity_is_not_corrected(packed_cfg: Any) -> None:
    from mbridge_seqpack.corrections import router_padding

    for path, value in {**MOE, "model.moe_expert_capacity_factor": 1.0}.items():
        set_path(packed_cfg, path, value)
    set_path(packed_cfg, "dataset.offline_packing_specs.pad_seq_to_mult", 4)
    with router_padding.installed(True):
        (v,) = _router_violations(packed_cfg)
    assert v.fields["measured"].startswith("with the correction router_padding_mask on: ")
    assert v.fields["measured"].endswith(
        "the expert capacity still counts every token (Megatron-Core 0.19.2's apply_router_token_dropping takes no "
        "padding mask; the correction does not reach it)"
    )


def test_an_uncovered_config_keeps_the_finding(packed_cfg: Any) -> None:
    from mbridge_seqpack.corrections import router_padding

    for path, value in {**MOE, "model.cuda_graph_impl": "transformer_engine"}.items():
        set_path(packed_cfg, path, value)
    set_path(packed_cfg, "dataset.offline_packing_specs.pad_seq_to_mult", 4)
    with router_padding.installed(True):
        found = _router_violations(packed_cfg)
    assert len(found) == 1
    assert "the correction router_padding_mask does not cover Transformer Engine CUDA graphs that capture the " in (
        found[0].fix
    )


def test_check_names_the_correction(monkeypatch: pytest.MonkeyPatch) -> None:
    from mbridge_seqpack.cli.check import check_target
    from mbridge_seqpack.corrections import router_padding

    with router_padding.installed(True):
        text = check_target("llama3_8b_sft_packed_8k", [], 8, megatron=False).to_text()
    assert "note: correction router_padding_mask: installed in this process" in text
    assert (
        "correction router_padding_mask"
        not in check_target("llama3_8b_sft_packed_8k", [], 8, megatron=False).to_text()
    )
