"""Megatron-Bridge 0.6.2's own recipes as a regression suite: zero false rejections, every flag explained.

Each recipe is built offline through its real bridge (``tests/zoo``), at the GPU count in its name, and
judged by Megatron-Bridge/Core (``runtime_config_update``, the micro-batch calculator, world-size
divisibility) and by the plugin. ``tests/zoo/expected.json`` is the committed outcome; refresh it with
``.venv/bin/python -m tests.zoo.report --write`` after a deliberate rule change and review the diff.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.zoo.report import EXPECTED, snapshot, summary

pytestmark = pytest.mark.slow

#: the only error-level flags allowed on configs Megatron-Bridge accepts, each a failure its rule's evidence test
#: runs: CP doubled the way its messages ask leaves pad_seq_to_mult=1, which the THD split cannot take
#: (offline.alignment_multiple); Nemotron-3 recipes that pack with MTP roll MTP labels across sequences under CP
#: (mtp.packed_context_parallel, NVIDIA/Megatron-LM#4495); doubled CP meets what Transformer Engine refuses:
#: windowed layers over p2p (GPT-OSS, EXAONE-MoE), a learnable softmax outside a2a (GPT-OSS), a2a over more ranks
#: than each TP rank has key/value heads (Qwen3 long-context, Gemma-3-VL); Gemma-2's and EXAONE-4's own core
#: attention refuses CP and packed rows; unpacked rows padded to 16 split over CP 16 (Qwen3 YaRN 128k)
TRUE_POSITIVES = {
    "offline.alignment_multiple:error",
    "mtp.packed_context_parallel:error",
    "cp.sliding_window_comm_type:error",
    "cp.softmax_type_comm_type:error",
    "cp.a2a_heads_divisible:error",
    "model.core_attention_cp:error",
    "model.core_attention_packing:error",
    "gpt_sft.row_width_alignment:error",
    "mamba.packing_needs_mem_eff_path:error",  # the Nemotron-H 4B recipes below, whatever the variant
    "moe.tp_needs_sequence_parallel:error",  # the GLM-4.5 355B recipes below, whatever the variant
}
#: shipped recipes Megatron-Bridge 0.6.2 accepts that crash at the first forward: they pack by default
#: (recipes/common.py _sft_common) over a layer spec whose core attention refuses packed rows (Gemma-2's
#: Gemma2FlexDotProductAttention, EXAONE-4's Megatron-Core DotProductAttention; tests/test_attention_evidence.py)
SHIPPED_TRUE_POSITIVES = {
    f"{family}:{size}_{kind}_config": ["model.core_attention_packing:error"]
    for family, size, kind in [
        ("gemma.h100.gemma2", "gemma2_2b", "sft_1gpu_h100_bf16"),
        ("gemma.h100.gemma2", "gemma2_2b", "peft_1gpu_h100_bf16"),
        ("gemma.h100.gemma2", "gemma2_9b", "sft_4gpu_h100_bf16"),
        ("gemma.h100.gemma2", "gemma2_9b", "peft_1gpu_h100_bf16"),
        ("gemma.h100.gemma2", "gemma2_27b", "sft_16gpu_h100_bf16"),
        ("gemma.h100.gemma2", "gemma2_27b", "peft_4gpu_h100_bf16"),
        ("exaone.h100.exaone4", "exaone4_1p2b", "sft_1gpu_h100_bf16"),
        ("exaone.h100.exaone4", "exaone4_1p2b", "peft_1gpu_h100_bf16"),
    ]
}
#: MXFP8 dot-product attention on GB200 (sm100): Transformer Engine 2.20.2's get_attention_backend disables
#: FusedAttention for MXFP8 with cuDNN < 9.21.0, FlashAttention and the unfused attention for any FP8 attention, so
#: no backend is left with the cuDNN torch 2.13.0 pins (nvidia-cudnn-cu13==9.20.0.48; tests/test_attention_backend.py
#: asks TE's selection the same); a container with cuDNN >= 9.21 declares it (MBRIDGE_SEQPACK_CUDNN_VERSION)
SHIPPED_TRUE_POSITIVES["qwen.gb200.qwen3_moe:qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_functional_config"] = [
    "attention.backend_available:error"
]
#: Nemotron-H 4B fine-tuning packs (from _sft_common) with use_mamba_mem_eff_path=False: MambaMixer.forward asserts
#: 'Training with packed sequences is not supported in the non-memory-efficient code path' in every Mamba layer at the
#: first forward (tests/test_gap_evidence.py runs it)
SHIPPED_TRUE_POSITIVES |= {
    f"nemotronh.h100.nemotronh:nemotronh_4b_{kind}_1gpu_h100_bf16_config": ["mamba.packing_needs_mem_eff_path:error"]
    for kind in ("sft", "peft")
}
#: GLM-4.5 355B fine-tuning runs TP=2 with sequence_parallel=False over MoE layers: MoELayer.forward raises ValueError
#: '... MoE and tensor parallelism are enabled without also enabling sequence parallelism' at the first training
#: forward (tests/test_gap_evidence.py runs it; the 355B pretraining recipe turns SP on)
SHIPPED_TRUE_POSITIVES |= {
    "glm.h100.glm45:glm45_355b_sft_128gpu_h100_bf16_config": ["moe.tp_needs_sequence_parallel:error"],
    "glm.h100.glm45:glm45_355b_peft_16gpu_h100_bf16_config": ["moe.tp_needs_sequence_parallel:error"],
}


@pytest.fixture(scope="module")
def zoo(megatron_bridge: Any) -> dict[str, dict[str, Any]]:
    from tests.zoo.harness import run_zoo

    return snapshot(run_zoo())


def test_zoo_matches_committed_expectations(zoo: dict[str, dict[str, Any]]) -> None:
    expected = json.loads(EXPECTED.read_text())
    for variant in expected:
        changed = {
            name: (expected[variant].get(name), zoo[variant].get(name))
            for name in set(expected[variant]) | set(zoo[variant])
            if expected[variant].get(name) != zoo[variant].get(name)
        }
        assert not changed, f"{variant}: {len(changed)} recipes changed, e.g. {sorted(changed.items())[:3]}"


def test_no_false_rejection_of_shipped_recipes(zoo: dict[str, dict[str, Any]]) -> None:
    """Every shipped recipe Megatron-Bridge accepts is accepted, except those that crash at the first forward."""
    shipped = zoo["shipped"]
    accepted = {k: v for k, v in shipped.items() if v["megatron"] == "accepted"}
    assert len(shipped) == 297 and len(accepted) >= 230
    rejected = {
        k: [f for f in v["flags"] if f.endswith(":error")]
        for k, v in accepted.items()
        if any(f.endswith(":error") for f in v["flags"])
    }
    assert rejected == SHIPPED_TRUE_POSITIVES


def test_variant_flags_are_the_true_positives(zoo: dict[str, dict[str, Any]]) -> None:
    for variant in ("cp2", "packed"):
        for name, row in zoo[variant].items():
            assert row["megatron"] == "accepted", name
            assert {f for f in row["flags"] if f.endswith(":error")} <= TRUE_POSITIVES, name
    assert sum("offline.alignment_multiple:error" in r["flags"] for r in zoo["cp2"].values()) == 98


def test_glm45_from_autobridge_is_recognised_with_packing(zoo: dict[str, dict[str, Any]]) -> None:
    packed = zoo["packed"]
    glm = {k: v for k, v in packed.items() if k.startswith("glm.h100.glm45:")}
    assert len(glm) == 4
    assert all("model.offline_packing_opt_out:advisory" in v["flags"] for v in glm.values())
    assert (
        "model.offline_packing_opt_out:advisory"
        in packed["qwen.h100.qwen3_next:qwen3_next_80b_a3b_sft_16gpu_h100_bf16_config+packed"]["flags"]
    )


def test_summary_lines(zoo: dict[str, dict[str, Any]]) -> None:
    lines = summary(zoo)
    assert lines[0].startswith("shipped: 297 configs, 264 built, 235 accepted by Megatron-Bridge, 13 with an error")
