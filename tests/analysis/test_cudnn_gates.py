"""The cuDNN versions asked for an undeclared target's cuDNN: one per interval of TE's gates. The reference is TE's
own selection run on every patch version from TE's minimum up: on each, it must pick what it picks on the version
asked for that interval, so a gate the reading missed shows as a version that differs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from mbridge_seqpack.analysis import attention_backend as ab
from mbridge_seqpack.analysis import te_attention as te
from mbridge_seqpack.analysis.cudnn_gates import cudnn_versions_to_ask, decode, gates_in, interval_of
from tests.support.attention_cases import _fp8, _set


def test_gates_are_read_from_each_comparison_form() -> None:
    source = (
        "if cudnn_version < (9, 18, 0): pass\n"
        "if cudnn_version in ((9, 23, 0), (9, 23, 1)): pass\n"
        "if (9, 14, 0) > cudnn_version: pass\n"
        "ok = q.cudnn_int <= 92299 and q.cudnn_int >= 91801 and q.cudnn < (9, 30, 0)\n"
        "if other < (1, 2, 3): pass\n"
        "bug = q.cudnn_int in (92700, 92701)\n"
    )
    assert gates_in(source) == {
        (9, 18, 0),
        (9, 23, 0),
        (9, 23, 1),
        (9, 23, 2),
        (9, 14, 0),
        (9, 23, 0),
        (9, 18, 1),
        (9, 30, 0),
        (9, 27, 0),
        (9, 27, 1),
        (9, 27, 2),
    }
    assert decode(92300) == (9, 23, 0) and decode(8907) == (8, 9, 7)


@pytest.mark.slow
def test_versions_asked_start_at_te_minimum_and_cover_its_gates(megatron_bridge: Any) -> None:
    from transformer_engine.common import MIN_CUDNN_VERSION

    asked = cudnn_versions_to_ask()
    assert asked[0] == tuple(MIN_CUDNN_VERSION) == (9, 12, 0)
    assert list(asked) == sorted(set(asked))
    # the gates of TE 2.20.2 the docs name: FP8 current scaling (9.14.0), THD softmax and determinism (9.18.0),
    # sm120 THD (9.18.1), MXFP8 (9.21.0, not 9.23.0/9.23.1), FP8 THD (9.23.0), THD learnable softmax (9.26.0)
    assert {(9, 14, 0), (9, 18, 0), (9, 18, 1), (9, 21, 0), (9, 23, 0), (9, 23, 2), (9, 26, 0)} <= set(asked)
    assert interval_of((9, 22, 5), asked) == (9, 21, 0)


#: configs whose selection depends on the cuDNN version (TE's gates), on the arch that has the gate
GATED = {
    "fp8_current_scaling_sm100": (_fp8("tensorwise"), (10, 0)),
    "mxfp8_sm100": (_fp8("mxfp8"), (10, 0)),
    "learnable_softmax_sm90": (_set(model__softmax_type="learnable"), (9, 0)),
    "thd_sm120": (_set(), (12, 0)),
    "deterministic_sm100": (_set(model__deterministic_mode=True), (10, 0)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(GATED))
def test_every_cudnn_version_selects_as_the_one_asked_for_it(name: str, packed_cfg: Any) -> None:
    change, arch = GATED[name]
    change(packed_cfg)
    with te.declared(gpu_arch=f"sm{10 * arch[0] + arch[1]}"):
        verdict = ab.verdict_of(packed_cfg)
    assert verdict.computed, verdict.skipped
    asked = cudnn_versions_to_ask()
    base = replace(verdict.target, cudnn_declared=True)
    grid = [(9, minor, patch) for minor in range(12, 28) for patch in range(3)]
    picks: dict[tuple[int, int, int], Any] = {}
    env = dict(verdict.inputs.env)
    for kind in verdict.kinds:
        for version in grid:
            chosen = te.select(kind.params, env, replace(base, cudnn=version))
            standing = te.select(kind.params, env, replace(base, cudnn=interval_of(version, asked)))
            seen = (chosen.backend, chosen.available, chosen.disabled)
            assert seen == (standing.backend, standing.available, standing.disabled), (version, seen, standing)
            picks[version] = seen
    assert len(set(picks.values())) > 1, "the config must be one whose selection the cuDNN version changes"


def test_the_stacks_asked_are_named_by_gpu_with_their_cudnn_versions() -> None:
    labels = ["sm90 with cuDNN 9.12.0", "sm90 with cuDNN 9.26.0", "sm100 with cuDNN 9.12.0", "sm100 with cuDNN 9.20.0"]
    labels += [
        "sm100 with cuDNN 9.26.0",
        "sm103 with cuDNN 9.12.0",
        "sm103 with cuDNN 9.20.0",
        "sm103 with cuDNN 9.26.0",
    ]
    assert ab.stacks_text(labels) == ("sm90 with cuDNN 9.12.0, 9.26.0; sm100, sm103 with cuDNN 9.12.0, 9.20.0, 9.26.0")
    assert ab.stacks_text(["sm100", "sm103"]) == "sm100, sm103"  # the target's cuDNN declared: GPUs only
