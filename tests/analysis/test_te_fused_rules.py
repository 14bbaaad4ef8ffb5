"""TE's fixed FusedAttention rules as data: each cudnn-frontend rule at its thresholds, on both sides, and the drift
check against the installed libtransformer_engine.so (every reject condition in it cited or classified).

The expected texts and thresholds are written out here from the binary's strings and nvidia-cudnn-frontend
1.30.0's headers (sdpa_support_surface.h, scaled_dot_product_flash_attention.h, sdpa_fp8_bwd.h), not read from the
code under test.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from mbridge_seqpack.analysis import te_fused_rules as fr
from mbridge_seqpack.analysis.te_frontend_texts import CLASSIFIED, REASONS

#: a plain BF16 BSHD training config on sm90 with cuDNN 9.20, head dims 128: no fixed rule refuses it
_OFF = dict.fromkeys(
    ("q_thd", "kv_thd", "paged", "padding_mask", "deterministic", "cuda_graph", "return_max_logit"), False
)
_SIZES = dict(head_dim_qk=128, head_dim_v=128, max_seqlen_q=4096, max_seqlen_kv=4096, num_tokens_q=0, num_tokens_kv=0)
BASE = fr.Query(
    arch=(9, 0), cudnn=(9, 20, 0), dtype="f16", qkv_format="bshd", bias="no_bias", softmax="vanilla", scaling="",
    is_training=True, dropout=0.0, pages=(0,) * 6, num_heads=32, num_gqa_groups=8, **_OFF, **_SIZES,
)  # fmt: skip
THD = dict(q_thd=True, kv_thd=True, qkv_format="thd", padding_mask=True, num_tokens_q=8192, num_tokens_kv=8192)
FP8 = dict(dtype="fp8", scaling="delayed_tensor_scaling")
MXFP8 = dict(dtype="fp8", scaling="mxfp8_1d_scaling")
INFER = dict(is_training=False)


def _q(*parts: dict[str, Any], **changes: Any) -> fr.Query:
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    merged.update(changes)
    return replace(BASE, **merged)


def _first(query: fr.Query) -> str | None:
    rule = fr.first_reject(query)
    return None if rule is None else rule.name


# (refused, the same config just past the threshold): the first refuses with the rule named, the second passes
BOUNDARIES = {
    "fe_dropout_one": (_q(dropout=1.0), _q(dropout=0.99)),
    "fe_fp8_cudnn_91": (_q(FP8, cudnn=(9, 0, 99)), _q(FP8, cudnn=(9, 1, 0))),
    "fe_fp8_cudnn_9100": (_q(FP8, cudnn=(9, 10, 0)), _q(FP8, cudnn=(9, 10, 1))),
    "fe_fp8_arch": (_q(FP8, arch=(8, 9)), _q(FP8, arch=(9, 0))),
    "fe_fp8_fwd_head_dim_qk_blackwell": (
        _q(FP8, INFER, arch=(10, 0), cudnn=(9, 18, 0), head_dim_qk=192, head_dim_v=128),
        _q(FP8, INFER, arch=(10, 0), cudnn=(9, 19, 0), head_dim_qk=192, head_dim_v=128),
    ),
    "fe_fp8_fwd_head_dim_v_blackwell": (
        _q(FP8, INFER, arch=(10, 0), head_dim_qk=128, head_dim_v=144),
        _q(FP8, INFER, arch=(10, 0), head_dim_qk=128, head_dim_v=128),
    ),
    "fe_fp8_fwd_head_dim": (
        _q(FP8, INFER, head_dim_qk=272, head_dim_v=272),
        _q(FP8, INFER, head_dim_qk=256, head_dim_v=256),
    ),
    "fe_f16_cudnn_910": (_q(cudnn=(9, 10, 1)), _q(cudnn=(9, 10, 2))),
    "fe_f16_head_dim_multiple_8": (_q(head_dim_qk=124, head_dim_v=124), _q(head_dim_qk=120, head_dim_v=120)),
    "fe_f16_arch": (_q(INFER, arch=(7, 5)), _q(INFER, arch=(8, 0))),
    "fe_f16_head_dim_ampere_cudnn": (
        _q(INFER, arch=(8, 0), cudnn=(9, 9, 0), head_dim_qk=136, head_dim_v=136),
        _q(INFER, arch=(8, 0), cudnn=(9, 9, 1), head_dim_qk=136, head_dim_v=136),
    ),
    "fe_f16_head_dim_hopper_cudnn": (
        _q(INFER, cudnn=(9, 9, 0), head_dim_qk=264, head_dim_v=264),
        _q(INFER, cudnn=(9, 9, 0), head_dim_qk=256, head_dim_v=256),
    ),
    "fe_f16_head_dim_blackwell_cudnn": (
        _q(INFER, arch=(10, 0), cudnn=(9, 8, 99), head_dim_qk=136, head_dim_v=136),
        _q(INFER, arch=(10, 0), cudnn=(9, 9, 0), head_dim_qk=136, head_dim_v=136),
    ),
    "fe_f16_thd_arch_cudnn": (
        _q(THD, INFER, kv_thd=False, qkv_format="thd_2bshd", arch=(8, 0), cudnn=(9, 18, 0)),
        _q(THD, INFER, kv_thd=False, qkv_format="thd_2bshd", arch=(8, 0), cudnn=(9, 18, 1)),
    ),
    "fe_sink_cudnn": (_q(softmax="off_by_one", cudnn=(9, 12, 0)), _q(softmax="off_by_one", cudnn=(9, 13, 0))),
    "fe_mxfp8_arch": (_q(MXFP8, arch=(12, 0), cudnn=(9, 21, 0)), _q(MXFP8, arch=(10, 3), cudnn=(9, 21, 0))),
    "fe_f16_bwd_single_token": (_q(max_seqlen_q=1, max_seqlen_kv=1), _q(max_seqlen_q=1, max_seqlen_kv=2)),
    "fe_bwd_ragged_sink_cudnn": (
        _q(THD, softmax="off_by_one", cudnn=(9, 25, 0)),
        _q(THD, softmax="off_by_one", cudnn=(9, 26, 0)),
    ),
    "fe_f16_bwd_hopper_192_cudnn": (
        _q(cudnn=(9, 12, 0), head_dim_qk=160, head_dim_v=96),
        _q(cudnn=(9, 13, 0), head_dim_qk=160, head_dim_v=96),
    ),
    "fe_f16_bwd_head_dim_hopper": (_q(head_dim_qk=264, head_dim_v=264), _q(head_dim_qk=256, head_dim_v=256)),
    "fe_f16_bwd_blackwell_192": (
        _q(arch=(10, 0), head_dim_qk=192, head_dim_v=192),
        _q(arch=(10, 0), head_dim_qk=192, head_dim_v=128),
    ),
    "fe_f16_bwd_head_dim_blackwell": (
        _q(arch=(10, 0), cudnn=(9, 22, 0), head_dim_qk=256, head_dim_v=256),
        _q(arch=(10, 0), cudnn=(9, 23, 0), head_dim_qk=256, head_dim_v=256),
    ),
    "fe_f16_bwd_head_dim": (
        _q(arch=(12, 0), head_dim_qk=136, head_dim_v=128),
        _q(arch=(12, 0), head_dim_qk=128, head_dim_v=128),
    ),
    "fe_deterministic_blackwell_cudnn": (
        _q(arch=(10, 0), cudnn=(9, 17, 0), deterministic=True),
        _q(arch=(10, 0), cudnn=(9, 18, 0), deterministic=True),
    ),
    "fe_deterministic_blackwell_dropout": (
        _q(arch=(10, 0), cudnn=(9, 23, 0), head_dim_qk=256, head_dim_v=256, dropout=0.1),
        _q(arch=(10, 0), cudnn=(9, 23, 0), head_dim_qk=256, head_dim_v=256),
    ),
    "fe_deterministic_thd_sm8x_sm12x": (
        _q(THD, arch=(12, 0), cudnn=(9, 18, 1), deterministic=True),
        _q(THD, arch=(12, 0), cudnn=(9, 18, 0), deterministic=True),
    ),
    "fe_f16_bwd_thd_gqa_cudnn": (_q(THD, cudnn=(9, 5, 0)), _q(THD, cudnn=(9, 6, 0))),
    "fe_fp8_bwd_head_dim_qk_blackwell": (
        _q(FP8, arch=(10, 0), cudnn=(9, 26, 0), head_dim_qk=256, head_dim_v=256),
        _q(MXFP8, arch=(10, 0), cudnn=(9, 26, 0), head_dim_qk=256, head_dim_v=256),
    ),
    "fe_fp8_bwd_head_dim": (_q(FP8, head_dim_qk=64, head_dim_v=64), _q(FP8, head_dim_qk=128, head_dim_v=128)),
    "fe_fp8_deterministic_blackwell_cudnn": (
        _q(FP8, arch=(10, 0), cudnn=(9, 18, 0), head_dim_qk=64, head_dim_v=64),
        _q(FP8, arch=(10, 0), cudnn=(9, 19, 0), head_dim_qk=64, head_dim_v=64),
    ),
    "fe_fp8_deterministic_blackwell_dropout": (
        _q(FP8, arch=(10, 0), head_dim_qk=64, head_dim_v=64, dropout=0.1),
        _q(FP8, arch=(10, 0), head_dim_qk=64, head_dim_v=64),
    ),
}


def test_the_base_query_passes() -> None:
    assert fr.first_reject(BASE) is None


@pytest.mark.parametrize("name", sorted(BOUNDARIES))
def test_each_frontend_rule_at_its_threshold(name: str) -> None:
    refused, passed = BOUNDARIES[name]
    assert _first(refused) == name
    assert _first(passed) is None


def test_every_frontend_rule_reachable_first_has_a_boundary() -> None:
    """The rules an earlier rule always shadows are pinned on their own (next test); every other one here."""
    shadowed = {"fe_mxfp8_cudnn", "fe_fp8_bwd_thd_hopper", "fe_fp8_bwd_head_dim_v_blackwell"}
    assert {r.name for r in fr.FRONTEND_RULES} == set(BOUNDARIES) | shadowed


def test_shadowed_rules_hold_on_their_own() -> None:
    """Rules whose configs an earlier rule always refuses first: their own conditions, at the thresholds."""
    rule = {r.name: r for r in fr.FRONTEND_RULES}
    mxfp8 = rule["fe_mxfp8_cudnn"].applies
    assert mxfp8(_q(MXFP8, arch=(10, 0), cudnn=(9, 20, 0))) and not mxfp8(_q(MXFP8, arch=(10, 0), cudnn=(9, 21, 0)))
    assert _first(_q(MXFP8, arch=(10, 0), cudnn=(9, 20, 0))) == "mxfp8_cudnn"  # nvte_get_fused_attn_backend_v2's
    hopper = rule["fe_fp8_bwd_thd_hopper"].applies
    assert hopper(_q(FP8, THD)) and not hopper(_q(FP8, THD, arch=(10, 0))) and not hopper(_q(FP8, THD, **INFER))
    assert _first(_q(FP8, THD, cudnn=(9, 23, 0))) == "fp8_thd_backward_arch"
    d_v = rule["fe_fp8_bwd_head_dim_v_blackwell"].applies
    assert d_v(_q(FP8, arch=(10, 0), head_dim_qk=192, head_dim_v=144))
    assert not d_v(_q(FP8, arch=(10, 0), head_dim_qk=192, head_dim_v=128))
    assert not d_v(_q(MXFP8, arch=(10, 0), head_dim_qk=256, head_dim_v=256))


def test_head_dims_by_architecture_and_cudnn() -> None:
    """The issue's cases: Hopper's backward takes head dims up to 256; Blackwell's 192 only with d_v = 128 and 256
    only from cuDNN 9.23; Blackwell's (256, 512] band (multiples of 8) is served; head dims are multiples of 8."""
    blackwell = dict(arch=(10, 0), cudnn=(9, 23, 0))
    assert _first(_q(head_dim_qk=256, head_dim_v=256)) is None
    assert _first(_q(head_dim_qk=192, head_dim_v=128, **blackwell)) is None
    assert _first(_q(head_dim_qk=320, head_dim_v=320, **blackwell)) is None
    assert _first(_q(head_dim_qk=260, head_dim_v=264, **blackwell)) == "fe_f16_head_dim_multiple_8"
    assert _first(_q(head_dim_qk=200, head_dim_v=200, **blackwell)) == "fe_f16_bwd_head_dim_blackwell"
    assert _first(_q(INFER, head_dim_qk=512, head_dim_v=512)) is None  # the forward has no limit from cuDNN 9.10


