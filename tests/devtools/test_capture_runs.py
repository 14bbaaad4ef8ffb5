"""The capture-safety runs over Megatron's code (``devtools/capture/``): the cached verdicts the rules read
(``mbridge_seqpack/capture/verdicts.json``) must equal a fresh run, and the run must find each host read issue #33
names, at its site in the installed Megatron code; the capture-safe features must stay clean."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch


@pytest.fixture(scope="module")
def fresh(megatron_bridge: Any) -> dict[str, Any]:
    """Every probe and scope, run now (about a minute once Megatron is imported)."""
    import os

    from devtools.capture.verdicts import compute

    before = dict(os.environ)
    result = compute()
    # Megatron-Core's model builds set NVTE_*_ATTN, which the attention rules read as the launch's own
    assert dict(os.environ) == before, "the runs must leave the environment as they found it"
    return result


def _sites(fresh: dict[str, Any], probe: str) -> list[tuple[str, str]]:
    base = {(r["op"], r["site"]) for r in fresh["full_iteration"]["baseline"]["reads"]}
    return [(r["op"], r["site"]) for r in fresh["full_iteration"][probe]["reads"] if (r["op"], r["site"]) not in base]


slow = pytest.mark.slow


@slow
def test_the_cached_verdicts_are_what_the_code_computes(fresh: dict[str, Any]) -> None:
    """The rules read capture/verdicts.json; it must be a fresh run's output (refresh: python -m
    devtools.capture.verdicts --write)."""
    from mbridge_seqpack.capture.verdicts import CACHE

    assert json.loads(json.dumps(fresh, sort_keys=True)) == json.loads(CACHE.read_text())


ROPE = "megatron/core/models/common/embeddings/rope_utils.py"


@slow
def test_each_host_read_of_the_issue_is_found_at_its_site(fresh: dict[str, Any]) -> None:
    """Issue #33's list, each found by running the code: non-fused THD RoPE (.tolist(), .item()), the DDP grad
    checks (validate_result's Tensor.__bool__ / is_unexpectedly_large's .item()), the spiky-loss check, hybrid
    seq_idx (repeat_interleave), MTP's packed roll, timers, dropless MoE dispatch; max_seqlen's .cpu() without the
    injection."""
    full = fresh["full_iteration"]
    assert full["baseline"]["reads"] == [] and full["baseline"]["injected"] is True
    assert _sites(fresh, "no_injection") == [
        ("device-to-host copy (.cpu())", "megatron/bridge/training/gpt_step.py:268 get_batch_from_iterator")
    ]
    assert _sites(fresh, "rope_unfused") == [
        ("host read (tolist())", f"{ROPE}:222 _apply_rotary_pos_emb_thd"),
        ("host read (item())", f"{ROPE}:224 _apply_rotary_pos_emb_thd"),
        ("host read (item())", f"{ROPE}:239 _apply_rotary_pos_emb_thd"),
    ]
    rope_stack = full["rope_unfused"]["reads"][0]["stack"]
    assert "megatron/core/transformer/attention.py:1499 forward" in rope_stack
    assert _sites(fresh, "nan_grad_check") == [
        ("host read (bool(tensor))", "megatron/core/rerun_state_machine.py:521 validate_result")
    ]
    nan_stack = full["nan_grad_check"]["reads"][0]["stack"]
    assert any("param_and_grad_buffer.py" in f and "check_grads" in f for f in nan_stack)
    assert _sites(fresh, "large_grad_check") == [
        ("host read (item())", "megatron/core/rerun_state_machine.py:752 is_unexpectedly_large")
    ]
    assert _sites(fresh, "spiky_loss_check") == _sites(fresh, "large_grad_check")
    assert any("losses.py" in f for f in full["spiky_loss_check"]["reads"][0]["stack"])
    assert _sites(fresh, "hybrid_seq_idx") == [
        (
            "value-dependent shape (repeat_interleave without output_size)",
            "megatron/core/packed_seq_params.py:63 __post_init__",
        )
    ]
    mtp = "megatron/core/transformer/multi_token_prediction.py"
    assert _sites(fresh, "mtp_packed_roll") == [
        ("host read (slice bounds from a tensor)", f"{mtp}:260 _roll_tensor_packed_seq"),
        ("host read (slice bounds from a tensor)", f"{mtp}:264 _roll_tensor_packed_seq"),
    ]
    timers = [
        ("synchronization (torch.distributed.barrier)", "megatron/core/timers.py:151 start"),
        ("synchronization (torch.cuda.synchronize)", "megatron/core/timers.py:152 start"),
        ("synchronization (torch.cuda.synchronize)", "megatron/core/timers.py:165 stop"),
    ]
    assert _sites(fresh, "timers_level_1") == _sites(fresh, "timers_level_2") == timers
    moe = "megatron/core/transformer/moe"
    assert _sites(fresh, "moe_alltoall_dropless") == [
        ("device-to-host copy (.to('cpu'))", f"{moe}/moe_utils.py:1185 maybe_move_tensor_to_cpu"),
        ("synchronization (Event.synchronize)", f"{moe}/token_dispatcher.py:950 _maybe_dtoh_and_synchronize"),
    ]
    assert _sites(fresh, "moe_allgather_dropless") == [
        ("device-to-host copy (.cpu())", f"{moe}/token_dispatcher.py:317 dispatch_postprocess"),
        ("value-dependent shape (masked_select)", f"{moe}/token_dispatcher.py:328 dispatch_postprocess"),
    ]


@slow
def test_the_capture_safe_features_read_nothing(fresh: dict[str, Any]) -> None:
    """Fused RoPE (TE's kernel stood in for, the run goes on to the end), alignment padding, alltoall drop-and-pad
    MoE, per-token loss and overlapped grad reduction add no host read in a run that finished: no condition, no
    rejection. The only runs that stop are the flex dispatchers' (the one-rank world cannot build them)."""
    full = fresh["full_iteration"]
    for probe in ("aligned", "moe_alltoall_drop_and_pad", "per_token_loss", "overlap_grad_reduce", "rope_fused"):
        assert _sites(fresh, probe) == [] and full[probe]["stopped_at"] is None, probe
    assert full["rope_fused"]["stood_in"] == [
        "tex.fused_rope_forward at transformer_engine/pytorch/attention/rope.py:142 forward",
        "tex.fused_rope_backward at transformer_engine/pytorch/attention/rope.py:164 backward",
    ]
    stopped = {p: e["stopped_at"] for p, e in full.items() if e["stopped_at"] is not None}
    dispatcher = "megatron/core/transformer/moe/token_dispatcher.py"
    deepep = f"{dispatcher}:1770 __init__: DeepEP dispatcher requires TPxEP > 1 when instantiating TransformerLayer"
    hybridep = f"{dispatcher}:1048 __init__: HybridEP is not installed."
    assert stopped["moe_flex_dropless"] == stopped["moe_flex_capacity"] == deepep
    for mode in ("dropless", "capacity", "drop_and_pad"):
        assert stopped[f"moe_flex_hybridep_{mode}"].startswith(hybridep)
    assert sorted(stopped) == sorted(
        ["moe_flex_dropless", "moe_flex_capacity"]
        + [f"moe_flex_hybridep_{m}" for m in ("dropless", "capacity", "drop_and_pad")]
    )
    assert {p: e["refused"] for p, e in full.items() if e["refused"]} == {
        "moe_flex_drop_and_pad": "Flex token dispatcher with deepep backend does not support "
        "moe_pad_expert_input_to_capacity (megatron/core/transformer/transformer_config.py:1604 __post_init__)"
    }


@slow
def test_a_stopped_run_certifies_nothing(fresh: dict[str, Any]) -> None:
    """A run that stopped before the step's end is undetermined, never certified; a refused config is neither."""
    from mbridge_seqpack.capture.verdicts import Verdicts

    verdicts = Verdicts(fresh)
    certified = {p.name for p in verdicts.certified()}
    undetermined = {p.name for p in verdicts.undetermined()}
    assert undetermined == {"moe_flex_dropless", "moe_flex_capacity"} | {
        f"moe_flex_hybridep_{m}" for m in ("dropless", "capacity", "drop_and_pad")
    }
    assert not certified & (undetermined | {"moe_flex_drop_and_pad"})
    assert "rope_fused" in certified


@slow
def test_every_dispatcher_and_capacity_mode_is_probed(fresh: dict[str, Any]) -> None:
    """The MoE features come from the config's fields (dispatcher x capacity mode), each run on its own: allgather
    reads the host in every mode (drop-and-pad included), alltoall with a capacity factor but no padding still moves
    counts to the host, only alltoall drop-and-pad is clean."""
    moe = "megatron/core/transformer/moe"
    allgather = [
        ("device-to-host copy (.cpu())", f"{moe}/token_dispatcher.py:317 dispatch_postprocess"),
        ("value-dependent shape (masked_select)", f"{moe}/token_dispatcher.py:328 dispatch_postprocess"),
    ]
    for mode in ("dropless", "capacity", "drop_and_pad"):
        assert _sites(fresh, f"moe_allgather_{mode}") == allgather, mode
    assert _sites(fresh, "moe_alltoall_capacity") == [  # the counts' copy, then the wait for it, as dropless
        ("device-to-host copy (.to('cpu'))", f"{moe}/moe_utils.py:1185 maybe_move_tensor_to_cpu"),
        ("synchronization (Event.synchronize)", f"{moe}/token_dispatcher.py:950 _maybe_dtoh_and_synchronize"),
    ]
    assert _sites(fresh, "moe_alltoall_drop_and_pad") == []


@slow
def test_te_scopes_on_each_moe_kind(fresh: dict[str, Any]) -> None:
    """Each MoE kind under each TE scope, from its own run: [moe] captures allgather's host reads (alltoall's
    drop-and-pad replays clean); [moe_router, moe_preprocess] with a capacity factor on alltoall is refused by
    Megatron-Core's assert (transformer_config.py:2516); flex is not run (DeepEP needs TP x EP > 1)."""
    te = fresh["te_moe"]
    assert te["moe:alltoall:drop_and_pad"]["moe"]["outcome"] == "replays"
    assert te["moe:alltoall:drop_and_pad"]["moe"]["reads"] == []
    reads = [(r["op"], r["site"]) for r in te["moe:allgather:drop_and_pad"]["moe"]["reads"]]
    assert reads[0] == (
        "device-to-host copy (.cpu())",
        "megatron/core/transformer/moe/token_dispatcher.py:317 dispatch_postprocess",
    )
    refused = te["moe:alltoall:capacity"]["moe_router+moe_preprocess"]
    assert (refused["outcome"], refused["site"]) == (
        "refused",
        "megatron/core/transformer/transformer_config.py:2516 __post_init__",
    )
    assert refused["message"] == (
        "moe_preprocess cuda graph is not supported when there are DtoH copies and synchronizations in the "
        "preprocess step."
    )
    assert te["moe:allgather:capacity"]["moe_router+moe_preprocess"]["outcome"] == "replays"
    assert te["moe:alltoall:capacity"]["moe"]["message"] == "moe cuda graph is only supported with drop-padding MoE."
    assert te["moe:flex:dropless"]["moe_router"]["outcome"] == "not run"


def test_the_rope_stand_in_equals_tes_own_unfused_rope(megatron_bridge: Any) -> None:
    """The CPU stand-in for TE's fused RoPE kernel gives what TE's own non-fused THD path gives (TE's
    apply_rotary_pos_emb with fused=False, sequence by sequence over cu_seqlens), and its backward is that path's
    gradient."""
    from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb

    from devtools.capture.kernels import rope_reference

    gen = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, 5, 12, 20, 20], dtype=torch.int32)
    t = torch.randn(20, 2, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    freqs = torch.randn(16, 1, 1, 6, generator=gen, dtype=torch.float64)
    want = apply_rotary_pos_emb(t, freqs, tensor_format="thd", fused=False, cu_seqlens=cu)
    got = rope_reference(t.detach(), freqs, "thd", cu)
    torch.testing.assert_close(got, want.detach())
    up = torch.randn(20, 2, 8, generator=gen, dtype=torch.float64)
    (grad,) = torch.autograd.grad(want, t, up)
    torch.testing.assert_close(rope_reference(up, freqs, "thd", cu, backward=True), grad)


def test_fused_rope_and_the_nan_check_reach_the_host_read(megatron_bridge: Any) -> None:
    """Fused RoPE with check_for_nan_in_grad: the run goes past TE's RoPE kernel (stood in) and reaches the NaN
    check's bool(tensor); before, it stopped at the kernel with nothing recorded and counted as safe."""
    from devtools.capture.iteration import run_iteration

    run = run_iteration(
        {"model.position_embedding_type": "rope", "model.apply_rope_fusion": True, "ddp.check_for_nan_in_grad": True}
    )
    assert run.stopped_at is None and len(run.stood_in) == 2
    assert [r.describe() for r in run.reads] == [
        "host read (bool(tensor)) at megatron/core/rerun_state_machine.py:521 validate_result"
    ]


@pytest.mark.evidence("cuda_graphs.te_scope_inputs")
@slow
def test_te_scopes_over_packed_rows(fresh: dict[str, Any]) -> None:
    """[mamba] asserts on Mamba layers (GraphableMegatronModule._te_cuda_graph_replay: tensor-only inputs) and the
    whole layer / attn scopes on attention layers; mlp, moe (drop-and-pad) and moe_router replay clean."""
    te = fresh["te_layers"]
    outcome = {(m, k): e["outcome"] for m, kinds in te.items() for k, e in kinds.items()}
    assert outcome[("mamba", "mamba")] == "asserts"
    assert te["mamba"]["mamba"]["site"] == "megatron/core/transformer/module.py:308 _te_cuda_graph_replay"
    assert te["mamba"]["mamba"]["message"] == "CUDA graph accepts only Tensor inputs."
    for kind in ("dense", "moe", "attention"):
        assert outcome[("attn", kind)] == outcome[("", kind)] == "asserts"
        assert te["attn"][kind]["site"] == "megatron/core/transformer/transformer_layer.py:1225 _te_cuda_graph_replay"
    assert outcome[("", "mamba")] == outcome[("", "mlp_layer")] == "asserts"
    assert [k for k in ("dense", "mlp_layer") if outcome[("mlp", k)] == "replays"] == ["dense", "mlp_layer"]
    for module in ("moe", "moe_router", "moe_router+moe_preprocess"):
        assert outcome[(module, "moe")] == "replays"
    assert all(e["reads"] == [] for kinds in te.values() for e in kinds.values())
    assert outcome[("mlp", "mamba")] == outcome[("mamba", "mlp_layer")] == "not graphed"
