"""The CUDA-graph path matrix (``analysis/graph_paths.py``): the rules follow it cell by cell, its failing cells fail
in Megatron's own code where the CPU reaches it, its one injected path gets what the captured step needs, and the
docs page is generated from it.

Reports behind it:
- TE CUDA graphs cannot take THD packed attention: ``TransformerLayer._te_cuda_graph_replay`` asserts
  ``packed_seq_params is None`` (open in Megatron-LM, a fix proposed upstream):
  https://github.com/NVIDIA/Megatron-LM/issues/5619, https://github.com/NVIDIA/Megatron-LM/pull/5672
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from mbridge_seqpack import check
from mbridge_seqpack.analysis.graph_paths import GraphPath, graph_paths, render_markdown
from mbridge_seqpack.errors import ERROR

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
GRAPH_PATHS = graph_paths()
TE_MODULES = {
    "whole_layer": [],
    "with_attention": ["attn", "mlp"],
    "mlp": ["mlp"],
    "moe": ["moe"],
    "moe_router": ["moe_router"],
    "mamba": ["mamba"],
}


def test_docs_page_is_generated_from_the_matrix() -> None:
    assert (ROOT / "docs" / "graph-paths.md").read_text() == render_markdown()


def test_every_coordinate_has_exactly_one_cell() -> None:
    pairs = [("transformer_engine", c) for c in TE_MODULES] + [
        ("full_iteration", "whole_step"),
        ("local", "per_layer"),
    ]
    for (impl, capture), packing in itertools.product(pairs, ("offline_fixed", "offline_variable", "in_batch")):
        assert len([p for p in GRAPH_PATHS if (p.impl, p.capture, p.packing) == (impl, capture, packing)]) == 1
    assert len(GRAPH_PATHS) == len(pairs) * 3
    from mbridge_seqpack.rules import all_rules

    known = {r.rule_id for r in all_rules() if r.severity == ERROR}
    assert {p.rule_id for p in GRAPH_PATHS} <= known


def hybrid_provider(pattern: str = "M*M-", seq_length: int = 4096) -> Any:
    """A small Megatron-Bridge hybrid (Mamba) provider built offline, with is_hybrid_model on (without it the step
    gives packed Mamba layers no seq_idx: mamba.packing_needs_hybrid)."""
    from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider

    return HybridModelProvider(
        hybrid_layer_pattern=pattern,
        hidden_size=256,
        num_attention_heads=4,
        mamba_num_heads=8,
        mamba_head_dim=32,
        mamba_state_dim=16,
        mamba_num_groups=2,
        ffn_hidden_size=512,
        seq_length=seq_length,
        vocab_size=1024,
        is_hybrid_model=True,
    )


def _cell_config(request: pytest.FixtureRequest, cell: GraphPath, cp: int) -> Any:
    from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules, set_full_iteration_cuda_graph

    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import ContextParallel

    cfg = request.getfixturevalue("vlm_cfg" if cell.packing == "in_batch" else "packed_cfg")
    moe = cell.capture in ("moe", "moe_router")
    if cp > 1 and moe:  # applied (and checked) before the MoE settings: their router terms are equivalence.*'s
        apply(cfg, ContextParallel(cp))
    if cell.capture == "mamba":
        cfg.model = hybrid_provider()
    elif moe:
        cfg.model.num_moe_experts = 8
        cfg.model.moe_router_topk = 2
        cfg.model.moe_token_dispatcher_type = "alltoall"  # the matrix's MoE (allgather's [moe] reads the host)
        if cell.capture == "moe":  # Megatron-Core graphs whole MoE layers only when they drop and pad
            cfg.model.moe_expert_capacity_factor = 1.0
            cfg.model.moe_pad_expert_input_to_capacity = True
    if cp > 1 and not moe:
        apply(cfg, ContextParallel(cp))
    if cell.packing != "in_batch":
        cfg.dataset.dataset_kwargs["pad_to_max_length"] = cell.packing == "offline_fixed"
    if cell.impl == "full_iteration":
        set_full_iteration_cuda_graph(cfg.model)
        cfg.rerun_state_machine.check_for_nan_in_loss = False
        # a capture-safe step (cuda_graphs.capture_host_reads): fused RoPE, no DDP NaN check
        cfg.model.apply_rope_fusion = True
        cfg.ddp.check_for_nan_in_grad = False
        if cell.packing == "offline_fixed":
            cfg.dataset.offline_packing_specs.pad_cu_seqlens = True
    else:
        cfg.model.cuda_graph_impl = cell.impl
        set_cuda_graph_modules(cfg.model, TE_MODULES.get(cell.capture, ["mlp"]))
    return cfg


@pytest.mark.parametrize("cp", [1, 2])
@pytest.mark.parametrize("cell", GRAPH_PATHS, ids=lambda p: f"{p.impl}-{p.capture}-{p.packing}")
def test_rules_follow_the_matrix(
    cell: GraphPath, cp: int, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing cell is reported by the rule the matrix names; a working cell gives no error at all (CP 1 and 2);
    the injected cell is refused exactly when the launch would not have the injection."""
    from mbridge_seqpack.rules import RuleContext

    cfg = _cell_config(request, cell, cp)
    assert RuleContext(cfg, 8).graph_coordinates == (cell.impl, cell.capture, cell.packing)
    monkeypatch.setenv("MBRIDGE_SEQPACK_MODE", "error")
    errors = {v.rule_id for v in _errors(cfg)}
    if cell.fails:
        assert cell.rule_id in errors
    else:
        assert errors == set()
    if cell.verdict == "works_with_injection":
        monkeypatch.delenv("MBRIDGE_SEQPACK_MODE")
        assert {v.rule_id for v in _errors(cfg)} == {cell.rule_id}