def test_off_by_one_softmax_over_thd_needs_cudnn_9_26() -> None:
    """Off-by-one softmax over THD (a sink token on a ragged backward): refused below cuDNN 9.26 by the frontend,
    with its own text; learnable sinks meet TE's own v2 rule first."""
    text = (
        "SDPA backward with ragged offsets and a sink token requires cuDNN 9.26.0 or newer (older versions hit an "
        "out-of-bounds read in the compute_dot_do_o pre-pass)."
    )
    rule = fr.first_reject(_q(THD, softmax="off_by_one", cudnn=(9, 25, 0)))
    assert rule is not None and rule.text == text
    assert _first(_q(THD, softmax="learnable", cudnn=(9, 25, 0))) == "f16_thd_learnable_cudnn"
    assert _first(_q(THD, INFER, softmax="off_by_one", cudnn=(9, 25, 0))) is None


def test_fp8_backward_on_blackwell_is_deterministic_for_small_head_dims() -> None:
    """sdpa_fp8_bwd.h routes every Blackwell FP8 backward with d_qk <= 192 and d_v <= 128 to the deterministic
    algorithm, which refuses dropout; larger head dims (MXFP8 256) only when MXFP8 or asked."""
    assert _first(_q(FP8, arch=(10, 0), head_dim_qk=192, head_dim_v=128, dropout=0.1)) == (
        "fe_fp8_deterministic_blackwell_dropout"
    )
    assert _first(_q(MXFP8, arch=(10, 0), cudnn=(9, 26, 0), head_dim_qk=256, head_dim_v=256, dropout=0.1)) == (
        "fe_fp8_deterministic_blackwell_dropout"
    )
    assert _first(_q(FP8, arch=(9, 0), head_dim_qk=128, head_dim_v=128, dropout=0.1)) is None


