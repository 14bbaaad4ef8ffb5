"""The gap rules against the code that fails (issue #32): each test runs the installed Megatron-Bridge /
Megatron-Core / Transformer Engine function that asserts or raises, on CPU, and shows the rule firing exactly where
it fails and quiet on the near-miss. Process groups of the sizes a layer checks come from torch's in-process fake
backend; modules whose constructor needs a GPU are made with ``__new__`` and given the attributes the checked code
reads (as tests/rules/test_attention_evidence.py does)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from mbridge_seqpack import check

pytestmark = pytest.mark.slow


def _ids(cfg: Any, world: int = 8) -> set[str]:
    return {v.rule_id for v in check(cfg, world_size=world) if v.severity == "error"}


def _packed_params() -> Any:
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=5, max_seqlen_kv=5)


def _config(**fields: Any) -> Any:
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(**{"num_layers": 1, "hidden_size": 64, "num_attention_heads": 4, **fields})


@pytest.fixture(scope="module")
def groups() -> Any:
    """Process groups of size 1, 2, 4 and 8 (torch's fake backend: sizes and ranks, no communication)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        yield {n: dist.new_group(list(range(n))) for n in (1, 2, 4, 8)}
    finally:
        dist.destroy_process_group()


def _hybrid(cfg: Any, **fields: Any) -> Any:
    from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider

    shape = dict(hidden_size=256, num_attention_heads=4, mamba_num_heads=8, mamba_head_dim=32, mamba_num_groups=8)
    cfg.model = HybridModelProvider(
        hybrid_layer_pattern="M*M-", vocab_size=1024, seq_length=4096, is_hybrid_model=True, **(shape | fields)
    )
    return cfg


# ---- Mamba ---------------------------------------------------------------------------------------------------
def _megatron_mamba_split(groups: Any, heads: int, n_groups: int, tp: int, cp: int) -> str | None:
    """The assertion MambaMixer.__init__ (TP) or MambaContextParallel.__init__ (CP) raises, else None."""
    import megatron.core.ssm.mamba_mixer as mamba_mixer
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.ssm.mamba_context_parallel import MambaContextParallel

    config = _config(mamba_num_heads=heads, mamba_head_dim=16, mamba_num_groups=n_groups, use_cpu_initialization=True)
    pg = ProcessGroupCollection(tp=groups[tp], cp=groups[cp])
    try:
        mamba_mixer.MambaMixer(config, mamba_mixer.MambaMixerSubmodules(), d_model=64, pg_collection=pg)
    except AssertionError as exc:
        return str(exc)
    except AttributeError:
        pass  # past the TP checks: building in_proj from the empty submodules is the next step
    zero = torch.zeros(1)
    try:
        MambaContextParallel(
            cp_group=groups[cp], d_inner_local_tp=heads // tp * 16, nheads_local_tp=heads // tp,
            ngroups_local_tp=n_groups // tp, d_state=4, conv1d_weight_cp1=zero, conv1d_bias_cp1=zero,
            conv1d_padding=3, dt_bias_cp1=zero, A_log_cp1=zero, D_cp1=zero, D_has_hdim=False,
        )  # fmt: skip
    except AssertionError as exc:
        return str(exc)
    return None


@pytest.mark.evidence("mamba.heads_divisible")
def test_mamba_heads_and_groups_split_exactly_where_megatron_core_asserts(
    groups: Any, monkeypatch: pytest.MonkeyPatch, packed_cfg: Any
) -> None:
    """MambaMixer.__init__'s TP asserts (past its mamba_ssm import guard, which the CPU stack lacks) and
    MambaContextParallel.__init__'s CP asserts, over a grid; then the rule on a real config for each refusal kind."""
    import megatron.core.ssm.mamba_mixer as mamba_mixer

    from mbridge_seqpack.rules.mamba import mamba_split_problem

    monkeypatch.setattr(mamba_mixer, "HAVE_MAMBA_SSM", True)
    seen = set()
    for heads, n_groups, tp, cp in itertools.product((4, 6, 8, 12, 24), (1, 2, 3, 4, 6), (1, 2, 4), (1, 2, 4, 8)):
        if heads % n_groups:
            continue  # 'nheads must be evenly divisible by ngroups': the architecture, not the layout
        megatron = _megatron_mamba_split(groups, heads, n_groups, tp, cp)
        ours = mamba_split_problem(heads, n_groups, tp, cp)
        assert (megatron is None) == (ours is None), (heads, n_groups, tp, cp, megatron, ours)
        if megatron is not None:
            seen.add(megatron)
            assert megatron in ours  # the rule quotes the assertion it predicts
    assert seen == {
        "nheads must be evenly divisble by tp_size",
        "ngroups must be evenly divisible by tp_size",
        "nheads must be evenly divisible by tp_size * cp_size",
        "cp_size must be evenly divisible by ngroups/tp_size",
        "ngroups must be evenly divisible by tp_size * cp_size",
    }
    cfg = _hybrid(packed_cfg, mamba_num_heads=12, mamba_num_groups=2)
    cfg.model.tensor_model_parallel_size = 2
    assert _ids(cfg) == set()  # 6 heads and 1 group a TP rank
    cfg.model.tensor_model_parallel_size = 4
    assert _ids(cfg) == {"mamba.heads_divisible"}  # 2 groups over TP 4
    cfg.model.tensor_model_parallel_size, cfg.model.context_parallel_size = 2, 4
    cfg.model.calculate_per_token_loss, cfg.ddp.average_in_collective = True, False
    cfg.dataset.offline_packing_specs.pad_seq_to_mult = 8
    assert _ids(cfg) == {"mamba.heads_divisible"}  # 6 heads a TP rank over CP 4


@pytest.mark.evidence("mamba.packing_needs_mem_eff_path")
def test_mamba_refuses_packed_rows_off_the_memory_efficient_path(groups: Any, packed_cfg: Any) -> None:
    import megatron.core.ssm.mamba_mixer as mamba_mixer
    from megatron.core.ssm.mamba_context_parallel import MambaContextParallel

    zero = torch.zeros(1)
    mixer = mamba_mixer.MambaMixer.__new__(mamba_mixer.MambaMixer)
    torch.nn.Module.__init__(mixer)
    mixer.config, mixer.use_mem_eff_path = _config(), False
    mixer.in_proj = lambda hidden: (hidden, None)  # the input projection's (output, bias); CP 1 passes it through
    mixer.cp = MambaContextParallel(groups[1], 64, 4, 2, 4, zero, zero, 3, zero, zero, zero, False)
    with pytest.raises(AssertionError, match="Training with packed sequences is not supported in the non-memory"):
        mixer.forward(torch.zeros(8, 1, 64), packed_seq_params=_packed_params())
    cfg = _hybrid(packed_cfg, use_mamba_mem_eff_path=False)
    assert _ids(cfg) == {"mamba.packing_needs_mem_eff_path"}
    cfg.model.use_mamba_mem_eff_path = True
    assert _ids(cfg) == set()


def test_the_nemotron_h_4b_recipes_pack_through_the_path_that_refuses_packing(megatron_bridge: Any) -> None:
    """Megatron-Bridge 0.6.2 ships them with offline packing (from _sft_common) and use_mamba_mem_eff_path=False."""
    import warnings

    from megatron.bridge.recipes.nemotronh.h100 import nemotronh

    for recipe in (
        nemotronh.nemotronh_4b_sft_1gpu_h100_bf16_config,
        nemotronh.nemotronh_4b_peft_1gpu_h100_bf16_config,
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = recipe()
        assert cfg.dataset.enable_offline_packing and cfg.model.use_mamba_mem_eff_path is False
        (v,) = [v for v in check(cfg, world_size=1) if v.rule_id == "mamba.packing_needs_mem_eff_path"]
        assert v.overrides == ["model.use_mamba_mem_eff_path=true"]


# ---- gated delta net -----------------------------------------------------------------------------------------
@pytest.mark.evidence("gdn.packing_deterministic")
def test_gated_delta_net_refuses_packed_rows_in_deterministic_mode(packed_cfg: Any) -> None:
    from megatron.core.ssm.gated_delta_net.gdn import GatedDeltaNet

    layer = GatedDeltaNet.__new__(GatedDeltaNet)
    torch.nn.Module.__init__(layer)
    layer.config, layer.sp_size, layer.cp_size = _config(deterministic_mode=True), 1, 1
    with pytest.raises(AssertionError, match="Packed sequence does not support deterministic mode"):
        layer.forward(torch.zeros(8, 1, 64), None, packed_seq_params=_packed_params())
    layer.config.deterministic_mode = False
    with pytest.raises(AttributeError, match="in_proj"):  # past the check: the input projection comes next
        layer.forward(torch.zeros(8, 1, 64), None, packed_seq_params=_packed_params())

    packed_cfg.model.experimental_attention_variant = "gated_delta_net"
    packed_cfg.model.cross_entropy_loss_fusion = False
    packed_cfg.env_vars = {**packed_cfg.env_vars, "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}
    assert _ids(packed_cfg) == set()
    packed_cfg.model.deterministic_mode = True
    assert _ids(packed_cfg) == {"gdn.packing_deterministic"}
    packed_cfg.dataset.enable_offline_packing, packed_cfg.dataset.offline_packing_specs = False, None
    assert "gdn.packing_deterministic" not in _ids(packed_cfg)  # unpacked rows take the other branch


# ---- attention / RoPE ----------------------------------------------------------------------------------------
@pytest.mark.evidence("rope.fused_single_qkv")
def test_fused_single_qkv_rope_asserts_where_self_attention_splits_qkv(packed_cfg: Any) -> None:
    from megatron.core.transformer.attention import HAVE_FUSED_QKV_ROPE, SelfAttention

    assert HAVE_FUSED_QKV_ROPE  # the pinned TE has the kernel: only the config decides
    attention = SelfAttention.__new__(SelfAttention)
    torch.nn.Module.__init__(attention)
    attention.config = _config(fused_single_qkv_rope=True)
    attention.layer_number, attention.attention_type = 1, "self"
    attention.q_layernorm = attention.k_layernorm = None
    emb, hidden = torch.zeros(8, 1, 1, 16), torch.zeros(8, 1, 64)
    message = "fused_single_qkv_rope requested but not available/supported for the config"
    with pytest.raises(AssertionError, match=message):
        attention.forward(hidden, None, rotary_pos_emb=emb, packed_seq_params=_packed_params())
    with pytest.raises(AssertionError, match=message):
        attention.forward(hidden, None, rotary_pos_emb=None)  # a layer without RoPE
    with pytest.raises(AttributeError, match="offload_qkv_linear"):  # unpacked, with RoPE: past the check
        attention.forward(hidden, None, rotary_pos_emb=emb)
    attention.q_layernorm = torch.nn.LayerNorm(16)
    with pytest.raises(AssertionError, match=message):
        attention.forward(hidden, None, rotary_pos_emb=emb)

    packed_cfg.model.fused_single_qkv_rope = True
    assert _ids(packed_cfg) == {"rope.fused_single_qkv"}
    packed_cfg.dataset.enable_offline_packing, packed_cfg.dataset.offline_packing_specs = False, None
    packed_cfg.model.position_embedding_type = "rope"
    assert _ids(packed_cfg) == set()
    packed_cfg.model.qk_layernorm = True
    assert _ids(packed_cfg) == {"rope.fused_single_qkv"}


@pytest.mark.evidence("rope.qwen3_vl_no_fusion")
def test_qwen3_vl_attention_refuses_rope_fusion(qwen3vl_cfg: Any) -> None:
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.rope import apply_rotary_pos_emb_absolute

    qwen3vl_cfg.model.apply_rope_fusion = True  # what an override does; the provider defaults it to False
    with pytest.raises(AssertionError, match="apply_rope_fusion is not supported for Qwen3-VL"):
        apply_rotary_pos_emb_absolute(torch.zeros(4, 1, 2, 8), torch.zeros(4, 1, 1, 8), qwen3vl_cfg.model)
    assert _ids(qwen3vl_cfg) == {"rope.qwen3_vl_no_fusion"}
    qwen3vl_cfg.model.apply_rope_fusion = False
    assert _ids(qwen3vl_cfg) == set()


@pytest.mark.evidence("rope.yarn_not_interleaved")
def test_yarn_refuses_interleaved_rotary_embeddings(unpacked_cfg: Any) -> None:
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding

    yarn = YarnRotaryEmbedding.__new__(YarnRotaryEmbedding)
    torch.nn.Module.__init__(yarn)
    yarn.rotary_interleaved = True
    with pytest.raises(AssertionError, match="Yarn RoPE does not support interleaved rotary embeddings"):
        yarn.get_emb(16)
    unpacked_cfg.model.position_embedding_type = "yarn"
    unpacked_cfg.model.rotary_interleaved = True
    assert _ids(unpacked_cfg) == {"rope.yarn_not_interleaved"}
    unpacked_cfg.model.position_embedding_type = "rope"
    assert _ids(unpacked_cfg) == set()


# ---- MoE ------------------------------------------------------------------------------------------------------
@pytest.mark.evidence("moe.quantile_balancing_tokens")
@pytest.mark.parametrize(("experts", "topk", "row_multiple"), [(60, 4, 16), (60, 4, 240), (64, 8, 16), (6, 2, 16)])
def test_quantile_balancing_needs_token_counts_the_router_splits_evenly(
    packed_cfg: Any, experts: int, topk: int, row_multiple: int
) -> None:
    """Every width a packed row can take (multiples of pad_seq_length_to_mult, up to the pack size) through
    qb_dual_update; the rule fires exactly when one of them fails."""
    from megatron.core.transformer.moe.moe_utils import qb_dual_update

    size = 1920  # a multiple of 16, 64 and 240
    failing = []
    for width in range(row_multiple, size + 1, row_multiple):
        try:
            qb_dual_update(torch.randn(width, experts), topk, torch.zeros(experts))
        except AssertionError as exc:
            assert "Quantile balancing requires the number of routed assignments" in str(exc)
            failing.append(width)
    packed_cfg.model.num_moe_experts, packed_cfg.model.moe_router_topk = experts, topk
    packed_cfg.model.moe_router_load_balancing_type, packed_cfg.model.moe_aux_loss_coeff = "quantile_balancing", 0.0
    packed_cfg.dataset.dataset_kwargs["pad_seq_length_to_mult"] = row_multiple
    for name in ("model.seq_length", "dataset.seq_length", "dataset.offline_packing_specs.packed_sequence_size"):
        from mbridge_seqpack.config_paths import set_path

        set_path(packed_cfg, name, size)
    assert ("moe.quantile_balancing_tokens" in _ids(packed_cfg)) == bool(failing), failing
    assert bool(failing) == ((experts, row_multiple) in {(60, 16), (6, 16)})


@pytest.mark.evidence("moe.tp_needs_sequence_parallel")
def test_moe_layers_refuse_tensor_parallelism_without_sequence_parallelism(groups: Any, packed_cfg: Any) -> None:
    from megatron.core.transformer.moe.moe_layer import MoELayer

    layer = MoELayer.__new__(MoELayer)
    torch.nn.Module.__init__(layer)
    layer.config, layer.attn_tp_group = _config(num_moe_experts=4, add_bias_linear=False), groups[2]
    with pytest.raises(ValueError, match="MoE and tensor parallelism"):
        layer.forward(torch.zeros(8, 1, 64))
    layer.config.sequence_parallel = True
    with pytest.raises(AttributeError):  # past the check
        layer.forward(torch.zeros(8, 1, 64))
    packed_cfg.model.num_moe_experts, packed_cfg.model.tensor_model_parallel_size = 4, 2
    assert _ids(packed_cfg) == {"moe.tp_needs_sequence_parallel"}
    packed_cfg.model.sequence_parallel = True
    assert _ids(packed_cfg) == set()


@pytest.mark.evidence("moe.flex_dispatcher_parallel")
def test_flex_dispatchers_need_an_expert_parallel_group(groups: Any, packed_cfg: Any) -> None:
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe.token_dispatcher import MoEFlexTokenDispatcher

    config = _config(num_moe_experts=4, moe_token_dispatcher_type="flex", moe_router_topk=2, add_bias_linear=False)
    one = {name: groups[1] for name in ("tp", "cp", "ep", "expt_tp", "tp_ep", "expt_dp", "tp_cp")}
    with pytest.raises(AssertionError, match="DeepEP dispatcher requires TPxEP > 1"):
        MoEFlexTokenDispatcher(4, [0, 1, 2, 3], config, pg_collection=ProcessGroupCollection(**one))
    with pytest.raises(Exception) as past:  # EP 2: past the check, into DeepEP's own setup
        MoEFlexTokenDispatcher(2, [0, 1], config, pg_collection=ProcessGroupCollection(**{**one, "ep": groups[2]}))
    assert "requires TPxEP" not in str(past.value)
    packed_cfg.model.num_moe_experts, packed_cfg.model.moe_token_dispatcher_type = 4, "flex"
    assert _ids(packed_cfg) == {"moe.flex_dispatcher_parallel"}
    packed_cfg.model.expert_model_parallel_size = 2
    assert "moe.flex_dispatcher_parallel" not in _ids(packed_cfg)


@pytest.mark.evidence("moe.router_options")
def test_router_option_pairs_megatron_core_refuses(packed_cfg: Any) -> None:
    from megatron.core.transformer.moe.router import TopKRouter

    router = TopKRouter.__new__(TopKRouter)
    torch.nn.Module.__init__(router)
    router.config = _config(num_moe_experts=4, moe_aux_loss_coeff=0.01, add_bias_linear=False)
    with pytest.raises(AssertionError, match="Sinkhorn routing does not support aux loss"):
        router.sinkhorn_load_balancing(torch.randn(8, 4))
    router.config.moe_router_fusion = True
    with pytest.raises(AssertionError, match="Quantile balancing routing does not support moe_router_fusion"):
        router.quantile_balancing(torch.randn(8, 4))
    packed_cfg.model.num_moe_experts = 4
    packed_cfg.model.moe_router_load_balancing_type, packed_cfg.model.moe_aux_loss_coeff = "sinkhorn", 0.01
    assert _ids(packed_cfg) == {"moe.router_options"}
    packed_cfg.model.moe_aux_loss_coeff = 0.0
    assert _ids(packed_cfg) == set()
    packed_cfg.model.moe_router_load_balancing_type, packed_cfg.model.moe_router_fusion = "quantile_balancing", True
    (v,) = [v for v in check(packed_cfg, world_size=8) if v.rule_id == "moe.router_options"]
    assert v.assignments == {"model.moe_router_fusion": False}


# ---- process groups -------------------------------------------------------------------------------------------
@pytest.mark.evidence("process_groups.optimizer_instances", "process_groups.sharp_group")
def test_process_group_options_initialize_model_parallel_refuses(groups: Any, packed_cfg: Any) -> None:
    """Megatron-Core's initialize_model_parallel over a fake world of 8 (TP 1, PP 1: DP 8)."""
    from megatron.core import parallel_state

    def refusal(**options: Any) -> str | None:
        try:
            parallel_state.initialize_model_parallel(1, 1, **options)
        except AssertionError as exc:
            return str(exc)
        except Exception:  # noqa: BLE001 - past the checks: the fake backend cannot make every group kind
            return None
        finally:
            parallel_state.destroy_model_parallel()
        return None

    assert refusal(num_distributed_optimizer_instances=3) == (
        "Data parallel size should be divisible by partial DistOpt shard factor"
    )
    assert refusal(num_distributed_optimizer_instances=2) is None
    assert (
        refusal(use_sharp=False, sharp_enabled_group="dp")
        == "sharp_enabled_group is only valid when use_sharp is True"
    )
    assert refusal(use_sharp=True, sharp_enabled_group="dp_replica") == (
        "dp_replica group requires num_distributed_optimizer_instances > 1"
    )
    packed_cfg.ddp.num_distributed_optimizer_instances = 3
    assert _ids(packed_cfg) == {"process_groups.optimizer_instances"}
    packed_cfg.ddp.num_distributed_optimizer_instances = 2
    assert _ids(packed_cfg) == set()
    packed_cfg.dist.use_sharp, packed_cfg.dist.sharp_enabled_group = True, "dp_replica"
    assert _ids(packed_cfg) == set()
    packed_cfg.ddp.num_distributed_optimizer_instances = 1
    assert _ids(packed_cfg) == {"process_groups.sharp_group"}


# ---- values Megatron dispatches on ----------------------------------------------------------------------------
@pytest.mark.evidence("config.known_values")
def test_unknown_values_fail_in_the_code_that_dispatches_on_them(packed_cfg: Any) -> None:
    from megatron.bridge.data.samplers import build_pretraining_data_loader
    from megatron.core.extensions.transformer_engine import TENorm
    from megatron.core.fp8_utils import get_fp8_recipe
    from megatron.core.transformer.moe.moe_utils import apply_router_token_dropping, topk_routing_with_score_function

    from mbridge_seqpack.rules.config import declared_choices

    config = _config()
    config.fp8, config.fp8_recipe = "e4m3", "mxfp9"
    with pytest.raises(ValueError, match="are the only supported FP8 recipes"):
        get_fp8_recipe(config)
    config.fp8 = "e5m2"
    with pytest.raises(ValueError, match="E4M3 and HYBRID are the only supported FP8 formats"):
        get_fp8_recipe(config)
    config.normalization = "RMSnorm"
    with pytest.raises(Exception, match="Only LayerNorm and RMSNorm are currently supported"):
        TENorm(config, 64)
    with pytest.raises(ValueError, match="Invalid score_function: softmaks"):
        topk_routing_with_score_function(torch.randn(4, 8), 2, score_function="softmaks")
    probs, routing = torch.rand(4, 8), torch.ones(4, 8, dtype=torch.bool)
    with pytest.raises(ValueError, match="Invalid drop_policy"):
        apply_router_token_dropping(probs, routing, router_topk=2, capacity_factor=1.0, drop_policy="prob")
    with pytest.raises(Exception, match="batched"):
        build_pretraining_data_loader(list(range(8)), 0, "batched", 1, 0, False)

    assert declared_choices(packed_cfg.dataset, "dataloader_type") == {"single", "cyclic", "batch", "external", None}
    assert declared_choices(packed_cfg.model, "normalization") == {"LayerNorm", "RMSNorm"}
    assert declared_choices(packed_cfg.model, "fp8_recipe") == {
        "tensorwise",
        "delayed",
        "mxfp8",
        "blockwise",
        "custom",
        None,
    }
    packed_cfg.model.moe_router_score_function = "softmaks"  # a dense model never routes: not reached
    assert _ids(packed_cfg) == set()
    packed_cfg.model.num_moe_experts = 4
    (v,) = [v for v in check(packed_cfg, world_size=8) if v.rule_id == "config.known_values"]
    assert v.fields == {"model.moe_router_score_function": "softmaks"}
    assert v.overrides == ["model.moe_router_score_function=softmax"]


# ---- the offline prep and the packed dataset ----------------------------------------------------------------------
@pytest.mark.evidence("offline.pad_multiple_within_length")
def test_the_prep_refuses_a_pad_multiple_above_the_longest_sequence(tiny_pack: Any, packed_cfg: Any) -> None:
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.bridge.data.packing.offline import tokenize_dataset

    with pytest.raises(ValueError, match=r"max_seq_length \(64\) must be at least the effective padding multiple"):
        tokenize_dataset(tiny_pack / "training.jsonl", None, 64, 1234, {}, pad_seq_to_mult=128,
                         dataset_builder=build_gpt_sft_split)  # fmt: skip
    packed_cfg.dataset.offline_packing_specs.pad_seq_to_mult = 8192
    assert _ids(packed_cfg) == {"offline.pad_multiple_within_length"}
    packed_cfg.dataset.offline_packing_specs.packed_train_data_path = str(
        tiny_pack / "pack" / "training_64.idx.parquet"
    )
    assert "offline.pad_multiple_within_length" not in _ids(packed_cfg)  # the pack exists: the prep is skipped


@pytest.mark.evidence("offline.no_p_tuning")
def test_the_packed_dataset_refuses_p_tuning_tokens(tiny_pack: Any, packed_cfg: Any) -> None:
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split

    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    def build(packed: bool) -> Any:
        return build_gpt_sft_split(
            tiny_pack / "pack" / "training_64.idx.parquet" if packed else tiny_pack / "training.jsonl",
            tokenizer=load_megatron_tokenizer(embedded_tokenizer_dir()), seq_length=64, memmap_workers=1, seed=1234,
            packed_sequence_size=64 if packed else -1, pack_metadata_path=tiny_pack / "pack" / "64_metadata.jsonl",
            dataset_kwargs={"virtual_tokens": 2},
        )  # fmt: skip

    assert build(packed=False).virtual_tokens == 2  # the unpacked dataset takes the key
    with pytest.raises(AssertionError, match="P-Tuning with packed sequence is not supported"):
        build(packed=True)
    packed_cfg.dataset.dataset_kwargs["virtual_tokens"] = 2
    assert _ids(packed_cfg) == {"offline.no_p_tuning"}


@pytest.mark.evidence("gpt_sft.prompt_template")
@pytest.mark.parametrize(
    ("kwargs", "raised"),
    [
        ({"prompt_template": "Q: {input}\\nA: {output}\\n"}, "{output} must be at the end of prompt_template."),
        ({"prompt_template": "{question} {output}"}, "truncation_fields ['input'] must in ['question', 'output']"),
        ({"prompt_template": "{question} {output}", "truncation_field": "question"}, None),
        ({"prompt_template": "Q: {input}\\nA: {output}"}, None),
    ],
)
def test_legacy_prompt_templates_are_refused_where_the_dataset_asserts(
    tiny_pack: Any,  # noqa: F811
    unpacked_cfg: Any,
    kwargs: dict[str, Any],
    raised: str | None,
) -> None:
    """Megatron-Bridge's builder over the JSONL split, as the packing prep and the unpacked run build it."""
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split

    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    try:
        build_gpt_sft_split(
            tiny_pack / "training.jsonl", tokenizer=load_megatron_tokenizer(embedded_tokenizer_dir()), seq_length=64,
            memmap_workers=1, seed=1234, packed_sequence_size=-1, dataset_kwargs=dict(kwargs),
        )  # fmt: skip
        error = None
    except AssertionError as exc:
        error = str(exc)
    assert error == raised
    unpacked_cfg.dataset.dataset_kwargs.update(kwargs)
    assert ("gpt_sft.prompt_template" in _ids(unpacked_cfg)) == (raised is not None)


@pytest.mark.evidence("gpt_sft.prompt_template")
def test_an_unknown_truncation_method_raises_at_the_first_truncated_example(tiny_pack: Any, unpacked_cfg: Any) -> None:  # noqa: F811
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split

    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    dataset = build_gpt_sft_split(
        tiny_pack / "training.jsonl",
        tokenizer=load_megatron_tokenizer(embedded_tokenizer_dir()),
        seq_length=4,
        memmap_workers=1,
        seed=1234,
        packed_sequence_size=-1,
        dataset_kwargs={"truncation_method": "middle"},
    )  # fmt: skip  (built fine: the method is read only when a row needs cutting)
    with pytest.raises(ValueError, match="middle is not supported"):
        dataset[0]  # every example is longer than 4 tokens
    unpacked_cfg.dataset.dataset_kwargs["truncation_method"] = "middle"
    assert _ids(unpacked_cfg) == {"gpt_sft.prompt_template"}


@pytest.mark.evidence("te.qk_layer_scaling_env")
def test_te_attention_reads_query_key_layer_scaling_from_the_environment(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron.core.extensions.transformer_engine import TEDotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    monkeypatch.delenv("NVTE_APPLY_QK_LAYER_SCALING", raising=False)
    config = _config(apply_query_key_layer_scaling=True)
    with pytest.raises(ValueError, match="apply_query_key_layer_scaling is True but environment variable"):
        TEDotProductAttention(config, 1, AttnMaskType.causal, "self")
    monkeypatch.setenv("NVTE_APPLY_QK_LAYER_SCALING", "1")
    try:
        TEDotProductAttention(config, 1, AttnMaskType.causal, "self")
    except Exception as exc:  # noqa: BLE001 - past the check, TE's own setup may need a GPU
        assert "NVTE_APPLY_QK_LAYER_SCALING" not in str(exc)
    monkeypatch.delenv("NVTE_APPLY_QK_LAYER_SCALING")
    packed_cfg.model.apply_query_key_layer_scaling = True
    assert _ids(packed_cfg) == {"te.qk_layer_scaling_env"}
    packed_cfg.env_vars = {**packed_cfg.env_vars, "NVTE_APPLY_QK_LAYER_SCALING": "1"}
    assert _ids(packed_cfg) == set()


@pytest.mark.evidence("offline.train_split_rows")
def test_a_packed_training_split_shorter_than_a_global_batch_fails_when_the_loaders_are_built(
    groups: Any,
    tiny_pack: Any,  # noqa: F811
    packed_cfg: Any,
) -> None:
    """Megatron-Bridge's build_train_valid_test_data_loaders over its own GPT SFT provider and a one-row pack, in a
    fake world of 8 (DP 8)."""
    import functools

    from megatron.bridge.data.builders.gpt_sft import gpt_sft_train_valid_test_datasets_provider
    from megatron.bridge.data.loaders import build_train_valid_test_data_loaders
    from megatron.bridge.training.state import TrainState

    from mbridge_seqpack.config_paths import set_path
    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    pack = tiny_pack / "pack" / "training_64.idx.parquet"
    for path, value in {
        "model.seq_length": 64,
        "dataset.seq_length": 64,
        "dataset.dataset_root": str(tiny_pack),
        "dataset.do_validation": False,
        "dataset.offline_packing_specs.packed_sequence_size": 64,
        "dataset.offline_packing_specs.packed_train_data_path": str(pack),
    }.items():
        set_path(packed_cfg, path, value)
    provider = functools.partial(
        gpt_sft_train_valid_test_datasets_provider, tokenizer=load_megatron_tokenizer(embedded_tokenizer_dir())
    )

    def loaders() -> Any:
        return build_train_valid_test_data_loaders(packed_cfg, TrainState(), provider, groups[8])

    with pytest.raises(RuntimeError, match=r"Not enough train samples for a single global batch: train dataset size"):
        loaders()
    (v,) = [v for v in check(packed_cfg, world_size=8) if v.rule_id == "offline.train_split_rows"]
    assert v.fields["train.global_batch_size"] == 16 and v.fields["training rows"] < 16
    packed_cfg.dataset.max_train_samples = v.assignments["dataset.max_train_samples"]
    assert "offline.train_split_rows" not in _ids(packed_cfg)
    packed_cfg.dataset.max_train_samples = 16  # the least the check asks for (the fix asks for the whole run)
    with pytest.raises(RuntimeError) as past:  # past the check: the rows repeat up to 16 samples, and the loaders
        loaders()  # go on to the step that needs a GPU
    assert "Not enough train samples" not in str(past.value)


# ---- low precision ----------------------------------------------------------------------------------------------
@pytest.mark.evidence("fp8.mxfp8_attention_sequence")
def test_mxfp8_attention_quantizes_128_token_blocks_of_each_row(
    unpacked_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config
    from transformer_engine.pytorch.attention.dot_product_attention.utils import combine_and_quantize
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

    quantizer = MXFP8Quantizer.__new__(MXFP8Quantizer)  # the shape checks only; quantizing needs a GPU
    with pytest.raises(AssertionError, match="MXFP8 quantization requires s_q % 128 == 0"):
        combine_and_quantize("sbhd_sbhd_sbhd", *[torch.zeros(112, 1, 2, 64)] * 3, quantizer)
    with pytest.raises(AttributeError):  # 128 tokens, 64-wide heads: past the check
        combine_and_quantize("sbhd_sbhd_sbhd", *[torch.zeros(128, 1, 2, 64)] * 3, quantizer)
    monkeypatch.setenv("MBRIDGE_SEQPACK_GPU_ARCH", "sm100")  # where TE runs MXFP8 attention (cuDNN >= 9.21)
    monkeypatch.setenv("MBRIDGE_SEQPACK_CUDNN_VERSION", "9.21.0")
    unpacked_cfg.mixed_precision = get_mixed_precision_config("bf16_with_mxfp8_mixed")
    assert "fp8.mxfp8_attention_sequence" not in _ids(unpacked_cfg)  # FP8 attention off
    unpacked_cfg.mixed_precision.fp8_dot_product_attention = True
    assert "fp8.mxfp8_attention_sequence" in _ids(unpacked_cfg)  # rows padded to 16-token multiples
    unpacked_cfg.dataset.dataset_kwargs["pad_seq_length_to_mult"] = 128
    assert _ids(unpacked_cfg) == set()


@pytest.mark.evidence("fp8.row_tokens_per_rank")
def test_collate_packed_rows_are_any_length_for_fp8_gemms(vlm_cfg: Any) -> None:
    """At CP=1 the collate pads each sequence to 1: the THD row is as long as the sequences' sum."""
    from megatron.bridge.data.packing.in_batch import build_mcore_thd_sequence_batch_from_rows
    from transformer_engine.pytorch.utils import assert_dim_for_fp8_exec

    rows = [{"input_ids": torch.arange(n), "position_ids": torch.arange(n)} for n in (5, 6)]
    packed = build_mcore_thd_sequence_batch_from_rows(rows, pad_to_multiple_of=1)
    tokens = packed["input_ids"].shape[1]
    assert tokens == 11
    with pytest.raises(ValueError, match="FP8 execution requires the product of all dimensions except the last"):
        assert_dim_for_fp8_exec(torch.empty(tokens, 1, 64), torch.empty(64, 64))
    assert _ids(vlm_cfg) == set()
    vlm_cfg.mixed_precision = "bf16_with_fp8_current_scaling_mixed"
    assert _ids(vlm_cfg) == {"fp8.row_tokens_per_rank"}


@pytest.mark.evidence("mtp.full_recompute_layers")
def test_mtp_recompute_takes_one_layer_a_unit(unpacked_cfg: Any) -> None:
    from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionLayer

    layer = MultiTokenPredictionLayer.__new__(MultiTokenPredictionLayer)
    torch.nn.Module.__init__(layer)
    hidden = torch.zeros(4, 1, 64)
    for layers, raised in ((2, AssertionError), (1, Exception)):  # 1: past the check, into the checkpoint (a GPU)
        layer.config = _config(
            num_layers=2, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=layers
        )
        with pytest.raises(raised) as exc:
            layer._checkpointed_forward(hidden, hidden)
        assert ("recompute_num_layers must be 1 for MTP recompute" in str(exc.value)) == (layers == 2)
    unpacked_cfg.model.mtp_num_layers = 1
    unpacked_cfg.model.recompute_granularity, unpacked_cfg.model.recompute_method = "full", "uniform"
    unpacked_cfg.model.recompute_num_layers = 2
    assert _ids(unpacked_cfg) == {"mtp.full_recompute_layers"}
    unpacked_cfg.model.recompute_num_layers = 1
    assert _ids(unpacked_cfg) == set()


# ---- context parallelism: the a2a head scatter and the hierarchical levels ------------------------------------------
@pytest.mark.evidence("cp.a2a_heads_divisible")
def test_a2a_cp_scatters_heads_only_where_each_rank_holds_a_multiple_of_cp(groups: Any, packed_cfg: Any) -> None:
    """TE's AttnFuncWithCPAndQKVOA2A.forward on the rank-local THD q, k, v (12 query heads, 2 or 4 key/value heads)
    over a CP group of 4: it asserts before its first exchange where the key/value heads do not divide by 4."""
    from transformer_engine.pytorch.attention.dot_product_attention.context_parallel import AttnFuncWithCPAndQKVOA2A

    def refusal(kv_heads: int) -> str | None:
        cu = torch.tensor([0, 8], dtype=torch.int32)
        q, kv = torch.zeros(8, 12, 16), torch.zeros(8, kv_heads, 16)
        try:
            AttnFuncWithCPAndQKVOA2A.forward(
                None, True, q, kv, kv, cu, cu, 8, 8, cu, cu, 0.0, None, "thd", "padding_causal", "no_bias", None,
                False, True, False, None, (-1, 0), False, None, groups[4], None, None, False, False, False,
                "vanilla", None, False,
            )  # fmt: skip
        except AssertionError as exc:
            return str(exc)
        except Exception:  # noqa: BLE001 - past the checks: the exchange and the fused kernel need a GPU
            return None
        return None

    assert refusal(2) == (
        "cp_comm_type='a2a' requires num_heads % cp_size == 0 for Q, K, V. Found num_heads_q = 12, "
        "num_heads_kv = 2, cp_size = 4."
    )
    assert refusal(4) is None
    for name, value in {"context_parallel_size": 4, "calculate_per_token_loss": True, "cp_comm_type": "a2a"}.items():
        setattr(packed_cfg.model, name, value)
    packed_cfg.ddp.average_in_collective = False
    packed_cfg.dataset.offline_packing_specs.pad_seq_to_mult = 8
    packed_cfg.model.num_query_groups = 2
    assert _ids(packed_cfg) == {"cp.a2a_heads_divisible"}
    packed_cfg.model.num_query_groups = 4
    assert _ids(packed_cfg) == set()


@pytest.mark.evidence("cp.hierarchical_sizes_product")
def test_hierarchical_cp_levels_must_multiply_to_cp_where_initialize_model_parallel_asserts(
    groups: Any, unpacked_cfg: Any
) -> None:
    """Megatron-Core's initialize_model_parallel over a fake world of 8 at CP 8, without the gloo groups the fake
    backend cannot make (its assert has no message: the failing line is read from the traceback)."""
    import traceback

    from megatron.core import parallel_state

    def refused(sizes: list[int]) -> bool:
        try:
            parallel_state.initialize_model_parallel(
                1, 1, context_parallel_size=8, hierarchical_context_parallel_sizes=sizes,
                create_gloo_process_groups=False,
            )  # fmt: skip
        except AssertionError as exc:
            line = traceback.extract_tb(exc.__traceback__)[-1].line
            assert line == "assert np.prod(hierarchical_context_parallel_sizes) == context_parallel_size"
            return True
        finally:
            parallel_state.destroy_model_parallel()
        return False

    assert refused([2, 2]) and refused([4, 4])
    assert not refused([4, 2]) and not refused([])  # an empty list is checked as none: no groups, no assert
    model = unpacked_cfg.model
    model.context_parallel_size, model.calculate_per_token_loss, model.cp_comm_type = 8, True, "a2a+p2p"
    unpacked_cfg.ddp.average_in_collective = False
    for sizes, flagged in (([2, 2], True), ([4, 4], True), ([4, 2], False), ([], False)):
        model.hierarchical_context_parallel_sizes = sizes
        assert ("cp.hierarchical_sizes_product" in _ids(unpacked_cfg)) == flagged, sizes
    # [] under a2a+p2p: initialize_model_parallel makes the hierarchical groups only `if sizes:`, so none are made,
    # the crash cp.hierarchical_sizes_required names
    model.hierarchical_context_parallel_sizes = []
    assert "cp.hierarchical_sizes_required" in _ids(unpacked_cfg)
    model.cp_comm_type = "p2p"
    assert not {"cp.hierarchical_sizes_required", "cp.hierarchical_sizes_product"} & _ids(unpacked_cfg)


# ---- Mamba off the memory-efficient path under CP -------------------------------------------------------------------
def _mamba_prefill_refusal(group: Any, rmsnorm: bool) -> str | None:
    """MambaMixer._ssm_prefill (the training path off the memory-efficient one) on a rank's slice of the input
    projection, 4 heads of 8 and 2 groups of state 4; None where it gets past its checks to the scan (mamba_ssm's
    kernel, absent here)."""
    import megatron.core.ssm.mamba_mixer as mamba_mixer
    from megatron.core.ssm.mamba_context_parallel import MambaContextParallel

    heads, head_dim, n_groups, state = 4, 8, 2, 4
    conv = heads * head_dim + 2 * n_groups * state
    mixer = mamba_mixer.MambaMixer.__new__(mamba_mixer.MambaMixer)
    torch.nn.Module.__init__(mixer)
    mixer.d_state, mixer.d_conv, mixer.headdim, mixer.rmsnorm = state, 4, head_dim, rmsnorm
    mixer.activation, mixer.act = "silu", torch.nn.SiLU()
    mixer.chunk_size, mixer.D_has_hdim, mixer.mamba_training_ssm_states_dtype = 8, False, None
    zero = torch.zeros(heads)
    mixer.cp = MambaContextParallel(
        group, heads * head_dim, heads, n_groups, state, torch.zeros(conv, 1, 4), torch.zeros(conv), 3, zero, zero,
        zero, False,
    )  # fmt: skip
    width = (heads * head_dim + conv + heads) // group.size()  # z, x B C, dt of this CP rank
    try:
        mixer._ssm_prefill(torch.zeros(8, 1, width), conv_state=None, ssm_state=None)
    except AssertionError as exc:
        return str(exc)
    except TypeError as exc:
        assert "'NoneType' object is not callable" in str(exc)  # mamba_chunk_scan_combined: past the checks
    return None


@pytest.mark.evidence("mamba.cp_needs_rmsnorm_off_mem_eff_path")
def test_mamba_off_the_memory_efficient_path_needs_its_gated_norm_under_cp(groups: Any, unpacked_cfg: Any) -> None:
    from megatron.bridge.models.falcon_h1.falconh1_provider import FalconH1ModelProvider
    from megatron.core.transformer.enums import AttnBackend

    refused = "Context parallel not supported for use_mem_eff_path==False and rmsnorm==False"
    assert _mamba_prefill_refusal(groups[2], rmsnorm=False) == refused
    assert _mamba_prefill_refusal(groups[2], rmsnorm=True) is None
    assert _mamba_prefill_refusal(groups[1], rmsnorm=False) is None
    unpacked_cfg.model = FalconH1ModelProvider(
        attention_backend=AttnBackend.auto,  # its unfused default refuses CP (attention.backend_available)
        num_layers=2, hidden_size=256, num_attention_heads=4, mamba_num_heads=8, mamba_head_dim=32, vocab_size=1024,
        seq_length=4096, rmsnorm=False, use_mamba_mem_eff_path=False,
    )  # fmt: skip
    assert _ids(unpacked_cfg) == set()  # CP 1
    unpacked_cfg.model.context_parallel_size, unpacked_cfg.model.calculate_per_token_loss = 2, True
    unpacked_cfg.ddp.average_in_collective = False
    assert _ids(unpacked_cfg) == {"mamba.cp_needs_rmsnorm_off_mem_eff_path"}
    unpacked_cfg.model.rmsnorm = True
    assert _ids(unpacked_cfg) == set()


# ---- the offline prep's and the packed dataset's limits -------------------------------------------------------------
@pytest.mark.evidence("offline.max_single_within_pack")
def test_a_sequence_longer_than_the_pack_is_refused_by_the_specs_and_unplaceable_by_the_prep(packed_cfg: Any) -> None:
    """PackedSequenceSpecs refuses it when built; assigned later, the prep keeps the sequence (create_hist up to
    max_single_sequence_length), first_fit gives it a bin of its own, and fill_packing_strategy has no such length."""
    from megatron.bridge.data.packing.algorithms import create_hist, create_packing_strategy, fill_packing_strategy
    from megatron.bridge.data.packing.config import PackedSequenceSpecs

    with pytest.raises(ValueError, match=r"^max_single_sequence_length cannot exceed packed_sequence_size\.$"):
        PackedSequenceSpecs(packed_sequence_size=8, max_single_sequence_length=9)
    PackedSequenceSpecs(packed_sequence_size=8, max_single_sequence_length=8)

    def pack(max_single: int, tokens: int) -> list[dict[str, Any]]:
        example = {"input_ids": list(range(tokens + 1)), "loss_mask": [True] * (tokens + 1)}  # +1: the shift
        sequences, histogram = create_hist([example], max_single)
        assignments, _ = create_packing_strategy(histogram, 8, "first_fit")
        return fill_packing_strategy(assignments, sequences, 8, 0)

    with pytest.raises(KeyError, match="^9$"):
        pack(max_single=9, tokens=9)
    assert [row["seq_start_id"] for row in pack(max_single=8, tokens=8)] == [[0]]
    specs = packed_cfg.dataset.offline_packing_specs
    specs.max_single_sequence_length = 4097  # an assignment: __post_init__ does not run again
    assert _ids(packed_cfg) == {"offline.max_single_within_pack"}
    specs.max_single_sequence_length = 4096
    assert _ids(packed_cfg) == set()


@pytest.mark.evidence("cuda_graphs.pad_cu_seqlens_needs_metadata")
def test_static_cu_seqlens_need_the_pack_metadata_file_the_builder_opens(
    tiny_pack: Any, packed_cfg: Any, tmp_path: Any
) -> None:
    """Megatron-Bridge's GPTSFTDatasetBuilder over an explicit packed path with pad_cu_seqlens: with no metadata
    path it opens its default location's (under dataset_root: none there), else the one set."""
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetBuilder

    from mbridge_seqpack.config_paths import set_path
    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    pack = tiny_pack / "pack"
    for path, value in {
        "model.seq_length": 64,
        "dataset.seq_length": 64,
        "dataset.dataset_root": str(tmp_path),
        "dataset.do_validation": False,
        "dataset.offline_packing_specs.packed_sequence_size": 64,
        "dataset.offline_packing_specs.packed_train_data_path": str(pack / "training_64.idx.parquet"),
        "dataset.offline_packing_specs.pad_cu_seqlens": True,
    }.items():
        set_path(packed_cfg, path, value)
    packed_cfg.dataset.dataset_kwargs["pad_to_max_length"] = True  # GPTSFTPackedDataset asserts it with the flag
    tokenizer = load_megatron_tokenizer(embedded_tokenizer_dir())
    specs = packed_cfg.dataset.offline_packing_specs

    def build() -> Any:
        return GPTSFTDatasetBuilder(packed_cfg.dataset, tokenizer).build()[0]

    for metadata in (None, tmp_path / "missing.jsonl"):
        specs.packed_metadata_path = metadata
        with pytest.raises(FileNotFoundError, match=r"No such file or directory: .*/(64_metadata|missing)\.jsonl'$"):
            build()
        assert "cuda_graphs.pad_cu_seqlens_needs_metadata" in _ids(packed_cfg), metadata
    specs.packed_metadata_path = str(pack / "64_metadata.jsonl")
    assert build().pack_metadata[0]["pack_size"] == 64
    assert "cuda_graphs.pad_cu_seqlens_needs_metadata" not in _ids(packed_cfg)
    # unset again, with the metadata where the builder's own pack_metadata property looks: it builds, so no error
    specs.packed_metadata_path = None
    default = Path(GPTSFTDatasetBuilder(packed_cfg.dataset, tokenizer).pack_metadata)
    default.write_bytes((pack / "64_metadata.jsonl").read_bytes())
    assert build().pack_metadata[0]["pack_size"] == 64
    assert "cuda_graphs.pad_cu_seqlens_needs_metadata" not in _ids(packed_cfg)


@pytest.mark.evidence("gpt_sft.row_width_alignment")
@pytest.mark.parametrize("multiple", [3, 4])
def test_unpacked_gpt_sft_batches_split_over_cp_only_at_a_width_of_2_cp(
    groups: Any, tiny_pack: Any, unpacked_cfg: Any, multiple: int
) -> None:
    """GPTSFTDataset.collate_fn's batch of the three tiny records, as wide as its longest row rounded up to
    pad_seq_length_to_mult, then Megatron-Core's get_batch_on_this_cp_rank (what gpt_step runs) at CP 2."""
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.core.utils import get_batch_on_this_cp_rank

    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    dataset = build_gpt_sft_split(
        tiny_pack / "training.jsonl", tokenizer=load_megatron_tokenizer(embedded_tokenizer_dir()), seq_length=64,
        memmap_workers=1, seed=1234, packed_sequence_size=-1, dataset_kwargs={"pad_seq_length_to_mult": multiple},
    )  # fmt: skip
    batch = dataset.collate_fn([dataset[i] for i in range(3)])
    tokens = batch["tokens"]
    assert tokens.shape[1] == {3: 6, 4: 4}[multiple]  # the longest record is 4 tokens
    try:
        split = get_batch_on_this_cp_rank({"tokens": tokens, "labels": batch["labels"]}, False, groups[2])
        failed = False
    except RuntimeError as exc:
        assert "is invalid for input of size" in str(exc)  # the view into 2*CP chunks
        failed = True
    if not failed:
        assert split["tokens"].shape[1] == tokens.shape[1] // 2
    unpacked_cfg.model.context_parallel_size, unpacked_cfg.model.calculate_per_token_loss = 2, True
    unpacked_cfg.ddp.average_in_collective = False
    unpacked_cfg.dataset.dataset_kwargs["pad_seq_length_to_mult"] = multiple
    assert failed == (multiple == 3)
    assert _ids(unpacked_cfg) == ({"gpt_sft.row_width_alignment"} if failed else set())


# ---- what a packed path trains on -----------------------------------------------------------------------------------
@pytest.mark.evidence("artifact.fingerprint_mismatch")
def test_a_packed_directory_trains_on_every_parquet_file_in_it(pack_cfg: Any, small_pack: Any) -> None:
    """Megatron-Bridge resolves a directory to all its Parquet files and its packed dataset trains on all their
    rows: pointed at the pack's folder, the training split takes in the 2 validation rows, with no error."""
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.bridge.data.packing.paths import resolve_packed_parquet_paths

    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    training, validation = small_pack / "training_4096.idx.parquet", small_pack / "validation_4096.idx.parquet"
    assert resolve_packed_parquet_paths(small_pack) == [str(training), str(validation)]

    def rows(path: Any) -> int:
        return len(
            build_gpt_sft_split(
                path, tokenizer=load_megatron_tokenizer(embedded_tokenizer_dir()), seq_length=4096, memmap_workers=1,
                seed=1234, packed_sequence_size=4096, pad_seq_to_mult=4,
            )
        )  # fmt: skip

    assert rows(small_pack) == rows(training) + 2
    pack_cfg.dataset.offline_packing_specs.packed_train_data_path = str(small_pack)
    assert _ids(pack_cfg) == {"artifact.fingerprint_mismatch"}
    pack_cfg.dataset.offline_packing_specs.packed_train_data_path = str(training)
    assert _ids(pack_cfg) == set()