def test_the_fix_for_attention_capture_converges_to_a_working_cell(packed_cfg: Any) -> None:
    """check --fix's resolution (every violation's assignments, jointly) lands on TE [mlp] over fixed-width rows."""
    from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules

    from mbridge_seqpack.overrides import converged_fix
    from mbridge_seqpack.rules import RuleContext

    packed_cfg.model.cuda_graph_impl = "transformer_engine"
    set_cuda_graph_modules(packed_cfg.model, [])
    overrides, remaining = converged_fix(packed_cfg, lambda c: check(c, world_size=8))
    assert remaining == [] and len(overrides) == 2
    assert any(o.endswith("model.cuda_graph_modules=[mlp]") for o in overrides), overrides
    from mbridge_seqpack.overrides import apply_overrides

    fixed = apply_overrides(packed_cfg, overrides)
    assert check(fixed, world_size=8) == []
    assert RuleContext(fixed, 8).graph_path.verdict == "works"


def test_all_moe_models_are_sent_to_the_router_scope(packed_cfg: Any) -> None:
    """Megatron-Core refuses cuda_graph_modules=[mlp] when every layer is MoE (TransformerConfig.__post_init__)."""
    from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules

    packed_cfg.dataset.dataset_kwargs["pad_to_max_length"] = True
    packed_cfg.model.num_moe_experts = 8
    packed_cfg.model.cuda_graph_impl = "transformer_engine"
    set_cuda_graph_modules(packed_cfg.model, ["attn"])
    [v] = [v for v in check(packed_cfg, world_size=8) if v.rule_id == "cuda_graphs.te_attention_over_packed"]
    assert v.assignments == {"model.cuda_graph_modules": ["moe_router"]}


# ---- the failing cells fail in Megatron's own code -----------------------------------------------------------


@pytest.mark.evidence("cuda_graphs.local_per_layer")
def test_megatron_bridge_accepts_attention_capture_and_refuses_local_layers(packed_cfg: Any) -> None:
    """Megatron-Bridge's own validation (runtime_config_update) passes TE attention capture over fixed-width packs
    with pad_cu_seqlens, the cell that asserts at the first replay; it raises for local per-layer graphs."""
    from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules

    from tests.support.validation import mb_validate

    packed_cfg.dataset.dataset_kwargs["pad_to_max_length"] = True
    packed_cfg.dataset.offline_packing_specs.pad_cu_seqlens = True
    packed_cfg.model.cuda_graph_impl = "transformer_engine"
    set_cuda_graph_modules(packed_cfg.model, ["attn"])
    assert mb_validate(packed_cfg, 8) is None
    assert [v.rule_id for v in check(packed_cfg, world_size=8)] == ["cuda_graphs.te_attention_over_packed"]
    packed_cfg.model.cuda_graph_impl = "local"
    set_cuda_graph_modules(packed_cfg.model, ["mlp"])
    error = mb_validate(packed_cfg, 8)
    assert isinstance(error, ValueError) and 'supports model.cuda_graph_impl="local" only for' in str(error)


def _bare_layer(modules: list[str]) -> Any:
    """A TransformerLayer carrying only its (real) config: enough for the replay dispatch, which reads nothing else
    before it asserts."""
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer

    config = TransformerConfig(
        num_layers=1,
        hidden_size=64,
        num_attention_heads=4,
        cuda_graph_impl="transformer_engine",
        cuda_graph_modules=modules,
    )
    layer = TransformerLayer.__new__(TransformerLayer)
    torch.nn.Module.__init__(layer)
    layer.config = config
    return layer


def _packed_params() -> Any:
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=5, max_seqlen_kv=5)


@pytest.mark.evidence("cuda_graphs.te_attention_over_packed")
@pytest.mark.parametrize("modules", [[], ["attn"], ["attn", "mlp"]])
def test_te_replay_with_attention_asserts_on_packed_params(megatron_bridge: Any, modules: list[str]) -> None:
    from megatron.core.transformer.transformer_layer import TransformerLayer

    layer = _bare_layer(modules)
    with pytest.raises(AssertionError, match="packed_seq_params are excluded from input list"):
        TransformerLayer._te_cuda_graph_replay(layer, torch.zeros(8, 1, 64), packed_seq_params=_packed_params())


