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
    "equivalence.router_padding:error",  # the packed MoE recipes below, whatever the variant
}
#: shipped recipes Megatron-Bridge 0.6.2 accepts that crash at the first forward: they pack by default
#: (recipes/common.py _sft_common) over a layer spec whose core attention refuses packed rows (Gemma-2's
#: Gemma2FlexDotProductAttention, EXAONE-4's Megatron-Core DotProductAttention; tests/rules/test_attention_evidence.py)
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
#: Nemotron-H 4B fine-tuning packs (from _sft_common) with use_mamba_mem_eff_path=False: MambaMixer.forward asserts
#: 'Training with packed sequences is not supported in the non-memory-efficient code path' in every Mamba layer at the
#: first forward (tests/rules/test_gap_evidence.py runs it)
SHIPPED_TRUE_POSITIVES |= {
    f"nemotronh.h100.nemotronh:nemotronh_4b_{kind}_1gpu_h100_bf16_config": ["mamba.packing_needs_mem_eff_path:error"]
    for kind in ("sft", "peft")
}
#: GLM-4.5 355B fine-tuning runs TP=2 with sequence_parallel=False over MoE layers: MoELayer.forward raises ValueError
#: '... MoE and tensor parallelism are enabled without also enabling sequence parallelism' at the first training
#: forward (tests/rules/test_gap_evidence.py runs it; the 355B pretraining recipe turns SP on)
SHIPPED_TRUE_POSITIVES |= {
    "glm.h100.glm45:glm45_355b_sft_128gpu_h100_bf16_config": ["moe.tp_needs_sequence_parallel:error"],
    "glm.h100.glm45:glm45_355b_peft_16gpu_h100_bf16_config": ["moe.tp_needs_sequence_parallel:error"],
}


#: packed MoE fine-tuning whose router has an auxiliary loss, z-loss or expert bias: Megatron-Bridge 0.6.2's
#: gpt_step passes TopKRouter no padding_mask, so the packed rows' padding is routed and counted in those statistics
#: (the unpacked run never routes it: the equivalence check runs both through Megatron-Core's TopKRouter; Megatron-
#: Bridge PR 5470 fixed it after 0.6.2). The two Nemotron-3.5 packed recipes also roll MTP labels on the logical
#: cu_seqlens of padded rows, across sequence boundaries (tests/equivalence/test_equivalence.py)
SHIPPED_TRUE_POSITIVES |= {
    name: ["equivalence.router_padding:error"]
    for name in [
        "exaone.h100.exaone_moe:exaone_moe_236b_a23b_peft_16gpu_h100_bf16_config",
        "exaone.h100.exaone_moe:exaone_moe_236b_a23b_sft_64gpu_h100_bf16_config",
        *(
            f"moonlight.h100.moonlight_16b:moonlight_16b_{kind}_config"
            for kind in ("peft_2gpu_h100_bf16", "peft_4gpu_h100_bf16", "sft_8gpu_h100_bf16_8k", "sft_8gpu_h100_bf16")
        ),
        "moonlight.h100.moonlight_16b:moonlight_16b_sft_8gpu_h100_bf16_tp1_config",
        "nemotronh.h100.nemotron_3_nano:nemotron_3_5_lightning_peft_config",
        "nemotronh.h100.nemotron_3_nano:nemotron_3_5_lightning_sft_config",
        "nemotronh.h100.nemotron_3_nano:nemotron_3_nano_peft_8gpu_h100_bf16_config",
        "nemotronh.h100.nemotron_3_nano:nemotron_3_nano_sft_8gpu_h100_bf16_config",
        "nemotronh.h100.nemotron_3_super:nemotron_3_super_peft_16gpu_h100_bf16_config",
        "nemotronh.h100.nemotron_3_super:nemotron_3_super_peft_1gpu_h100_bf16_config",
        "nemotronh.h100.nemotron_3_super:nemotron_3_super_sft_16gpu_h100_bf16_config",
        "nemotronh.h100.nemotron_3_ultra:nemotron_3_ultra_peft_32gpu_h100_bf16_openmathinstruct2_packed_config",
        "nemotronh.h100.nemotron_3_ultra:nemotron_3_ultra_sft_192gpu_h100_bf16_openmathinstruct2_packed_config",
        "olmoe.h100.olmoe_7b:olmoe_7b_peft_1gpu_h100_bf16_config",
        "olmoe.h100.olmoe_7b:olmoe_7b_sft_8gpu_h100_bf16_config",
        "qwen.h100.qwen3_moe:qwen3_235b_a22b_peft_16gpu_h100_bf16_config",
        "qwen.h100.qwen3_moe:qwen3_235b_a22b_sft_64gpu_h100_bf16_config",
        "qwen.h100.qwen3_moe:qwen3_30b_a3b_peft_4gpu_h100_bf16_config",
        "qwen.h100.qwen3_moe:qwen3_30b_a3b_sft_16gpu_h100_bf16_config",
        "qwen.h100.qwen3_moe:qwen3_30b_a3b_sft_8gpu_h100_bf16_config",
    ]
}
SHIPPED_TRUE_POSITIVES |= {
    name: ["equivalence.mtp_labels:error", "equivalence.router_padding:error"]
    for name in [
        "nemotronh.gb200.nemotron_3_nano:nemotron_3_5_lightning_sft_openmathinstruct2_packed_tp1_config",
        "nemotronh.h100.nemotron_3_nano:nemotron_3_5_lightning_sft_openmathinstruct2_packed_config",
    ]
}
#: long-context pretraining with dataset.create_attention_mask: every dataset worker builds an S x S mask
#: (torch.tril(torch.ones((S, S))), data/datasets gpt_dataset.py) that the step drops; the figure the rule computes
#: per node (9,216 GiB at 128k, 2,304 GiB at 64k) is beyond a 2 TiB node, so the run dies of host memory
SHIPPED_TRUE_POSITIVES |= {
    f"llama.h100.llama3:{name}_config": ["dataset.create_attention_mask:error"]
    for name in [
        "llama31_405b_pretrain_256gpu_h100_bf16",
        "llama31_405b_pretrain_256gpu_h100_bf16_deterministic",
        "llama31_70b_pretrain_32gpu_h100_bf16",
        "llama3_70b_pretrain_256gpu_h100_bf16_64k",
        "llama3_8b_pretrain_32gpu_h100_bf16_64k",
        "llama3_8b_pretrain_64gpu_h100_bf16_128k",
    ]
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
    assert lines[0].startswith("shipped: 297 configs, 264 built, 235 accepted by Megatron-Bridge, 43 with an error")