# ---- the data against the installed binary ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def so_bytes() -> bytes:
    return fr.so_path().read_bytes()


RAGGED_SINK_CONDITION = "is_ragged && has_sink && detail::get_backend_version() < 92600"


def test_every_reject_condition_is_cited_or_classified(so_bytes: bytes) -> None:
    assert fr.drift(so_bytes) == []
    assert set(CLASSIFIED.values()) <= set(REASONS)
    cited = {r.condition for r in fr.FRONTEND_RULES}
    assert all(r.condition for r in fr.FRONTEND_RULES)
    assert not cited & set(CLASSIFIED)
    assert RAGGED_SINK_CONDITION in cited


def test_a_dropped_rule_is_reported(so_bytes: bytes) -> None:
    """Mutant: the ragged + sink rule left out of the data; drift names its condition."""
    rules = tuple(r for r in fr.RULES if r.name != "fe_bwd_ragged_sink_cudnn")
    assert fr.drift(so_bytes, rules) == [
        f"cudnn-frontend: a reject condition no rule cites and none classifies: {RAGGED_SINK_CONDITION!r}"
    ]


def test_a_new_or_dropped_condition_is_reported(so_bytes: bytes) -> None:
    """A condition the binary gains (a new cuDNN check) and one the classified list names that the binary lost."""
    planted = so_bytes + b"\x00is_ragged && d_qk > 999) at \x00"
    assert fr.drift(planted) == [
        "cudnn-frontend: a reject condition no rule cites and none classifies: 'is_ragged && d_qk > 999'"
    ]
    stale = {
        **CLASSIFIED,
        "is_paged && d_qk > 999": CLASSIFIED["is_paged && is_ragged && detail::get_backend_version() < 90700"],
    }
    assert fr.drift(so_bytes, classified=stale) == [
        "cudnn-frontend: a classified condition the binary no longer holds: 'is_paged && d_qk > 999'"
    ]
    edited = so_bytes.replace(
        b"(d_qk % 8 != 0) || (d_v % 8 != 0)) at \x00", b"(d_qk % 4 != 0) || (d_v % 4 != 0)) at \x00"
    )
    assert fr.drift(edited) == [
        "fe_f16_head_dim_multiple_8: the binary no longer holds the condition '(d_qk % 8 != 0) || (d_v % 8 != 0)'",
        "cudnn-frontend: a reject condition no rule cites and none classifies: '(d_qk % 4 != 0) || (d_v % 4 != 0)'",
    ]
