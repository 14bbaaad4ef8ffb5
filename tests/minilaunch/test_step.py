"""One packed and one unpacked step through the config's model (launch.packed_step): Megatron-Bridge's configs train
the same per-token losses packed as unpacked, and bugs planted in Megatron's own step, collate and RoPE are caught
(each a mutant of the code the launch runs, the same config without it a near miss)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from mbridge_seqpack.minilaunch.step import forget_steps, packed_step
from tests.support.threads import gloo_threads, needs_proc

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _launch_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The miniature launch is opt-in (MBRIDGE_SEQPACK_LAUNCH=1); these tests turn it on."""
    monkeypatch.setenv("MBRIDGE_SEQPACK_LAUNCH", "1")


@pytest.fixture(autouse=True)
def _fresh_steps() -> Any:
    forget_steps()
    yield
    forget_steps()


def _params_mutant(change: Callable[[Any], None]) -> Callable[[pytest.MonkeyPatch], None]:
    def plant(monkeypatch: pytest.MonkeyPatch) -> None:
        from megatron.bridge.training import gpt_step

        real = gpt_step.get_packed_seq_params

        def mutated(metadata: Any) -> Any:
            params = real(metadata)
            change(params)
            return params

        monkeypatch.setattr(gpt_step, "get_packed_seq_params", mutated)

    return plant


def _shift_kv(params: Any) -> None:
    params.cu_seqlens_kv = params.cu_seqlens_kv.clone()
    params.cu_seqlens_kv[1:-1] += 1


def _sbhd(params: Any) -> None:
    params.qkv_format = "sbhd"


def _short_max_seqlen(params: Any) -> None:
    params.max_seqlen_q = 4


def _thd_rope_off_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """THD RoPE whose positions start at 1 in every packed sequence (the frequencies rolled by one)."""
    from megatron.core.models.common.embeddings import rope_utils

    real = rope_utils._apply_rotary_pos_emb_thd

    def rolled(t: Any, cu_seqlens: Any, freqs: Any, *args: Any, **kwargs: Any) -> Any:
        return real(t, cu_seqlens, freqs.roll(1, dims=0), *args, **kwargs)

    monkeypatch.setattr(rope_utils, "_apply_rotary_pos_emb_thd", rolled)


def _position_ids_not_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron-Bridge's packed collate with position ids counting across the row instead of per sequence."""
    import torch
    from megatron.bridge.data.packing.gpt_sft import GPTSFTPackedDataset

    real = GPTSFTPackedDataset.collate_fn

    def collate(self: Any, batch: Any) -> Any:
        out = real(self, batch)
        rows, width = out["position_ids"].shape
        out["position_ids"] = torch.arange(width).repeat(rows, 1)
        return out

    monkeypatch.setattr(GPTSFTPackedDataset, "collate_fn", collate)


def test_megatron_bridge_trains_the_same_losses_packed(packed_cfg: Any) -> None:
    found = packed_step(packed_cfg)
    assert (found.state, found.differences, found.compared) == ("compared", (), 24)


@pytest.mark.parametrize(
    "change",
    [
        {"dataset.offline_packing_specs.pad_seq_to_mult": 4},
        {"dataset.dataset_kwargs": {"pad_to_max_length": True}},
        {"model.position_embedding_type": "learned_absolute"},
        {"model.num_moe_experts": 4, "model.moe_router_topk": 2, "model.moe_aux_loss_coeff": 0.01},
        {"model.window_size": (3, 0)},
    ],
    ids=["pad4", "fixed_width", "learned_positions", "moe", "sliding_window"],
)
def test_near_misses_train_the_same(packed_cfg: Any, change: dict[str, Any]) -> None:
    from mbridge_seqpack.config_paths import set_path

    for path, value in change.items():
        set_path(packed_cfg, path, value)
    found = packed_step(packed_cfg)
    assert (found.state, found.differences) == ("compared", ())


@pytest.mark.evidence("launch.packed_step")
@pytest.mark.parametrize(
    ("plant", "change", "expected"),
    [
        (_params_mutant(_shift_kv), {}, "trained tokens' losses differ packed vs unpacked"),
        (
            _params_mutant(_sbhd),
            {},
            "the packed step raises RuntimeError: The size of tensor a (48) must match the size of tensor b (13) at "
            "non-singleton dimension 0 (megatron/core/models/common/embeddings/rope_utils.py:136 "
            "_apply_rotary_pos_emb_bshd)",
        ),
        (
            _params_mutant(_short_max_seqlen),
            {},
            "the packed step raises BadAttentionInputs: a sequence of 6 tokens exceeds max_seqlen_q=4, which sizes "
            "TE's kernel (megatron/core/transformer/attention.py:1558 forward)",
        ),
        (_thd_rope_off_by_one, {}, "trained tokens' losses differ packed vs unpacked"),
        (
            _position_ids_not_reset,
            {"model.position_embedding_type": "learned_absolute"},
            "trained tokens' losses differ packed vs unpacked",
        ),
    ],
    ids=[
        "cu_seqlens_kv_shifted",
        "qkv_format_sbhd",
        "max_seqlen_short",
        "thd_rope_off_by_one",
        "position_ids_not_reset",
    ],
)
def test_planted_bugs_are_caught(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch, plant: Any, change: dict[str, Any], expected: str
) -> None:
    from mbridge_seqpack.config_paths import set_path

    for path, value in change.items():
        set_path(packed_cfg, path, value)
    plant(monkeypatch)
    forget_steps()  # the fixture's apply() checked the config before the bug was planted
    found = packed_step(packed_cfg)
    assert found.state == "compared"
    (difference,) = found.differences
    assert expected in difference


def test_the_rule_reports_it_with_the_stand_ins(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from mbridge_seqpack import check

    _params_mutant(_shift_kv)(monkeypatch)
    forget_steps()
    (found,) = [v for v in check(packed_cfg, world_size=8) if v.rule_id == "launch.packed_step"]
    assert found.severity == "error"
    assert found.rule.endswith(
        "packed training does not train what unpacked training trains (stood in: Megatron-Core's local layer modules "
        "for TE's, core attention by a reference reading PackedSeqParams as TE does (minilaunch/attention.py); "
        "float32, no dropout, TE's fused kernels off, weights drawn at std 0.5)"
    )
    assert found.assignments == {"dataset.enable_offline_packing": False, "dataset.offline_packing_specs": None}


@pytest.mark.parametrize(
    "change",
    [{"model.context_parallel_size": 2}, {"model.mtp_num_layers": 1}],
    ids=["cp2", "mtp"],
)
def test_outside_its_scope_there_is_no_step_verdict(packed_cfg: Any, change: dict[str, Any]) -> None:
    from mbridge_seqpack.config_paths import set_path

    for path, value in change.items():
        set_path(packed_cfg, path, value)
    assert packed_step(packed_cfg) is None


def test_unpacked_configs_have_no_step_verdict(unpacked_cfg: Any) -> None:
    assert packed_step(unpacked_cfg) is None


@needs_proc
def test_a_step_leaves_no_gloo_thread_behind(packed_cfg: Any) -> None:
    """The step's model, its DDP wrapper and its outputs go with its world (the world collects what it made)."""
    forget_steps()
    packed_step(packed_cfg)  # a first world: what Megatron's first imports keep is not any one step's
    before = gloo_threads()
    for per_token in (True, False):
        forget_steps()
        packed_cfg.model.calculate_per_token_loss = per_token
        assert packed_step(packed_cfg).state == "compared"
    assert gloo_threads() == before
