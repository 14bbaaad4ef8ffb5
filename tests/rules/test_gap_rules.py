"""The rules that close the census's gaps (issue #32): a real ConfigContainer breaking only that rule gives exactly
that violation (fields, assignments), and the violation's overrides, applied with Megatron-Bridge's own override
parser, clear it (then every reported override clears the config)."""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest

from mbridge_seqpack import check
from tests.support.field_reads import undeclared_reads, untyped_fields
from tests.support.rule_cases import CP2_LOSS, Case, set_fields

SPECS = "dataset.offline_packing_specs"
KW = "dataset.dataset_kwargs.pad_to_max_length"


def _hybrid(**fields: Any) -> Callable[[Any, Any], None]:
    """A small Mamba + attention hybrid provider (is_hybrid_model on, as Megatron-Bridge's Nemotron-H recipes set)."""

    def mutate(cfg: Any, tmp_path: Any) -> None:
        from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider

        shape = dict(hidden_size=256, num_attention_heads=4, mamba_num_heads=8, mamba_head_dim=32, mamba_num_groups=8)
        cfg.model = HybridModelProvider(
            hybrid_layer_pattern="M*M-", vocab_size=1024, seq_length=4096, is_hybrid_model=True, **(shape | fields)
        )

    return mutate


def _auto_attention(cfg: Any, tmp_path: Any) -> None:
    from megatron.core.transformer.enums import AttnBackend

    cfg.model.attention_backend = AttnBackend.auto


def _falcon_h1(cfg: Any, tmp_path: Any) -> None:
    """A small Falcon-H1 (a MambaMixer beside attention in every layer) with its Mamba RMSNorm off."""
    from megatron.bridge.models.falcon_h1.falconh1_provider import FalconH1ModelProvider
    from megatron.core.transformer.enums import AttnBackend

    cfg.model = FalconH1ModelProvider(
        attention_backend=AttnBackend.auto,  # its unfused default refuses CP (attention.backend_available)
        num_layers=2, hidden_size=256, num_attention_heads=4, mamba_num_heads=8, mamba_head_dim=32, vocab_size=1024,
        seq_length=4096, rmsnorm=False, use_mamba_mem_eff_path=False,
    )  # fmt: skip
    set_fields(**CP2_LOSS)(cfg, tmp_path)


