"""Recipe mixins: order independence, re-derivation after a change, conflicts and opt-outs."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from mbridge_seqpack import PackingConfigError, apply, check
from mbridge_seqpack.compose.mixins import (
    ContextParallel,
    InBatchPacking,
    LongContext,
    OfflinePacking,
    PackedCudaGraphs,
    Parallelism,
)
from tests.support.config_snapshot import snapshot


def _fresh(megatron_bridge: Any) -> Any:
    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

    return sft_base(small_gpt_provider(2048), seq_length=2048, global_batch_size=16, micro_batch_size=2)


def test_every_permutation_gives_the_same_config(megatron_bridge: Any) -> None:
    mixins = [
        Parallelism(tensor=2),
        LongContext(16384, 2),
        OfflinePacking(),
        PackedCudaGraphs(),
        ContextParallel(2, comm_type="p2p"),
    ]
    snapshots = []
    for order in itertools.permutations(mixins):
        cfg = apply(_fresh(megatron_bridge), *order)
        cfg.rerun_state_machine.check_for_nan_in_loss = False
        snapshots.append(snapshot(cfg))
    assert all(s == snapshots[0] for s in snapshots)
    assert snapshots[0] == {
        "model.seq_length": 16384,
        "dataset.seq_length": 16384,
        "model.tensor_model_parallel_size": 2,
        "model.sequence_parallel": True,
        "model.context_parallel_size": 2,
        "model.cp_comm_type": "p2p",
        "model.hierarchical_context_parallel_sizes": None,
        "model.calculate_per_token_loss": True,
        "ddp.average_in_collective": False,
        "model.cuda_graph_impl": "transformer_engine",
        "train.micro_batch_size": 1,
        "train.global_batch_size": 16,
        "dataset.enable_offline_packing": True,
        "dataset.offline_packing_specs.packed_sequence_size": 16384,
        "dataset.offline_packing_specs.pad_seq_to_mult": 4,
        "dataset.offline_packing_specs.pad_cu_seqlens": False,
        "dataset.dataset_kwargs": {"pad_to_max_length": True},
        "cuda_graph_modules": ["mlp"],
    }


@pytest.mark.parametrize(
    ("tensor", "cp", "expected_mult"),
    [(1, 1, 1), (2, 1, 1), (1, 2, 4), (2, 2, 4), (2, 4, 8), (4, 2, 4), (8, 4, 8)],
)
def test_alignment_follows_the_final_topology(megatron_bridge: Any, tensor: int, cp: int, expected_mult: int) -> None:
    """Per sequence only 2*CP (the THD split); the row width takes the SP multiple CP*TP."""
    cfg = apply(_fresh(megatron_bridge), Parallelism(tensor=tensor), LongContext(32768, cp), OfflinePacking())
    assert cfg.dataset.offline_packing_specs.pad_seq_to_mult == expected_mult
    assert cfg.model.calculate_per_token_loss is (cp > 1)
    row = cfg.dataset.dataset_kwargs.get("pad_seq_length_to_mult", 16)
    assert row % (cp * tensor if tensor > 1 else 1) == 0 and row % (2 * cp if cp > 1 else 1) == 0


def test_changing_one_fact_rederives_everything(megatron_bridge: Any) -> None:
    cfg = apply(_fresh(megatron_bridge), LongContext(32768, 2), OfflinePacking())
    assert cfg.dataset.offline_packing_specs.pad_seq_to_mult == 4
    apply(cfg, ContextParallel(4))
    assert cfg.dataset.offline_packing_specs.pad_seq_to_mult == 8
    apply(cfg, Parallelism(tensor=4))  # enables SP: the row width takes CP*TP = 16, sequences keep 2*CP
    assert cfg.model.sequence_parallel is True
    assert cfg.dataset.offline_packing_specs.pad_seq_to_mult == 8
    apply(cfg, LongContext(65536, 4))
    assert (cfg.model.seq_length, cfg.dataset.seq_length, cfg.dataset.offline_packing_specs.packed_sequence_size) == (
        65536,
        65536,
        65536,
    )
    assert check(cfg, world_size=32) == []


def test_conflicting_mixins_raise(megatron_bridge: Any) -> None:
    with pytest.raises(PackingConfigError) as info:
        apply(_fresh(megatron_bridge), LongContext(8192, 2), ContextParallel(4))
    (v,) = info.value.violations
    assert v.rule_id == "mixins.conflict"
    assert v.fields == {"model.context_parallel_size": [2, 4]}
    assert v.fix == "give model.context_parallel_size one value (drop it from one of the two mixins)"


def test_documented_opt_out_is_an_advisory(megatron_bridge: Any) -> None:
    from megatron.bridge.data.builders.mock_vlm_sft import MockVLMSFTDatasetConfig
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider

    cfg = _fresh(megatron_bridge)
    cfg.model = Qwen35VLModelProvider(num_layers=4, hidden_size=256, num_attention_heads=4, seq_length=2048)
    cfg.dataset = MockVLMSFTDatasetConfig(seq_length=2048, hf_processor_path="local/processor")
    apply(cfg, InBatchPacking(micro_batch_size=4))  # documented opt-out only: an advisory, not an error
    [v] = check(cfg, world_size=4)
    assert (v.rule_id, v.severity) == ("model.in_batch_packing_opt_out", "advisory")


def test_in_batch_with_cuda_graphs_is_refused(megatron_bridge: Any) -> None:
    """No graph path replays collate-time packing in Megatron-Bridge 0.6.2 (docs/graph-paths.md): apply() no longer
    writes a record that silences the rule."""
    from megatron.bridge.data.builders.mock_vlm_sft import MockVLMSFTDatasetConfig

    cfg = _fresh(megatron_bridge)
    cfg.dataset = MockVLMSFTDatasetConfig(seq_length=2048, hf_processor_path="local/processor")
    with pytest.raises(PackingConfigError) as info:
        apply(cfg, InBatchPacking(micro_batch_size=4), PackedCudaGraphs())
    assert [v.rule_id for v in info.value.violations] == ["in_batch.no_cuda_graphs"]
    assert "MBRIDGE_SEQPACK_STATIC_THD" not in (cfg.env_vars or {})


def test_full_iteration_mixin_needs_the_injection(megatron_bridge: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """PackedCudaGraphs(impl="full_iteration") works only where mbridge_seqpack hands the captured step a host
    max_seqlen: with MBRIDGE_SEQPACK_MODE set for the launch it is accepted, without it refused."""
    monkeypatch.delenv("MBRIDGE_SEQPACK_MODE", raising=False)

    def capture_safe() -> Any:  # fused RoPE, no DDP NaN check: cuda_graphs.capture_host_reads holds
        cfg = _fresh(megatron_bridge)
        cfg.model.apply_rope_fusion, cfg.ddp.check_for_nan_in_grad = True, False
        return cfg

    with pytest.raises(PackingConfigError) as info:
        apply(capture_safe(), OfflinePacking(), PackedCudaGraphs(impl="full_iteration"))
    assert [v.rule_id for v in info.value.violations] == ["cuda_graphs.full_iteration_needs_injection"]
    with pytest.raises(PackingConfigError) as info:  # Megatron-Bridge's SFT defaults: the step reads the host
        apply(_fresh(megatron_bridge), OfflinePacking(), PackedCudaGraphs(impl="full_iteration"))
    assert "cuda_graphs.capture_host_reads" in [v.rule_id for v in info.value.violations]
    monkeypatch.setenv("MBRIDGE_SEQPACK_MODE", "error")
    cfg = apply(capture_safe(), OfflinePacking(), PackedCudaGraphs(impl="full_iteration"))
    specs = cfg.dataset.offline_packing_specs
    assert (cfg.model.cuda_graph_impl, specs.pad_cu_seqlens, cfg.dataset.dataset_kwargs["pad_to_max_length"]) == (
        "full_iteration",
        True,
        True,
    )
    assert cfg.rerun_state_machine.check_for_nan_in_loss is False


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: InBatchPacking(micro_batch_size=1),
            "InBatchPacking.micro_batch_size must be > 1 (it packs the sequences of one micro batch), got 1; "
            "use OfflinePacking for micro batch 1",
        ),
        (lambda: ContextParallel(0), "ContextParallel.size must be a positive integer, got 0"),
        (lambda: OfflinePacking(pack_size=-8), "OfflinePacking.pack_size must be a positive integer, got -8"),
        (
            lambda: PackedCudaGraphs(impl="local"),
            "PackedCudaGraphs.impl must be 'transformer_engine' or 'full_iteration', got 'local'",
        ),
        (
            lambda: PackedCudaGraphs(modules=("attn", "mlp")),
            "PackedCudaGraphs.modules=('attn', 'mlp') puts attention inside a TE graph, which asserts on "
            "packed_seq_params at the first replay; capture after attention, e.g. modules=('mlp',)",
        ),
        (
            lambda: PackedCudaGraphs(modules=()),
            "PackedCudaGraphs.modules=() puts attention inside a TE graph, which asserts on "
            "packed_seq_params at the first replay; capture after attention, e.g. modules=('mlp',)",
        ),
    ],
)
def test_bad_mixin_arguments(make: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        make()
    assert str(info.value) == message


def test_apply_rejects_non_mixins(megatron_bridge: Any) -> None:
    with pytest.raises(TypeError, match="apply\\(\\) takes mixins \\(objects with .facts\\(\\)\\); got int"):
        apply(_fresh(megatron_bridge), 3)


def test_apply_follows_megatron_bridges_conventions(megatron_bridge: Any) -> None:
    """dataset.seq_length owns the length (the recipe runner syncs model.seq_length from it), and a user's
    stricter pad_seq_to_mult survives as lcm(existing, needed)."""
    cfg = apply(_fresh(megatron_bridge), LongContext(8192, 2), OfflinePacking())
    cfg.dataset.seq_length = 16384  # a user override after the recipe was built
    cfg.dataset.offline_packing_specs.pad_seq_to_mult = 64
    apply(cfg)
    assert (cfg.model.seq_length, cfg.dataset.seq_length, cfg.dataset.offline_packing_specs.packed_sequence_size) == (
        16384,
        16384,
        16384,
    )
    assert cfg.dataset.offline_packing_specs.pad_seq_to_mult == 64
    apply(cfg, ContextParallel(2))
    assert cfg.dataset.offline_packing_specs.pad_seq_to_mult == 64