def test_te_replay_after_attention_runs_attention_eagerly_with_the_packed_params(megatron_bridge: Any) -> None:
    """With [mlp], the replay first runs attention outside the graph (here it stops inside that eager attention,
    the layer having no submodules), so the packed params never reach the graph's tensor-only input check."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    layer = _bare_layer(["mlp"])
    with pytest.raises(AttributeError) as info:
        TransformerLayer._te_cuda_graph_replay(layer, torch.zeros(8, 1, 64), packed_seq_params=_packed_params())
    assert "_forward_attention" in [entry.name for entry in info.traceback]


def _in_batch(lengths: list[int]) -> dict[str, Any]:
    from megatron.bridge.data.packing.in_batch import build_mcore_thd_sequence_batch_from_rows

    rows = [
        {
            "input_ids": torch.arange(1, n + 1),
            "position_ids": torch.arange(n),
            "labels": torch.arange(2, n + 2),
            "loss_mask": torch.ones(n),
        }
        for n in lengths
    ]
    return build_mcore_thd_sequence_batch_from_rows(rows, pad_to_multiple_of=4)


@pytest.mark.evidence("in_batch.no_cuda_graphs")
def test_in_batch_rows_never_fit_the_te_input_surface(megatron_bridge: Any) -> None:
    """TE's replay copy_()s the real hidden states into the captured [seq, micro_batch, hidden] surface; an
    in-batch row of Megatron-Bridge's collate is [1, micro_batch*seq] tokens, so hidden [tokens, 1, hidden]."""
    seq, mbs, hidden = 64, 4, 8
    batch = _in_batch([64, 64, 64, 64])  # the widest micro batch: exactly micro_batch * seq tokens
    tokens = batch["input_ids"].shape
    assert tokens == (1, mbs * seq)
    surface = torch.zeros(seq, mbs, hidden)
    with pytest.raises(RuntimeError, match="must match the size"):
        surface.copy_(torch.zeros(tokens[1], tokens[0], hidden))


@pytest.mark.evidence("in_batch.no_cuda_graphs")
def test_full_iteration_buffers_refuse_another_in_batch_shape(megatron_bridge: Any) -> None:
    """Megatron-Core's StaticBufferLoader refills the first micro batch's buffers with clone_tensors_in_struct."""
    from megatron.core.full_cuda_graph import clone_tensors_in_struct

    buffers = copy.deepcopy(_in_batch([5, 17, 64, 3]))
    with pytest.raises(RuntimeError, match="must match the size"):
        clone_tensors_in_struct(buffers, _in_batch([9, 9, 1, 2]))


@pytest.fixture(scope="module")
def mb_batches(tmp_path_factory: pytest.TempPathFactory, megatron_bridge: Any) -> dict[bool, tuple[list, Path]]:
    from tests.support.mb_batches import mb_packed_collate_batches

    return {
        pad_cu: mb_packed_collate_batches(tmp_path_factory.mktemp(f"pad_cu_{pad_cu}"), pad_cu_seqlens=pad_cu)
        for pad_cu in (True, False)
    }


@pytest.mark.evidence("cuda_graphs.attention_graphs_need_pad_cu_seqlens")
def test_offline_fixed_width_batches_refill_the_buffers_only_with_pad_cu_seqlens(mb_batches: dict) -> None:
    from megatron.core.full_cuda_graph import clone_tensors_in_struct

    padded, _ = mb_batches[True]
    buffers = copy.deepcopy(padded[0])
    for batch in padded[1:]:
        clone_tensors_in_struct(buffers, batch)
        assert all(torch.equal(buffers[k], v) for k, v in batch.items() if isinstance(v, torch.Tensor))
    ragged, _ = mb_batches[False]
    assert len({b["cu_seqlens_q"].shape for b in ragged}) > 1  # one entry per sequence: shapes change
    with pytest.raises(RuntimeError, match="must match the size"):
        buffers = copy.deepcopy(ragged[0])
        for batch in ragged[1:]:
            clone_tensors_in_struct(buffers, batch)


@pytest.mark.evidence("cuda_graphs.full_iteration_needs_injection")
def test_the_captured_step_reads_max_seqlen_back_from_the_device(mb_batches: dict) -> None:
    """Megatron-Bridge's collate gives max_seqlen as a tensor; Megatron-Core's StaticBufferLoader moves every tensor to
    the device (copy_tensors_in_struct calls .cuda(), which fails here for want of CUDA); gpt_step then reads the
    host keys back with .cpu()."""
    from megatron.bridge.training.gpt_step import _CURRENT_PACKED_SEQ_HOST_KEYS
    from megatron.core.full_cuda_graph import copy_tensors_in_struct

    batch = mb_batches[True][0][0]
    assert _CURRENT_PACKED_SEQ_HOST_KEYS == ("max_seqlen_q", "max_seqlen_kv")
    assert all(isinstance(batch[k], torch.Tensor) for k in _CURRENT_PACKED_SEQ_HOST_KEYS)
    with pytest.raises((RuntimeError, AssertionError), match="NVIDIA driver|CUDA"):
        copy_tensors_in_struct({"max_seqlen_q": batch["max_seqlen_q"]})  # .cuda() on the host tensor


# ---- the injection -------------------------------------------------------------------------------------------


def _expected_max_seqlen(meta: Path) -> int:
    import json

    entries = json.loads(meta.read_text())
    return max(max(e["dataset_max_seqlen"] for e in entries), 2048 - min(e["min_packed_seqlen"] for e in entries))


def test_host_max_seqlen_gives_the_step_the_packs_constant_on_the_host(mb_batches: dict) -> None:
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    from mbridge_seqpack.thd.inject import HostMaxSeqlen, host_max_seqlen

    batches, meta = mb_batches[True]
    checker = HostMaxSeqlen("training")
    seen = [checker.check(b) for b in batches]
    buffers = copy.deepcopy(batches)  # the static buffers (device tensors in training; host copies here)
    for got, buffer in zip(host_max_seqlen(iter(buffers), seen), buffers):
        assert got["cu_seqlens_q"] is buffer["cu_seqlens_q"] and got["tokens"] is buffer["tokens"]
        assert got["max_seqlen_q"].device.type == "cpu" and got["max_seqlen_q"] is not buffer["max_seqlen_q"]
        params = get_packed_seq_params(got)  # Megatron-Bridge's own builder
        assert params.max_seqlen_q == params.max_seqlen_kv == _expected_max_seqlen(meta)