def _gdn_deterministic(cfg: Any, tmp_path: Any) -> None:
    cfg.model.experimental_attention_variant = "gated_delta_net"
    cfg.model.deterministic_mode = True
    cfg.model.cross_entropy_loss_fusion = False
    cfg.env_vars = {**cfg.env_vars, "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}  # determinism.te_attention_env


def _both(*fns: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    def mutate(cfg: Any, tmp_path: Any) -> None:
        for fn in fns:
            fn(cfg, tmp_path)

    return mutate


QB = {
    "model__num_moe_experts": 60,
    "model__moe_router_topk": 4,
    "model__moe_router_load_balancing_type": "quantile_balancing",
    "model__moe_aux_loss_coeff": 0.0,
}
CASES = [
    Case(
        "rope.fused_single_qkv",
        "packed_cfg",
        8,
        set_fields(model__fused_single_qkv_rope=True),
        {"model.fused_single_qkv_rope": True, "dataset.enable_offline_packing": True},
        {"model.fused_single_qkv_rope": False},
    ),
    Case(
        "rope.fused_single_qkv",
        "unpacked_cfg",
        8,
        set_fields(model__fused_single_qkv_rope=True, model__qk_layernorm=True),
        {"model.fused_single_qkv_rope": True, "model.qk_layernorm": True},
        {"model.fused_single_qkv_rope": False},
    ),
    Case(
        "rope.yarn_not_interleaved",
        "unpacked_cfg",
        8,
        set_fields(model__position_embedding_type="yarn", model__rotary_interleaved=True),
        {"model.position_embedding_type": "yarn", "model.rotary_interleaved": True},
        {"model.rotary_interleaved": False},
    ),
    Case(
        "offline.no_p_tuning",
        "packed_cfg",
        8,
        set_fields(**{"dataset__dataset_kwargs['virtual_tokens']": 10}),
        {"dataset.dataset_kwargs.virtual_tokens": 10, "dataset.enable_offline_packing": True},
        {"dataset.dataset_kwargs.virtual_tokens": 0},
    ),
    Case(
        "offline.pad_multiple_within_length",
        "packed_cfg",
        8,
        set_fields(dataset__offline_packing_specs__pad_seq_to_mult=8192),
        {f"{SPECS}.pad_seq_to_mult": 8192, "dataset.seq_length": 4096},
        {f"{SPECS}.pad_seq_to_mult": 1},
    ),
    Case(
        "offline.pad_multiple_within_length",
        "packed_cfg",
        8,
        set_fields(
            dataset__offline_packing_specs__pad_seq_to_mult=128,
            dataset__offline_packing_specs__max_single_sequence_length=64,
        ),
        {f"{SPECS}.pad_seq_to_mult": 128, f"{SPECS}.max_single_sequence_length": 64},
        {f"{SPECS}.max_single_sequence_length": None},
    ),
    Case(
        "config.known_values",
        "unpacked_cfg",
        8,
        set_fields(model__normalization="RMSnorm"),
        {"model.normalization": "RMSnorm"},
        {"model.normalization": "RMSNorm"},
    ),
    Case(
        "config.known_values",
        "packed_cfg",
        8,
        set_fields(dataset__dataloader_type="batched"),
        {"dataset.dataloader_type": "batched"},
        {"dataset.dataloader_type": "batch"},
    ),
    Case(
        "moe.quantile_balancing_tokens",
        "packed_cfg",
        8,
        set_fields(**QB),
        {
            "model.moe_router_load_balancing_type": "quantile_balancing",
            "model.num_moe_experts": 60,
            "model.moe_router_topk": 4,
            "train.micro_batch_size": 1,
            f"{SPECS}.packed_sequence_size": 4096,
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 16,
        },
        {  # 60 / gcd(4, 60) = 15 tokens; the size keeps its 128 alignment
            f"{SPECS}.packed_sequence_size": 5760,
            "model.seq_length": 5760,
            "dataset.seq_length": 5760,
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 240,
        },
    ),
    Case(
        "moe.quantile_balancing_tokens",
        "unpacked_cfg",
        8,
        set_fields(**QB, train__micro_batch_size=3, train__global_batch_size=24),
        {
            "model.moe_router_load_balancing_type": "quantile_balancing",
            "model.num_moe_experts": 60,
            "model.moe_router_topk": 4,
            "train.micro_batch_size": 3,
            "dataset.seq_length": 4096,
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 16,
        },
        {  # 3 rows a micro batch: each width a multiple of 5
            "dataset.seq_length": 4480,
            "model.seq_length": 4480,
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 80,
        },
    ),
    Case(
        "moe.tp_needs_sequence_parallel",
        "packed_cfg",
        8,
        set_fields(model__num_moe_experts=8, model__tensor_model_parallel_size=2),
        {"model.num_moe_experts": 8, "model.tensor_model_parallel_size": 2, "model.sequence_parallel": False},
        {"model.sequence_parallel": True},
    ),
    Case(
        "moe.flex_dispatcher_parallel",
        "packed_cfg",
        8,
        set_fields(model__num_moe_experts=8, model__moe_token_dispatcher_type="flex"),
        {
            "model.moe_token_dispatcher_type": "flex",
            "model.moe_flex_dispatcher_backend": "deepep",
            "model.expert_model_parallel_size": 1,
            "model.expert_tensor_parallel_size": 1,
        },
        {"model.moe_token_dispatcher_type": "alltoall"},
    ),
    Case(
        "moe.router_options",
        "packed_cfg",
        8,
        set_fields(
            model__num_moe_experts=8, model__moe_router_load_balancing_type="sinkhorn", model__moe_aux_loss_coeff=0.01
        ),
        {"model.moe_router_load_balancing_type": "sinkhorn", "model.moe_aux_loss_coeff": 0.01},
        {"model.moe_aux_loss_coeff": 0.0},
    ),
    Case(
        "moe.router_options",
        "packed_cfg",
        8,
        set_fields(model__num_moe_experts=8, model__moe_latent_size=64, model__moe_shared_expert_overlap=True),
        {"model.moe_router_load_balancing_type": "aux_loss", "model.moe_shared_expert_overlap": True},
        {"model.moe_shared_expert_overlap": False},
    ),
    Case(
        "mamba.packing_needs_mem_eff_path",
        "packed_cfg",
        8,
        _hybrid(use_mamba_mem_eff_path=False),
        {"model.use_mamba_mem_eff_path": False, "dataset.enable_offline_packing": True},
        {"model.use_mamba_mem_eff_path": True},
    ),
    Case(
        "mamba.heads_divisible",
        "packed_cfg",
        16,
        _both(
            _hybrid(),
            # the provider pins flash: padded THD is FlashAttention 3's, sm90 only (not a declared GPU here)
            _auto_attention,
            set_fields(
                **{**CP2_LOSS, "model__context_parallel_size": 16}, dataset__offline_packing_specs__pad_seq_to_mult=32
            ),
            set_fields(**{"dataset__dataset_kwargs['pad_seq_length_to_mult']": 32}),
        ),
        {
            "model.mamba_num_heads": 8,
            "model.mamba_num_groups": 8,
            "model.tensor_model_parallel_size": 1,
            "model.context_parallel_size": 16,
        },
        {"model.context_parallel_size": 8},
        base_world=8,
    ),
    Case(
        "mamba.heads_divisible",
        "packed_cfg",
        8,
        _both(_hybrid(mamba_num_heads=6, mamba_num_groups=2), set_fields(model__tensor_model_parallel_size=4)),
        {
            "model.mamba_num_heads": 6,
            "model.mamba_num_groups": 2,
            "model.tensor_model_parallel_size": 4,
            "model.context_parallel_size": 1,
        },
        {"model.tensor_model_parallel_size": 2},
    ),
    Case(
        "mamba.cp_needs_rmsnorm_off_mem_eff_path",
        "unpacked_cfg",
        8,
        _falcon_h1,
        {"model.use_mamba_mem_eff_path": False, "model.rmsnorm": False, "model.context_parallel_size": 2},
        {"model.use_mamba_mem_eff_path": True},
    ),
    Case(
        "gdn.packing_deterministic",
        "packed_cfg",
        8,
        _gdn_deterministic,
        {"model.deterministic_mode": True, "model": "GPTModelProvider", "dataset.enable_offline_packing": True},
        {"model.deterministic_mode": False},
        also=("model.offline_packing_opt_out",),  # the advisory for Qwen3-Next-style stacks
    ),
    Case(
        "pipeline.interleaved_micro_batches",
        "unpacked_cfg",
        8,
        set_fields(
            model__pipeline_model_parallel_size=2,
            model__virtual_pipeline_model_parallel_size=2,
            train__global_batch_size=4,
            validation__eval_iters=0,
        ),
        {
            "train.global_batch_size": 4,
            "train.micro_batch_size": 1,
            "data_parallel_size": 4,
            "model.pipeline_model_parallel_size": 2,
            "model.virtual_pipeline_model_parallel_size": 2,
        },
        {"train.global_batch_size": 8},
    ),
]


def _three_row_pack(cfg: Any, tmp_path: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    train = tmp_path / "training_4096.idx.parquet"
    rows = {"input_ids": [[5, 6, 7]] * 3, "loss_mask": [[1, 1, 0]] * 3, "seq_start_id": [[0]] * 3}
    pq.write_table(pa.table(rows), str(train))
    cfg.dataset.offline_packing_specs.packed_train_data_path = str(train)


def _mxfp8_attention(cfg: Any, tmp_path: Any) -> None:
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    cfg.mixed_precision = get_mixed_precision_config("bf16_with_mxfp8_mixed")
    cfg.mixed_precision.fp8_dot_product_attention = True
    cfg.model.attention_dropout = 0.0  # MXFP8's backward is cuDNN's deterministic one: no dropout on Blackwell
    # MXFP8 attention runs on Blackwell with cuDNN >= 9.21 (attention.backend_available); the env is restored after
    os.environ.update(MBRIDGE_SEQPACK_GPU_ARCH="sm100", MBRIDGE_SEQPACK_CUDNN_VERSION="9.21.0")


def _qk_scaling(cfg: Any, tmp_path: Any) -> None:
    os.environ.pop("NVTE_APPLY_QK_LAYER_SCALING", None)  # the environment is restored after each test
    cfg.model.apply_query_key_layer_scaling = True


CASES += [
    Case(
        "gpt_sft.prompt_template",
        "packed_cfg",
        8,
        set_fields(**{"dataset__dataset_kwargs['prompt_template']": "Q: {input}\\nA: {output}\\n"}),
        {"dataset.dataset_kwargs.prompt_template": "Q: {input}\\nA: {output}\\n"},
        {"dataset.dataset_kwargs.prompt_template": "Q: {input}\\nA: {output}"},
    ),
    Case(
        "gpt_sft.prompt_template",
        "unpacked_cfg",
        8,
        set_fields(**{"dataset__dataset_kwargs['prompt_template']": "{question} {output}"}),
        {"dataset.dataset_kwargs.prompt_template": "{question} {output}"},
        {"dataset.dataset_kwargs.truncation_field": "question"},
    ),
    Case(
        "gpt_sft.prompt_template",
        "unpacked_cfg",
        8,
        set_fields(**{"dataset__dataset_kwargs['truncation_method']": "middle"}),
        {"dataset.dataset_kwargs.truncation_method": "middle"},
        {"dataset.dataset_kwargs.truncation_method": "right"},
    ),
    Case(
        "gpt_sft.prompt_template",
        "unpacked_cfg",
        8,
        set_fields(**{"dataset__dataset_kwargs['prompt_template']": None}),
        {"dataset.dataset_kwargs.prompt_template": None},
        {"dataset.dataset_kwargs.prompt_template": "{input} {output}"},
    ),
    Case(
        "rope.qwen3_vl_no_fusion",
        "qwen3vl_cfg",
        8,
        set_fields(model__apply_rope_fusion=True),
        {"model": "Qwen3VLModelProvider", "model.apply_rope_fusion": True},
        {"model.apply_rope_fusion": False},
    ),
    Case(
        "process_groups.optimizer_instances",
        "packed_cfg",
        8,
        set_fields(ddp__num_distributed_optimizer_instances=3),
        {"ddp.num_distributed_optimizer_instances": 3, "DP x CP": 8, "expert DP": 8},
        {"ddp.num_distributed_optimizer_instances": 2},
    ),
    Case(
        "process_groups.sharp_group",
        "packed_cfg",
        8,
        set_fields(dist__sharp_enabled_group="dp"),
        {"dist.sharp_enabled_group": "dp", "dist.use_sharp": False},
        {"dist.sharp_enabled_group": None},
    ),
    Case(
        "config.known_values",
        "packed_cfg",
        8,
        set_fields(
            dist__use_sharp=True, dist__sharp_enabled_group="dp_replicas", ddp__num_distributed_optimizer_instances=2
        ),
        {"dist.sharp_enabled_group": "dp_replicas"},
        {"dist.sharp_enabled_group": "dp_replica"},
    ),
    Case(
        "offline.train_split_rows",
        "packed_cfg",
        8,
        _three_row_pack,
        {
            "dataset.offline_packing_specs.packed_train_data_path": "<tmp>/training_4096.idx.parquet",
            "training rows": 3,
            "dataset.max_train_samples": None,
            "train.global_batch_size": 16,
        },
        {"dataset.max_train_samples": 16000},  # 1000 iterations of 16 rows: the rows repeat in epochs
    ),
    Case(
        "fp8.row_tokens_per_rank",
        "unpacked_cfg",
        8,
        set_fields(
            mixed_precision="bf16_with_mxfp8_mixed", model__tensor_model_parallel_size=2, model__sequence_parallel=True
        ),
        {
            "train.micro_batch_size": 1,
            "dataset.seq_length": 4096,
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 16,
            "model.context_parallel_size": 1,
            "model.tensor_model_parallel_size": 2,
            "model.sequence_parallel": True,
        },
        {"dataset.dataset_kwargs.pad_seq_length_to_mult": 64},
    ),
    Case(
        "fp8.row_tokens_per_rank",
        "vlm_cfg",
        8,
        set_fields(mixed_precision="bf16_with_fp8_current_scaling_mixed"),
        {
            "train.micro_batch_size": 2,
            "dataset.enable_in_batch_packing": True,
            "model.context_parallel_size": 1,
            "model.tensor_model_parallel_size": 1,
            "model.sequence_parallel": False,
        },
        {"dataset.enable_in_batch_packing": False},
    ),
    Case(
        "fp8.mxfp8_attention_sequence",
        "unpacked_cfg",
        8,
        _mxfp8_attention,
        {
            "dataset.seq_length": 4096,
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 16,
            "model.context_parallel_size": 1,
            "mixed_precision.fp8_recipe": "mxfp8",
        },
        {"dataset.dataset_kwargs.pad_seq_length_to_mult": 128},
        also=("fp8.row_tokens_per_rank",),  # 16-token rows are not 32-token MXFP8 GEMM blocks either
    ),
    Case(
        "tp_comm_overlap.mxfp8_tokens",
        "packed_cfg",
        8,
        set_fields(
            mixed_precision="bf16_with_mxfp8_mixed",
            model__tensor_model_parallel_size=2,
            model__sequence_parallel=True,
            model__tp_comm_overlap=True,
            **{"dataset__dataset_kwargs['pad_to_max_length']": True},
            model__seq_length=4160,
            dataset__seq_length=4160,
            dataset__offline_packing_specs__packed_sequence_size=4160,
        ),
        {
            "model.seq_length": 4160,
            "train.micro_batch_size": 1,
            "model.context_parallel_size": 1,
            "model.tensor_model_parallel_size": 2,
        },
        {
            "model.seq_length": 4352,
            "dataset.seq_length": 4352,
            "dataset.offline_packing_specs.packed_sequence_size": 4352,
        },
    ),
    Case(
        "mtp.full_recompute_layers",
        "unpacked_cfg",
        8,
        set_fields(
            model__mtp_num_layers=1,
            model__recompute_granularity="full",
            model__recompute_method="uniform",
            model__recompute_num_layers=2,
        ),
        {
            "model.mtp_num_layers": 1,
            "model.recompute_granularity": "full",
            "model.recompute_method": "uniform",
            "model.recompute_num_layers": 2,
        },
        {"model.recompute_num_layers": 1},
    ),
    Case(
        "te.qk_layer_scaling_env",
        "packed_cfg",
        8,
        _qk_scaling,
        {"model.apply_query_key_layer_scaling": True, "env NVTE_APPLY_QK_LAYER_SCALING": None},
        {"env_vars.NVTE_APPLY_QK_LAYER_SCALING": "1"},
    ),
]


def _apply(cfg: Any, overrides: list[str]) -> Any:
    import copy

    from mbridge_seqpack.overrides import apply_overrides

    return apply_overrides(copy.deepcopy(cfg), overrides)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.rule_id}-{i}" for i, c in enumerate(CASES)])
def test_gap_rule_breaks_and_its_override_fix_repairs(
    case: Case, request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    cfg = request.getfixturevalue(case.base)
    assert check(cfg, world_size=case.base_world or case.world) == [], "the base config must be valid"
    case.breaks(cfg, tmp_path)

    found = check(cfg, world_size=case.world)
    assert sorted(v.rule_id for v in found) == sorted((case.rule_id, *case.also))
    assert undeclared_reads(cfg, case.world) == {}  # every field each rule reads here is in its @rule(reads=...)
    assert untyped_fields(found) == []
    (violation,) = [v for v in found if v.rule_id == case.rule_id]
    expected = {k: v.replace("<tmp>", str(tmp_path)) if isinstance(v, str) else v for k, v in case.fields.items()}
    assert violation.fields == expected
    assert violation.assignments == case.assignments
    assert violation.severity == "error" and violation.rule

    own = _apply(cfg, violation.overrides)  # through Megatron-Bridge's process_config_with_overrides
    assert case.rule_id not in {v.rule_id for v in check(own, world_size=case.world)}
    every = _apply(cfg, [o for v in found for o in v.overrides])
    assert check(every, world_size=case.world) == []


def test_the_validation_step_is_checked_with_its_own_batch(unpacked_cfg: Any) -> None:
    """The first evaluation runs the interleaved schedule with the validation batch sizes."""
    unpacked_cfg.model.pipeline_model_parallel_size = 2
    unpacked_cfg.model.virtual_pipeline_model_parallel_size = 2
    unpacked_cfg.validation.eval_iters = 2
    unpacked_cfg.validation.eval_global_batch_size = 12  # 3 micro batches over DP 4: a last group of 1 < PP
    unpacked_cfg.validation.eval_micro_batch_size = 1
    (v,) = check(unpacked_cfg, world_size=8)
    assert v.rule_id == "pipeline.interleaved_micro_batches"
    assert v.fields["validation.eval_global_batch_size"] == 12
    assert v.assignments == {"validation.eval_global_batch_size": 16}
    assert "the last group of M=3 micro batches holds 1 < PP=2" in v.rule
