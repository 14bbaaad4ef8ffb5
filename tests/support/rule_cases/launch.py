"""The ``launch.*`` rule cases (run by ``tests/rules/test_launch.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.rule_cases import Case, set_fields


def _launch_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The miniature launch turned on for the check (opt-in: MBRIDGE_SEQPACK_LAUNCH=1)."""
    monkeypatch.setenv("MBRIDGE_SEQPACK_LAUNCH", "1")


def _shifted_kv_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug planted in Megatron-Bridge's step: get_packed_seq_params (as gpt_step calls it) moves every inner
    cu_seqlens_kv boundary one token right, so each sequence's keys start inside its neighbour (the miniature launch
    turned on)."""
    from megatron.bridge.training import gpt_step

    from mbridge_seqpack.minilaunch.step import forget_steps

    _launch_on(monkeypatch)

    real = gpt_step.get_packed_seq_params

    def shifted(metadata: Any) -> Any:
        params = real(metadata)
        params.cu_seqlens_kv = params.cu_seqlens_kv.clone()
        params.cu_seqlens_kv[1:-1] += 1
        return params

    monkeypatch.setattr(gpt_step, "get_packed_seq_params", shifted)
    forget_steps()


def _megatron_bridge_step(cfg: Any, tmp_path: Any) -> None:
    """The repair: Megatron-Bridge's own get_packed_seq_params back in its step."""
    from megatron.bridge.training import gpt_step
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    from mbridge_seqpack.minilaunch.step import forget_steps

    gpt_step.get_packed_seq_params = get_packed_seq_params
    forget_steps()


CASES = [
    Case(
        "launch.model_build",
        "packed_cfg",
        8,
        set_fields(model__calculate_per_token_loss=True, ddp__average_in_collective=True),
        {
            "model": "GPTModelProvider",
            "raised": "AssertionError: Cannot average in collective when calculating per-token loss!",
            "at": "megatron/core/distributed/distributed_data_parallel.py:180 __init__",
            "ddp.average_in_collective": True,
        },
        {"ddp.average_in_collective": False},
        patch=_launch_on,
    ),
    Case(
        "launch.packed_step",
        "packed_cfg",
        8,
        lambda cfg, tmp_path: None,
        {
            "model": "GPTModelProvider",
            "dataset.enable_offline_packing": True,
            "measured": "20 of 24 trained tokens' losses differ packed vs unpacked (largest difference 7.92; e.g. "
            "sample 1, input position 1: 11.7696 packed, 11.8890 unpacked)",
        },
        {"dataset.enable_offline_packing": False, "dataset.offline_packing_specs": None},
        repair=_megatron_bridge_step,
        patch=_shifted_kv_offsets,
    ),
]