def test_a_changing_shape_is_refused_before_the_buffers(mb_batches: dict) -> None:
    from mbridge_seqpack.thd.inject import HostMaxSeqlen, StaticShapeMismatchError

    ragged, _ = mb_batches[False]
    checker = HostMaxSeqlen("training")
    with pytest.raises(StaticShapeMismatchError) as info:
        for batch in ragged:
            checker.check(batch)
    assert str(info.value).startswith("full-iteration CUDA graph (training): packed batch shapes changed for ")
    assert "cu_seqlens_q (1, " in str(info.value) and "pad_cu_seqlens=True" in str(info.value)


def test_a_changing_max_seqlen_is_refused(mb_batches: dict) -> None:
    from mbridge_seqpack.thd.inject import HostMaxSeqlen, StaticShapeMismatchError

    first = mb_batches[True][0][0]
    checker = HostMaxSeqlen("validation")
    checker.check(first)
    other = dict(first, max_seqlen_q=first["max_seqlen_q"] + 1)
    value = int(first["max_seqlen_q"])
    with pytest.raises(
        StaticShapeMismatchError,
        match=rf"^full-iteration CUDA graph \(validation\): max_seqlen_q "
        rf"changed from {value} to {value + 1}; the graph replays the captured value",
    ):
        checker.check(other)
    on_device = dict(first, max_seqlen_q=first["max_seqlen_q"].to("meta"))
    with pytest.raises(StaticShapeMismatchError, match=r"batch\['max_seqlen_q'\] is on meta"):
        HostMaxSeqlen("training").check(on_device)
    assert HostMaxSeqlen("training").check({"tokens": torch.zeros(1, 4)}) is None  # not packed: untouched


class _HostStaticLoader:
    """Megatron-Core's StaticBufferLoader without CUDA streams: first micro batch copied, later ones refilled with
    Megatron-Core's own clone_tensors_in_struct (the part that decides shapes)."""

    def __init__(self) -> None:
        self.buffers: dict[str, list] = {"training": [], "validation": []}

    def __call__(self, inputs: dict, stage: str, microbatch: int) -> dict:
        from megatron.core.full_cuda_graph import clone_tensors_in_struct

        if microbatch == len(self.buffers[stage]):
            self.buffers[stage].append(copy.deepcopy(inputs))
        else:
            clone_tensors_in_struct(self.buffers[stage][microbatch], inputs)
        return self.buffers[stage][microbatch]


def test_hook_install_wraps_megatron_cores_data_read(megatron_bridge: Any, mb_batches: dict) -> None:
    """Through Megatron-Core's real FullCudaGraphWrapper.data_read (its loop over micro batches and model chunks):
    the step gets the static buffers with a host max_seqlen; uninstall puts back the exact original."""
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper

    import mbridge_seqpack

    original = FullCudaGraphWrapper.__dict__["data_read"]
    batches, meta = mb_batches[True]
    with mbridge_seqpack.install(mode="error"):
        assert FullCudaGraphWrapper.__dict__["data_read"] is not original
        wrapper = FullCudaGraphWrapper.__new__(FullCudaGraphWrapper)
        wrapper.static_loader = _HostStaticLoader()
        source = iter(batches)
        for _ in range(2):  # two iterations: the second refills the same buffers
            [step_iter] = wrapper.data_read(source, None, True, 2)
            got = list(step_iter)
            buffers = wrapper.static_loader.buffers["training"]
            assert [g["cu_seqlens_q"] for g in got] == [b["cu_seqlens_q"] for b in buffers]
            assert all(g["cu_seqlens_q"] is b["cu_seqlens_q"] for g, b in zip(got, buffers))
            assert {int(g["max_seqlen_q"]) for g in got} == {_expected_max_seqlen(meta)}
        chunks = wrapper.data_read([iter(batches), None], [None, None], True, 1)  # virtual pipeline
        assert chunks[1] is None and len(list(chunks[0])) == 1
        ragged = mb_batches[False][0]
        from mbridge_seqpack.thd.inject import StaticShapeMismatchError

        with pytest.raises(StaticShapeMismatchError):
            wrapper.data_read(iter(ragged), None, True, len(ragged))
    assert FullCudaGraphWrapper.__dict__["data_read"] is original


# ---- capture safety, computed (cuda_graphs.capture_host_reads / te_scope_inputs) --------------------------------


def _full_iteration(cfg: Any) -> Any:
    from megatron.bridge.utils.cuda_graph import set_full_iteration_cuda_graph

    cfg.dataset.dataset_kwargs["pad_to_max_length"] = True
    cfg.dataset.offline_packing_specs.pad_cu_seqlens = True
    set_full_iteration_cuda_graph(cfg.model)
    cfg.rerun_state_machine.check_for_nan_in_loss = False  # Megatron-Bridge's own refusal for full-iteration graphs
    return cfg


def _errors(cfg: Any) -> list[Any]:
    """The errors of the graph-path mechanisms: ``equivalence.*`` (a packed MoE router counting padding, say) judges
    the training signal, whatever is captured, and has tests of its own (tests/equivalence/test_equivalence.py)."""
    return [v for v in check(cfg, world_size=8) if v.severity == ERROR and not v.rule_id.startswith("equivalence.")]


@pytest.mark.evidence("cuda_graphs.capture_host_reads")
def test_megatron_bridges_sft_defaults_are_refused_with_each_host_read_and_its_fix(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Megatron-Bridge's SFT defaults (ddp.check_for_nan_in_grad=True) with non-fused RoPE (MCore's default) under
    a full-iteration graph: two conditions the run finds, each with its own fix; --fix converges to a config with
    none, which Megatron-Bridge accepts too."""
    from mbridge_seqpack.overrides import apply_overrides, converged_fix
    from tests.support.validation import mb_validate

    monkeypatch.setenv("MBRIDGE_SEQPACK_MODE", "error")
    cfg = _full_iteration(packed_cfg)
    rope, nan = _errors(cfg)
    assert (rope.rule_id, nan.rule_id) == ("cuda_graphs.capture_host_reads",) * 2
    assert rope.fields == {
        "model.cuda_graph_impl": "full_iteration",
        "model.position_embedding_type": "rope",
        "model.apply_rope_fusion": False,
    }
    rope_utils = "megatron/core/models/common/embeddings/rope_utils.py"
    assert rope.rule == (
        "non-fused THD RoPE (model.apply_rope_fusion=False): the captured step reads device values on the host ("
        f"host read (tolist()) at {rope_utils}:222 _apply_rotary_pos_emb_thd; host read (item()) at {rope_utils}:224 "
        f"_apply_rotary_pos_emb_thd; host read (item()) at {rope_utils}:239 _apply_rotary_pos_emb_thd), which fails "
        "the capture or replays one step's values"
    )
    assert rope.overrides == ["model.apply_rope_fusion=true"]
    assert nan.fields == {"model.cuda_graph_impl": "full_iteration", "ddp.check_for_nan_in_grad": True}
    assert "host read (bool(tensor)) at megatron/core/rerun_state_machine.py:521 validate_result" in nan.rule
    assert nan.overrides == ["ddp.check_for_nan_in_grad=false"]
    overrides, remaining = converged_fix(cfg, lambda c: check(c, world_size=8))
    assert (overrides, remaining) == (["model.apply_rope_fusion=true", "ddp.check_for_nan_in_grad=false"], [])
    fixed = apply_overrides(cfg, overrides)
    assert check(fixed, world_size=8) == [] and mb_validate(fixed, 8) is None


@pytest.mark.parametrize(
    ("field", "value", "override"),
    [
        ("ddp.check_for_large_grads", True, "ddp.check_for_large_grads=false"),
        ("rerun_state_machine.check_for_spiky_loss", True, "rerun_state_machine.check_for_spiky_loss=false"),
        ("logger.timing_log_level", 1, "logger.timing_log_level=0"),
        ("logger.timing_log_level", 2, "logger.timing_log_level=0"),
    ],
)
def test_each_switchable_condition_has_its_own_fix(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch, field: str, value: Any, override: str
) -> None:
    from mbridge_seqpack.config_paths import set_path

    monkeypatch.setenv("MBRIDGE_SEQPACK_MODE", "error")
    cfg = _full_iteration(packed_cfg)
    cfg.model.apply_rope_fusion, cfg.ddp.check_for_nan_in_grad = True, False
    assert _errors(cfg) == []  # capture-safe: accepted
    set_path(cfg, field, value)
    [v] = _errors(cfg)
    assert (v.rule_id, v.fields[field], v.overrides) == ("cuda_graphs.capture_host_reads", value, [override])


@pytest.mark.parametrize("feature", ["mtp", "moe_alltoall", "moe_allgather", "hybrid"])
def test_a_condition_of_the_model_itself_leaves_full_iteration_for_a_certified_scope(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch, feature: str
) -> None:
    """MTP's packed roll, dropless MoE dispatch, a hybrid model's seq_idx: nothing in the config removes them, so
    the fix is TE per-layer graphs of a scope the TE run certifies on the model's layers (and the switchable
    conditions of the same config follow it there rather than being turned off)."""
    from mbridge_seqpack.overrides import apply_overrides, converged_fix

    monkeypatch.setenv("MBRIDGE_SEQPACK_MODE", "error")
    if feature == "hybrid":
        packed_cfg.model = hybrid_provider()
        packed_cfg.model.is_hybrid_model = True
    cfg = _full_iteration(packed_cfg)
    cfg.model.apply_rope_fusion = True
    scope = ["mlp"]
    if feature == "mtp":
        cfg.model.mtp_num_layers = 1
    elif feature.startswith("moe"):
        cfg.model.num_moe_experts, cfg.model.moe_router_topk = 8, 2
        cfg.model.moe_token_dispatcher_type = feature.split("_")[1]
        scope = ["moe_router"]  # every layer is MoE: Megatron-Core refuses [mlp]
    name = {"mtp": "mtp_packed_roll", "hybrid": "hybrid_seq_idx"}.get(feature, f"{feature}_dropless")
    violations = _errors(cfg)
    leave = {"model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_modules": scope}
    assert {v.rule_id for v in violations} == {"cuda_graphs.capture_host_reads"}
    assert all(v.assignments == leave for v in violations)  # the DDP NaN check is not turned off for nothing
    from mbridge_seqpack.capture.conditions import probe_named

    assert sorted(v.rule.split(":")[0] for v in violations) == sorted(
        [probe_named(name).title.split(":")[0], probe_named("nan_grad_check").title]
    )
    overrides, remaining = converged_fix(cfg, lambda c: check(c, world_size=8))
    assert remaining == []
    from mbridge_seqpack.rules import RuleContext

    assert RuleContext(apply_overrides(cfg, overrides), 8).graph_path.verdict == "works"


def test_drop_and_pad_moe_is_capture_safe_under_full_iteration(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropless alltoall dispatch reads token counts on the host (refused); capacity routing padded to capacity reads
    nothing in the run (probe moe_alltoall_drop_and_pad), so the same model with a capacity factor and padding is
    accepted under a full-iteration graph."""
    monkeypatch.setenv("MBRIDGE_SEQPACK_MODE", "error")
    cfg = _full_iteration(packed_cfg)
    cfg.model.apply_rope_fusion, cfg.ddp.check_for_nan_in_grad = True, False
    cfg.model.num_moe_experts, cfg.model.moe_router_topk = 8, 2
    cfg.model.moe_token_dispatcher_type = "alltoall"
    [v] = _errors(cfg)
    assert v.rule_id == "cuda_graphs.capture_host_reads" and v.rule.startswith("dropless MoE with the alltoall")
    cfg.model.moe_expert_capacity_factor = 1.0
    cfg.model.moe_pad_expert_input_to_capacity = True
    assert _errors(cfg) == []


def _moe(cfg: Any, dispatcher: str, capacity: float | None = None, pad: bool = False) -> Any:
    cfg.model.num_moe_experts, cfg.model.moe_router_topk = 8, 2
    cfg.model.moe_token_dispatcher_type = dispatcher
    cfg.model.moe_expert_capacity_factor, cfg.model.moe_pad_expert_input_to_capacity = capacity, pad
    return cfg


def _capture_safe_full_iteration(packed_cfg: Any) -> Any:
    cfg = _full_iteration(packed_cfg)
    cfg.model.apply_rope_fusion, cfg.ddp.check_for_nan_in_grad = True, False
    return cfg


def test_allgather_drop_and_pad_is_refused_under_full_iteration(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drop-and-pad does not make the allgather dispatcher capture-safe: its dispatch_postprocess still copies the
    token counts to the host and masked_selects the probs (token_dispatcher.py:317/328, found by the run); the fix
    is the alltoall dispatcher, whose drop-and-pad run reads nothing (the near miss, accepted)."""
    monkeypatch.setenv("MBRIDGE_SEQPACK_MODE", "error")
    cfg = _moe(_capture_safe_full_iteration(packed_cfg), "allgather", 1.0, True)
    [v] = _errors(cfg)
    moe = "megatron/core/transformer/moe/token_dispatcher.py"
    assert v.rule_id == "cuda_graphs.capture_host_reads"
    assert v.rule == (
        "drop-and-pad MoE (capacity factor, padded to capacity) with the allgather dispatcher: the captured step "
        f"reads device values on the host (device-to-host copy (.cpu()) at {moe}:317 dispatch_postprocess; "
        f"value-dependent shape (masked_select) at {moe}:328 dispatch_postprocess), which fails the capture or "
        "replays one step's values"
    )
    assert v.assignments == {"model.moe_token_dispatcher_type": "alltoall"}
    cfg.model.moe_token_dispatcher_type = "alltoall"
    assert _errors(cfg) == []


def test_capacity_without_padding_is_refused_under_full_iteration(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capacity factor without padding to capacity still sizes alltoall's dispatch from counts moved to the host
    (moe_utils.py:1185, found by the run): refused, not taken for drop-and-pad."""
    monkeypatch.setenv("MBRIDGE_SEQPACK_MODE", "error")
    cfg = _moe(_capture_safe_full_iteration(packed_cfg), "alltoall", 1.0, False)
    [v] = _errors(cfg)
    assert v.rule.startswith("capacity-limited MoE (a capacity factor, no padding to capacity) with the alltoall")
    assert "device-to-host copy (.to('cpu')) at megatron/core/transformer/moe/moe_utils.py:1185" in v.rule


def test_flex_drop_and_pad_is_refused_and_flex_dropless_is_undetermined(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flex dispatcher: with drop-and-pad Megatron-Core's TransformerConfig refuses the DeepEP backend
    (transformer_config.py:1604, an error with its message); dropless, DeepEP needs TP x EP > 1, which the one-rank
    CPU run lacks, so the verdict is undetermined (never OK) and says where the run stopped."""
    from mbridge_seqpack.errors import UNDETERMINED

    monkeypatch.setenv("MBRIDGE_SEQPACK_MODE", "error")
    cfg = _moe(_capture_safe_full_iteration(packed_cfg), "flex", 1.0, True)
    cfg.model.expert_model_parallel_size = (
        2  # DeepEP exchanges tokens across expert ranks (moe.flex_dispatcher_parallel)
    )
    [v] = _errors(cfg)
    assert v.rule == (
        "drop-and-pad MoE (capacity factor, padded to capacity) with the flex dispatcher: Megatron-Core refuses "
        "this config (Flex token dispatcher with deepep backend does not support moe_pad_expert_input_to_capacity "
        "(megatron/core/transformer/transformer_config.py:1604 __post_init__))"
    )
    _moe(cfg, "flex")
    assert _errors(cfg) == []
    [u] = [v for v in check(cfg, world_size=8) if v.rule_id == "cuda_graphs.capture_host_reads"]
    assert u.severity == UNDETERMINED
    assert u.not_run == (
        "the capture run stopped at megatron/core/transformer/moe/token_dispatcher.py:1770 __init__: DeepEP "
        "dispatcher requires TPxEP > 1 when instantiating TransformerLayer"
    )


def _te_moe(cfg: Any, modules: list[str]) -> Any:
    from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules

    cfg.dataset.dataset_kwargs["pad_to_max_length"] = True
    cfg.model.cuda_graph_impl = "transformer_engine"
    set_cuda_graph_modules(cfg.model, modules)
    return cfg


def test_router_and_preprocess_scopes_with_a_capacity_factor_are_refused(packed_cfg: Any) -> None:
    """[moe_router, moe_preprocess] with a capacity factor on alltoall: Megatron-Core's TransformerConfig asserts
    'moe_preprocess cuda graph is not supported when there are DtoH copies and synchronizations in the preprocess
    step.' (transformer_config.py:2516, reached by the run's finalize()); the plugin refuses it with that message and
    keeps [moe_router]. Near misses stay accepted: [moe_router] alone, drop-and-pad (padded to capacity), and the
    allgather dispatcher (Megatron-Core's check is alltoall's)."""
    cfg = _te_moe(_moe(packed_cfg, "alltoall", 1.0, False), ["moe_router", "moe_preprocess"])
    [v] = _errors(cfg)
    assert v.rule_id == "cuda_graphs.capture_host_reads"
    assert v.rule == (
        "Megatron-Core refuses the [moe_router, moe_preprocess] scope for moe:alltoall:capacity layers: "
        "'moe_preprocess cuda graph is not supported when there are DtoH copies and synchronizations in the "
        "preprocess step.' (megatron/core/transformer/transformer_config.py:2516 __post_init__)"
    )
    assert v.assignments == {"model.cuda_graph_modules": ["moe_router"]}
    for near_miss in (
        _te_moe(_moe(copy.deepcopy(packed_cfg), "alltoall", 1.0, False), ["moe_router"]),
        _te_moe(_moe(copy.deepcopy(packed_cfg), "alltoall", 1.0, True), ["moe_router", "moe_preprocess"]),
        _te_moe(_moe(copy.deepcopy(packed_cfg), "allgather", 1.0, False), ["moe_router", "moe_preprocess"]),
    ):
        assert _errors(near_miss) == []


def test_the_moe_scope_is_judged_on_the_models_own_dispatcher(packed_cfg: Any) -> None:
    """[moe] (drop-and-pad, as Megatron-Core requires) replays clean on alltoall, but captures allgather's
    dispatch_postprocess, which reads the host: the TE-scope verdict is the config's dispatcher's, not alltoall's."""
    accepted = _te_moe(_moe(copy.deepcopy(packed_cfg), "alltoall", 1.0, True), ["moe"])
    assert _errors(accepted) == []
    cfg = _te_moe(_moe(packed_cfg, "allgather", 1.0, True), ["moe"])
    [v] = _errors(cfg)
    assert v.fields["layer kinds"] == "moe:allgather:drop_and_pad"
    assert v.rule.startswith(
        "the [moe] graph of moe:allgather:drop_and_pad layers reads the host: device-to-host copy (.cpu()) at "
        "megatron/core/transformer/moe/token_dispatcher.py:317 dispatch_postprocess"
    )
    assert v.assignments == {"model.cuda_graph_modules": ["moe_router"]}


def test_fused_rope_with_the_nan_check_reaches_the_checks_host_read(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fused RoPE no longer stops the run: TE's kernel is stood in for, the rest of the step runs, and the NaN
    check behind it is found and refused; fused RoPE alone is certified from a run that finished."""
    from mbridge_seqpack.capture.verdicts import load

    monkeypatch.setenv("MBRIDGE_SEQPACK_MODE", "error")
    verdicts = load()
    assert verdicts.stopped_at("rope_fused") is None
    assert verdicts.stood_in("rope_fused") == [
        "tex.fused_rope_forward at transformer_engine/pytorch/attention/rope.py:142 forward",
        "tex.fused_rope_backward at transformer_engine/pytorch/attention/rope.py:164 backward",
    ]
    cfg = _full_iteration(packed_cfg)
    cfg.model.apply_rope_fusion = True
    [nan] = _errors(cfg)
    assert nan.fields == {"model.cuda_graph_impl": "full_iteration", "ddp.check_for_nan_in_grad": True}


@pytest.mark.parametrize(
    ("pattern", "modules", "rules", "fix"),
    [
        ("M*M-", ["mamba"], ["cuda_graphs.te_scope_inputs"], ["mlp"]),
        ("M*M-", ["attn", "mamba"], ["cuda_graphs.te_attention_over_packed", "cuda_graphs.te_scope_inputs"], ["mlp"]),
        ("M*M-", ["mamba", "mlp"], ["cuda_graphs.te_scope_inputs"], ["mlp"]),
        ("M*M-", ["mlp", "mamba"], ["cuda_graphs.te_scope_inputs"], ["mlp"]),  # the failing module listed last
        ("M*M*", ["attn", "mamba"], ["cuda_graphs.te_attention_over_packed", "cuda_graphs.te_scope_inputs"], None),
    ],
)
def test_mamba_graphs_over_packed_rows_are_refused_and_never_proposed(
    packed_cfg: Any, pattern: str, modules: list[str], rules: list[str], fix: list[str] | None
) -> None:
    """HybridStack passes packed_seq_params to MambaLayer, whose TE replay asserts tensor-only inputs (computed).
    --fix used to turn [attn, mamba] into [mamba]; it now keeps only certified modules ([mlp] for the hybrid MLP
    layers), or turns graphs off when the pattern has none."""
    from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules

    from mbridge_seqpack.overrides import apply_overrides, converged_fix

    packed_cfg.model = hybrid_provider(pattern)
    packed_cfg.dataset.dataset_kwargs["pad_to_max_length"] = True
    packed_cfg.model.cuda_graph_impl = "transformer_engine"
    set_cuda_graph_modules(packed_cfg.model, modules)
    violations = _errors(packed_cfg)
    assert [v.rule_id for v in violations] == rules
    scope_inputs = violations[-1]
    assert scope_inputs.fields["layer kinds"] == "mamba"
    assert "asserts at the first step: 'CUDA graph accepts only Tensor inputs.' (megatron/core/transformer/" in (
        scope_inputs.rule
    )
    expected = {"model.cuda_graph_modules": fix} if fix else {"model.cuda_graph_impl": "none"}
    assert all(v.assignments == expected for v in violations)
    from mbridge_seqpack.rules import RuleContext

    cell = RuleContext(packed_cfg, 8).graph_path
    assert (cell.capture, cell.verdict) == ("with_attention" if "attn" in modules else "mamba", "fails")
    overrides, remaining = converged_fix(packed_cfg, lambda c: check(c, world_size=8))
    assert remaining == []
    fixed = apply_overrides(packed_cfg, overrides)
    assert _errors(fixed) == []
    if fix:
        fixed_cell = RuleContext(fixed, 8).graph_path
        assert (fixed_cell.capture, fixed_cell.verdict) == ("mlp", "works")


def test_the_injection_must_be_on_the_class_in_the_process_that_trains(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed in this process: the wrapper must be what FullCudaGraphWrapper.data_read is when validate() runs,
    whatever MBRIDGE_SEQPACK_MODE says; a pre-launch check accepts the variable only with the start-up hook present."""
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper

    import mbridge_seqpack
    from mbridge_seqpack.thd import inject

    cfg = _full_iteration(packed_cfg)
    cfg.model.apply_rope_fusion, cfg.ddp.check_for_nan_in_grad = True, False
    monkeypatch.setenv("MBRIDGE_SEQPACK_MODE", "error")
    assert inject.injection_state() == "launch" and _errors(cfg) == []
    with mbridge_seqpack.install(mode="warn"):
        assert inject.injection_state() == "installed" and _errors(cfg) == []
        wrapped = FullCudaGraphWrapper.__dict__["data_read"]
        FullCudaGraphWrapper.data_read = wrapped.__wrapped__  # something put Megatron-Core's own back
        try:
            [v] = _errors(cfg)
            assert v.rule_id == "cuda_graphs.full_iteration_needs_injection"
            assert v.fields["FullCudaGraphWrapper.data_read"] == "not mbridge_seqpack's wrapper"
            assert "device-to-host copy (.cpu()) at megatron/bridge/training/gpt_step.py:268" in v.rule
            assert v.fix.startswith("call mbridge_seqpack.install() after whatever replaces")
        finally:
            FullCudaGraphWrapper.data_read = wrapped
    monkeypatch.setattr(inject, "AUTOLOAD_PTH", "no_such_startup_hook.pth")
    [v] = _errors(cfg)
    assert "MBRIDGE_SEQPACK_MODE is set but this environment has no no_such_startup_hook.pth" in v.rule
    assert v.assignments == {"model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_modules": ["mlp"]}


def _capture_safe_full_iteration(cfg: Any) -> Any:
    """A full-iteration graph over fixed-width offline packs whose step the one-rank capture finds clean."""
    from megatron.bridge.utils.cuda_graph import set_full_iteration_cuda_graph

    set_full_iteration_cuda_graph(cfg.model)
    cfg.rng.te_rng_tracker = True
    cfg.rerun_state_machine.check_for_nan_in_loss = False
    cfg.model.apply_rope_fusion = True
    cfg.ddp.check_for_nan_in_grad = False
    cfg.dataset.dataset_kwargs["pad_to_max_length"] = True
    cfg.dataset.offline_packing_specs.pad_cu_seqlens = True
    return cfg


@pytest.mark.parametrize(
    ("tp", "pp", "named"), [(1, 1, None), (2, 1, "TP=2"), (1, 2, "PP=2"), (2, 2, "TP=2 and PP=2")]
)
def test_a_clean_capture_is_not_determined_at_parallel_sizes_it_never_ran(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch, tp: int, pp: int, named: str | None
) -> None:
    """The capture runs in a one-rank world: at TP or PP > 1 its clean verdict was shown as OK for collectives and a
    pipeline schedule it never ran. There it is not determined, with what was not run; at TP = PP = 1 it is a pass."""
    monkeypatch.setenv("MBRIDGE_SEQPACK_MODE", "error")  # the launch injects the host max_seqlen
    cfg = _capture_safe_full_iteration(packed_cfg)
    cfg.model.tensor_model_parallel_size, cfg.model.pipeline_model_parallel_size = tp, pp
    found = [v for v in check(cfg, world_size=8) if v.rule_id == "cuda_graphs.capture_host_reads"]
    if named is None:
        assert found == []
        return
    [verdict] = found
    sizes = {"model.tensor_model_parallel_size": tp, "model.pipeline_model_parallel_size": pp}
    assert (verdict.severity, verdict.fields) == (
        "undetermined",
        {"model.cuda_graph_impl": "full_iteration"} | {k: v for k, v in sizes.items() if v > 1},
    )
    assert verdict.not_run == (
        f"the capture ran in a one-rank CPU world; {named} (tensor-parallel collectives, the pipeline schedule's "
        "sends and receives) was not run"
    )
    assert verdict.fix.startswith("run one training step under the full-iteration graph on the GPUs first, or ")
