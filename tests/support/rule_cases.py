"""The rule cases: for each rule, a config change that breaks it, the violation's fields and fix, and the repair
(run by tests/rules/test_rules.py; the evidence and gap tests reuse the helpers and the validate-backed cases)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from mbridge_seqpack.config_paths import set_path

SPECS = "dataset.offline_packing_specs"
KW = "dataset.dataset_kwargs.pad_to_max_length"


@dataclass
class Case:
    rule_id: str
    base: str
    world: int
    breaks: Callable[[Any, Any], None]
    fields: dict[str, Any] | Callable[[Any, Any], dict[str, Any]]  # or computed from the broken config, tmp_path
    assignments: dict[str, Any] | None = None
    fix: str | None = None
    repair: Callable[[Any, Any], Any] | None = None  # default: apply assignments
    also: tuple[str, ...] = ()
    repaired_world: int | None = None
    base_world: int | None = None  # where the unbroken base config is valid, when not the checked world
    patch: Callable[[pytest.MonkeyPatch], None] | None = None  # what the environment differs in (undone after)


def _set(**values: Any) -> Callable[[Any, Any], None]:
    def mutate(cfg: Any, tmp_path: Any) -> None:
        for path, value in values.items():
            set_path(cfg, path.replace("__", "."), value)

    return mutate


def _seq(n: int, *, packed: bool = False) -> dict[str, int]:
    out = {"model__seq_length": n, "dataset__seq_length": n}
    if packed:
        out["dataset__offline_packing_specs__packed_sequence_size"] = n
    return out


def _graphs(modules: list[str], impl: str = "transformer_engine") -> Callable[[Any], None]:
    def go(cfg: Any) -> None:
        from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules

        cfg.model.cuda_graph_impl = impl
        set_cuda_graph_modules(cfg.model, modules)
        cfg.rng.te_rng_tracker = True  # provide() asserts it for every CUDA-graph config (launch.model_build)

    return go


def _full_iteration(*, injected: bool) -> Callable[[Any], None]:
    """Megatron-Bridge's full-iteration graph; ``injected``: the launch has MBRIDGE_SEQPACK_MODE (the plugin then
    hands the captured step a host max_seqlen). The environment is restored after each test (conftest)."""

    def go(cfg: Any) -> None:
        import os

        from megatron.bridge.utils.cuda_graph import set_full_iteration_cuda_graph

        set_full_iteration_cuda_graph(cfg.model)
        cfg.rng.te_rng_tracker = True  # provide() asserts it for every CUDA-graph config (launch.model_build)
        cfg.rerun_state_machine.check_for_nan_in_loss = False  # training/config.py asserts it for full iteration
        # a capture-safe step (cuda_graphs.capture_host_reads): fused RoPE, no DDP NaN check of the grad buckets
        cfg.model.apply_rope_fusion = True
        cfg.ddp.check_for_nan_in_grad = False
        if injected:
            os.environ["MBRIDGE_SEQPACK_MODE"] = "error"
        else:
            os.environ.pop("MBRIDGE_SEQPACK_MODE", None)

    return go


def _both(*fns: Callable[..., None]) -> Callable[[Any, Any], None]:
    def mutate(cfg: Any, tmp_path: Any) -> None:
        for fn in fns:
            try:
                fn(cfg, tmp_path)
            except TypeError:
                fn(cfg)

    return mutate


CP2_LOSS = {
    "model__context_parallel_size": 2,
    "model__calculate_per_token_loss": True,
    "ddp__average_in_collective": False,
}


def _metadata_breaks(cfg: Any, tmp_path: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    train = tmp_path / "training_4096.idx.parquet"  # a pack from elsewhere: no mbridge_seqpack fingerprint
    rows = 16  # one global batch: fewer rows are offline.train_split_rows'
    pq.write_table(
        pa.table({"input_ids": [[5, 6, 7]] * rows, "loss_mask": [[1, 1, 0]] * rows, "seq_start_id": [[0]] * rows}),
        str(train),
    )
    cfg.dataset.offline_packing_specs.pad_cu_seqlens = True
    cfg.dataset.dataset_kwargs["pad_to_max_length"] = True
    cfg.dataset.offline_packing_specs.packed_train_data_path = str(train)


def _metadata_repair(cfg: Any, tmp_path: Any) -> None:
    meta = tmp_path / "4096_metadata.jsonl"
    meta.write_text('[{"max_samples_per_bin": 9, "dataset_max_seqlen": 4000, "min_packed_seqlen": 100}]')
    cfg.dataset.offline_packing_specs.packed_metadata_path = str(meta)


def _specs_repair(cfg: Any, tmp_path: Any) -> None:
    from megatron.bridge.data.packing.config import PackedSequenceSpecs

    cfg.dataset.offline_packing_specs = PackedSequenceSpecs(packed_sequence_size=4096, pad_seq_to_mult=1)


def _gdn(cfg: Any, tmp_path: Any) -> None:
    cfg.model.experimental_attention_variant = "gated_delta_net"


def _qwen35_vl(cfg: Any, tmp_path: Any) -> None:
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider

    cfg.model = Qwen35VLModelProvider(num_layers=4, hidden_size=256, num_attention_heads=4, seq_length=4096)


CASES = [
    Case(
        "cp.seq_length_divisible",
        "unpacked_cfg",
        8,
        _set(**CP2_LOSS, **_seq(4094)),
        {"model.seq_length": 4094, "model.context_parallel_size": 2},
        {"model.seq_length": 4096, "dataset.seq_length": 4096},
    ),
    Case(
        "collate.seq_length_alignment",
        "vlm_cfg",
        8,
        _set(model__tensor_model_parallel_size=2, model__sequence_parallel=True, **_seq(4095)),
        {
            "dataset.seq_length": 4095,
            "model.context_parallel_size": 1,
            "model.tensor_model_parallel_size": 2,
            "model.sequence_parallel": True,
        },
        {"model.seq_length": 4096, "dataset.seq_length": 4096},
    ),
    Case(
        "cp.finetune_per_token_loss",
        "unpacked_cfg",
        8,
        _set(**{**CP2_LOSS, "model__calculate_per_token_loss": False}),
        {"model.calculate_per_token_loss": False, "model.context_parallel_size": 2},
        {"model.calculate_per_token_loss": True},
    ),
    Case(
        "cp.finetune_average_in_collective",
        "unpacked_cfg",
        8,
        _set(**{**CP2_LOSS, "ddp__average_in_collective": True}),
        {"ddp.average_in_collective": True, "model.context_parallel_size": 2},
        {"ddp.average_in_collective": False},
    ),
    Case(
        "cp.hierarchical_sizes_required",
        "unpacked_cfg",
        16,
        _set(**{**CP2_LOSS, "model__context_parallel_size": 16}, model__cp_comm_type="a2a+p2p"),
        {"model.cp_comm_type": "a2a+p2p", "model.hierarchical_context_parallel_sizes": None},
        {"model.hierarchical_context_parallel_sizes": [4, 4]},  # 12 heads: the a2a level must divide them
        also=("gpt_sft.row_width_alignment",),  # unpacked rows padded to 16 cannot split over CP 16
    ),
    Case(
        "cp.hierarchical_sizes_product",
        "unpacked_cfg",
        8,
        _set(
            **{**CP2_LOSS, "model__context_parallel_size": 8},
            model__cp_comm_type="a2a+p2p",
            model__hierarchical_context_parallel_sizes=[2, 2],
        ),
        {"model.hierarchical_context_parallel_sizes": [2, 2], "model.context_parallel_size": 8},
        {"model.hierarchical_context_parallel_sizes": [4, 2]},
    ),
    Case(
        "offline.specs_required",
        "packed_cfg",
        8,
        _set(**{SPECS.replace(".", "__"): None}),
        {"dataset.enable_offline_packing": True, SPECS: None},
        fix=f"cfg.{SPECS} = PackedSequenceSpecs(packed_sequence_size=4096, pad_seq_to_mult=1)",
        repair=_specs_repair,
    ),
    Case(
        "offline.flag_required",
        "packed_cfg",
        8,
        _set(dataset__enable_offline_packing=False),
        {"dataset.enable_offline_packing": False, SPECS: "PackedSequenceSpecs"},
        fix=f"cfg.dataset.enable_offline_packing = True (or cfg.{SPECS} = None to train unpacked)",
        repair=_set(dataset__enable_offline_packing=True),
    ),
    Case(
        "offline.micro_batch_one",
        "packed_cfg",
        8,
        _set(train__micro_batch_size=2),
        {"train.micro_batch_size": 2, "train.global_batch_size": 16},
        {"train.micro_batch_size": 1},
        fix="cfg.train.micro_batch_size = 1 (global_batch_size then counts 16 packed rows of 4096); to keep the "
        "row count and tokens of one micro batch instead, also set cfg.train.global_batch_size = 8 and pack "
        "to 8192 (model/dataset seq_length and packed_sequence_size = 8192)",
    ),
    Case(
        "offline.pack_size_positive",
        "packed_cfg",
        8,
        _set(dataset__offline_packing_specs__packed_sequence_size=0),
        {f"{SPECS}.packed_sequence_size": 0},
        {f"{SPECS}.packed_sequence_size": 4096},
    ),
    Case(
        "offline.pack_size_matches_seq_length",
        "packed_cfg",
        8,
        _set(dataset__offline_packing_specs__packed_sequence_size=2048),
        {f"{SPECS}.packed_sequence_size": 2048, "model.seq_length": 4096, "dataset.seq_length": 4096},
        {f"{SPECS}.packed_sequence_size": 4096, "dataset.seq_length": 4096},
    ),
    Case(
        "seq_length.model_matches_dataset",
        "unpacked_cfg",
        8,
        _set(dataset__seq_length=2048),
        {"model.seq_length": 4096, "dataset.seq_length": 2048},
        {"dataset.seq_length": 4096},
    ),
    Case(
        "offline.max_single_within_pack",
        "packed_cfg",
        8,
        _set(dataset__offline_packing_specs__max_single_sequence_length=8192),
        {f"{SPECS}.max_single_sequence_length": 8192, f"{SPECS}.packed_sequence_size": 4096},
        {f"{SPECS}.max_single_sequence_length": 4096},
    ),
    Case(
        "offline.alignment_multiple",
        "packed_cfg",
        8,
        _set(**CP2_LOSS),
        {f"{SPECS}.pad_seq_to_mult": 1, "model.context_parallel_size": 2},
        {f"{SPECS}.pad_seq_to_mult": 4},
    ),
    Case(
        "offline.row_width_alignment",
        "packed_cfg",
        8,
        _set(
            model__tensor_model_parallel_size=4,
            model__sequence_parallel=True,
            **{"dataset__dataset_kwargs['pad_to_max_length']": True},
            **_seq(4094, packed=True),
        ),
        {
            f"{SPECS}.packed_sequence_size": 4094,
            KW: True,
            "model.context_parallel_size": 1,
            "model.tensor_model_parallel_size": 4,
            "model.sequence_parallel": True,
        },
        {f"{SPECS}.packed_sequence_size": 4096, "model.seq_length": 4096, "dataset.seq_length": 4096},
    ),
    Case(
        "offline.row_width_alignment",
        "packed_cfg",
        32,
        _set(model__tensor_model_parallel_size=32, model__sequence_parallel=True, train__global_batch_size=32),
        {
            f"{SPECS}.packed_sequence_size": 4096,
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 16,
            KW: False,
            "model.context_parallel_size": 1,
            "model.tensor_model_parallel_size": 32,
            "model.sequence_parallel": True,
        },
        {"dataset.dataset_kwargs.pad_seq_length_to_mult": 32},
        base_world=8,
    ),
    Case(
        "batch.world_size_divisible",
        "unpacked_cfg",
        6,
        _set(model__tensor_model_parallel_size=4),
        {
            "world_size": 6,
            "model.tensor_model_parallel_size": 4,
            "model.pipeline_model_parallel_size": 1,
            "model.context_parallel_size": 1,
        },
        fix="run on a multiple of 4 GPUs, or change TP/PP/CP so their product divides 6",
        repair=lambda cfg, tmp: None,
        repaired_world=8,
    ),
    Case(
        "batch.global_batch_divisible",
        "unpacked_cfg",
        8,
        _set(train__global_batch_size=12),
        {"train.global_batch_size": 12, "train.micro_batch_size": 1, "data_parallel_size": 8},
        {"train.global_batch_size": 16},
    ),
    Case(
        "batch.global_batch_min",
        "unpacked_cfg",
        8,
        _set(train__global_batch_size=4),
        {"train.global_batch_size": 4, "train.micro_batch_size": 1, "data_parallel_size": 8},
        {"train.global_batch_size": 8},
    ),
    Case(
        "in_batch.micro_batch_gt_one",
        "vlm_cfg",
        8,
        _set(train__micro_batch_size=1),
        {"train.micro_batch_size": 1, "dataset.enable_in_batch_packing": True},
        {"train.micro_batch_size": 2},
    ),
    Case(
        "in_batch.no_cuda_graphs",
        "vlm_cfg",
        8,
        _set(model__cuda_graph_impl="transformer_engine", rng__te_rng_tracker=True),
        {"dataset.enable_in_batch_packing": True, "model.cuda_graph_impl": "transformer_engine"},
        {"model.cuda_graph_impl": "none"},
    ),
    Case(
        "pipeline.variable_shapes_interleaved_pp2",
        "vlm_cfg",
        8,
        _set(model__pipeline_model_parallel_size=2, model__virtual_pipeline_model_parallel_size=2),
        {
            "model.pipeline_model_parallel_size": 2,
            "model.virtual_pipeline_model_parallel_size": 2,
            "dataset.enable_in_batch_packing": True,
        },
        {"model.virtual_pipeline_model_parallel_size": None},
    ),
    Case(
        "cuda_graphs.pad_cu_seqlens_needs_fixed_width",
        "packed_cfg",
        8,
        _set(dataset__offline_packing_specs__pad_cu_seqlens=True),
        {f"{SPECS}.pad_cu_seqlens": True, KW: False},
        {KW: True},
    ),
    Case(
        "cuda_graphs.training_graphs_need_fixed_width",
        "packed_cfg",
        8,
        _both(_graphs(["mlp"])),
        {"model.cuda_graph_impl": "transformer_engine", KW: False},
        {KW: True},
    ),
    Case(
        "cuda_graphs.attention_graphs_need_pad_cu_seqlens",
        "packed_cfg",
        8,
        _both(_full_iteration(injected=True), _set(**{"dataset__dataset_kwargs['pad_to_max_length']": True})),
        {"model.cuda_graph_impl": "full_iteration", f"{SPECS}.pad_cu_seqlens": False},
        {f"{SPECS}.pad_cu_seqlens": True, KW: True},
    ),
    Case(
        "cuda_graphs.te_attention_over_packed",
        "packed_cfg",
        8,
        _both(_graphs(["attn"]), _set(**{"dataset__dataset_kwargs['pad_to_max_length']": True})),
        {
            "model.cuda_graph_impl": "transformer_engine",
            "model.cuda_graph_modules": ["attn"],
            "dataset.enable_offline_packing": True,
        },
        {"model.cuda_graph_modules": ["mlp"]},
    ),
    Case(
        "cuda_graphs.full_iteration_needs_injection",
        "packed_cfg",
        8,
        _both(
            _full_iteration(injected=False),
            _set(
                **{
                    "dataset__dataset_kwargs['pad_to_max_length']": True,
                    f"{SPECS}.pad_cu_seqlens".replace(".", "__"): True,
                }
            ),
        ),
        {"model.cuda_graph_impl": "full_iteration", "dataset.enable_offline_packing": True},
        {"model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_modules": ["mlp"]},
    ),
    Case(
        "cuda_graphs.te_capture_width",
        "packed_cfg",
        8,
        _both(
            _graphs(["mlp"]),
            _set(
                **{
                    "dataset__dataset_kwargs['pad_to_max_length']": True,
                    f"{SPECS}.packed_sequence_size".replace(".", "__"): 2048,
                }
            ),
        ),
        {
            f"{SPECS}.packed_sequence_size": 2048,
            "model.seq_length": 4096,
            "model.cuda_graph_impl": "transformer_engine",
        },
        {f"{SPECS}.packed_sequence_size": 4096},
        also=("offline.pack_size_matches_seq_length",),
    ),
    Case(
        "cuda_graphs.local_per_layer",
        "packed_cfg",
        8,
        _both(_graphs(["mlp"], impl="local"), _set(**{"dataset__dataset_kwargs['pad_to_max_length']": True})),
        {
            "model.cuda_graph_impl": "local",
            "model.cuda_graph_modules": ["mlp"],
            "dataset.enable_offline_packing": True,
        },
        {"model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_modules": ["mlp"]},
    ),
    Case(
        "fp8.packed_tokens_per_rank",
        "packed_cfg",
        8,
        _set(
            mixed_precision="bf16_with_mxfp8_mixed", model__tensor_model_parallel_size=2, model__sequence_parallel=True
        ),
        {
            f"{SPECS}.packed_sequence_size": 4096,
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 16,
            KW: False,
            "model.context_parallel_size": 1,
            "model.tensor_model_parallel_size": 2,
            "model.sequence_parallel": True,
        },
        {"dataset.dataset_kwargs.pad_seq_length_to_mult": 64},
    ),
    Case(
        "offline.eval_micro_batch_one",
        "packed_cfg",
        8,
        _set(validation__eval_micro_batch_size=2, validation__eval_global_batch_size=32),
        {"validation.eval_micro_batch_size": 2, "validation.eval_global_batch_size": 32},
        {"validation.eval_micro_batch_size": 1},
    ),
    Case(
        "mtp.packed_context_parallel",
        "packed_cfg",
        8,
        _set(**CP2_LOSS, dataset__offline_packing_specs__pad_seq_to_mult=4, model__mtp_num_layers=1),
        {"model.mtp_num_layers": 1, "model.context_parallel_size": 2, "dataset.enable_offline_packing": True},
        {"model.mtp_num_layers": None},
        also=("mtp.no_packing",),
    ),
    Case(
        "fixed_width.gpt_sft_pipeline",
        "unpacked_cfg",
        8,
        _set(model__pipeline_model_parallel_size=2, dataset__dataloader_type="single"),
        {KW: False, "model.pipeline_model_parallel_size": 2, "dataset.dataloader_type": "single"},
        {KW: True},
    ),
    Case(
        "fixed_width.gpt_sft_experts",
        "unpacked_cfg",
        8,
        _set(model__expert_model_parallel_size=2, model__num_moe_experts=4),
        {KW: False, "model.expert_model_parallel_size": 2},
        {KW: True},
    ),
    Case(
        "mtp.no_packing",
        "packed_cfg",
        8,
        _set(model__mtp_num_layers=1),
        {"model.mtp_num_layers": 1, "dataset.enable_offline_packing": True},
        {"model.mtp_num_layers": None},
        fix="cfg.model.mtp_num_layers = None (or turn packing off: cfg.dataset.enable_offline_packing = False)",
    ),
    Case(
        "model.offline_packing_opt_out",
        "packed_cfg",
        8,
        _gdn,
        {"model": "GPTModelProvider", "model family": "Qwen3-Next", "dataset.enable_offline_packing": True},
        {"dataset.enable_offline_packing": False, SPECS: None},
    ),
    Case(
        "model.in_batch_packing_opt_out",
        "vlm_cfg",
        8,
        _qwen35_vl,
        {"model": "Qwen35VLModelProvider", "model family": "Qwen3.5-VL", "dataset.enable_in_batch_packing": True},
        {"dataset.enable_in_batch_packing": False},
    ),
    Case(
        "energon.micro_batch_one",
        "energon_cfg",
        8,
        _set(train__micro_batch_size=2, dataset__micro_batch_size=2),
        {"dataset.packing_buffer_size": 64, "train.micro_batch_size": 2},
        {"train.micro_batch_size": 1, "dataset.micro_batch_size": 1},
    ),
    Case(
        "energon.exclusive_in_batch",
        "energon_cfg",
        8,
        _set(dataset__defer_in_batch_packing_to_step=True),
        {"dataset.packing_buffer_size": 64, "dataset.defer_in_batch_packing_to_step": True},
        {"dataset.defer_in_batch_packing_to_step": False},
    ),
    Case(
        "energon.no_mtp",
        "energon_cfg",
        8,
        _set(model__mtp_num_layers=2),
        {"dataset.packing_buffer_size": 64, "model.mtp_num_layers": 2},
        {"model.mtp_num_layers": None},
        also=("mtp.no_packing",),
    ),
    Case(
        "energon.no_cuda_graphs",
        "energon_cfg",
        8,
        _set(model__cuda_graph_impl="transformer_engine", rng__te_rng_tracker=True),
        {"dataset.packing_buffer_size": 64, "model.cuda_graph_impl": "transformer_engine"},
        {"model.cuda_graph_impl": "none"},
    ),
    Case(
        "energon.no_pipeline",
        "energon_cfg",
        8,
        _set(model__pipeline_model_parallel_size=2),
        {"dataset.packing_buffer_size": 64, "model.pipeline_model_parallel_size": 2},
        {"model.pipeline_model_parallel_size": 1},
    ),
    Case(
        "energon.per_token_loss",
        "energon_cfg",
        8,
        _set(model__calculate_per_token_loss=False, ddp__average_in_collective=True),
        {
            "dataset.packing_buffer_size": 64,
            "model.calculate_per_token_loss": False,
            "ddp.average_in_collective": True,
        },
        {"model.calculate_per_token_loss": True, "ddp.average_in_collective": False},
    ),
]


def _local_attention(cfg: Any, tmp_path: Any) -> None:
    from megatron.bridge.models.gpt_provider import local_layer_spec

    cfg.model.transformer_layer_spec = local_layer_spec


def _deterministic(cfg: Any, tmp_path: Any) -> None:
    os.environ.pop("NVTE_ALLOW_NONDETERMINISTIC_ALGO", None)  # the environment is restored after each test
    cfg.model.deterministic_mode = True
    cfg.model.cross_entropy_loss_fusion = False


HYBRIDEP = {
    "model__num_moe_experts": 4,
    "model__moe_router_topk": 2,
    "model__expert_model_parallel_size": 2,
    "model__moe_token_dispatcher_type": "flex",
    "model__moe_flex_dispatcher_backend": "hybridep",
}
NEW_CASES = [
    Case(
        "moe.hybridep_uneven_inputs",
        "unpacked_cfg",
        8,
        _set(**HYBRIDEP),
        {
            "model.moe_flex_dispatcher_backend": "hybridep",
            "model.expert_model_parallel_size": 2,
            "dataset.dataset_kwargs.pad_to_max_length": False,
            "model.moe_hybridep_pad_uneven_dispatch_inputs": False,
        },
        {"model.moe_hybridep_pad_uneven_dispatch_inputs": True},
        also=("fixed_width.gpt_sft_experts",),
    ),
    Case(
        "gpt_sft.row_width_alignment",
        "unpacked_cfg",
        16,
        _set(**{**CP2_LOSS, "model__context_parallel_size": 16}),
        {
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 16,
            "dataset.dataset_kwargs.pad_to_max_length": False,
            "model.context_parallel_size": 16,
            "model.tensor_model_parallel_size": 1,
            "model.sequence_parallel": False,
        },
        {"dataset.dataset_kwargs.pad_seq_length_to_mult": 32},
        base_world=8,
    ),
    Case(
        "cp.sliding_window_comm_type",
        "packed_cfg",
        8,
        _set(
            **CP2_LOSS,
            model__window_size=(512, 0),
            model__attention_dropout=0.0,  # TE's FusedAttention takes windows without dropout only
            dataset__offline_packing_specs__pad_seq_to_mult=4,
        ),
        {
            "model.window_size": [512, 0],
            "model.cp_comm_type": None,
            "model.context_parallel_size": 2,
            "sliding-window layers": 12,
        },
        {"model.cp_comm_type": "all_gather"},
    ),
    Case(
        "cp.softmax_type_comm_type",
        "packed_cfg",
        8,
        # off-by-one: a learnable sink over THD also needs cuDNN >= 9.26 (TE's fixed rule), not declared here
        _set(**CP2_LOSS, model__softmax_type="off-by-one", dataset__offline_packing_specs__pad_seq_to_mult=4),
        {"model.softmax_type": "off-by-one", "model.cp_comm_type": None, "model.context_parallel_size": 2},
        {"model.cp_comm_type": "a2a"},
    ),
    Case(
        "cp.a2a_heads_divisible",
        "packed_cfg",
        8,
        _set(
            **{**CP2_LOSS, "model__context_parallel_size": 4},
            model__num_query_groups=2,
            model__cp_comm_type="a2a",
            dataset__offline_packing_specs__pad_seq_to_mult=8,
        ),
        {
            "model.num_attention_heads": 12,
            "model.num_query_groups": 2,
            "model.tensor_model_parallel_size": 1,
            "model.cp_comm_type": "a2a",
            "a2a group size": 4,
        },
        {"model.cp_comm_type": "p2p"},
    ),
    Case(
        "determinism.te_attention_env",
        "packed_cfg",
        8,
        _deterministic,
        {"model.deterministic_mode": True, "env NVTE_ALLOW_NONDETERMINISTIC_ALGO": None},
        {"env_vars.NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"},
    ),
    Case(
        "model.core_attention_packing",
        "packed_cfg",
        8,
        _local_attention,
        {"core attention": "DotProductAttention", "dataset.enable_offline_packing": True},
        {"dataset.enable_offline_packing": False, "dataset.offline_packing_specs": None},
    ),
    Case(
        "model.core_attention_cp",
        "unpacked_cfg",
        8,
        lambda cfg, tmp: (_local_attention(cfg, tmp), _set(**CP2_LOSS)(cfg, tmp)),
        {"core attention": "DotProductAttention", "model.context_parallel_size": 2},
        {"model.context_parallel_size": 1},
    ),
]
CASES += NEW_CASES


# ---- mechanism classes (issue #32): pretraining datasets, communication, model families, run lifecycle ----------
def _hybrid_mamba(cfg: Any, tmp_path: Any) -> None:
    """A small Mamba + attention hybrid provider as a user builds it (is_hybrid_model left at its False default)."""
    from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider

    cfg.model = HybridModelProvider(
        hybrid_layer_pattern="M*M-",
        hidden_size=256,
        num_attention_heads=4,
        mamba_num_heads=8,
        mamba_head_dim=32,
        vocab_size=1024,
        seq_length=4096,
    )


def _qwen3_omni(cfg: Any, tmp_path: Any) -> None:
    from megatron.bridge.models.qwen_omni.qwen3_omni_provider import Qwen3OmniModelProvider

    cfg.model = Qwen3OmniModelProvider(
        num_layers=2, hidden_size=128, num_attention_heads=4, ffn_hidden_size=256, seq_length=4096, vocab_size=1024
    )


TP2_SP = {"model__tensor_model_parallel_size": 2, "model__sequence_parallel": True}
MECHANISM_CASES = [
    Case(
        "pretraining.inter_document_masking",
        "pretrain_cfg",
        8,
        _set(dataset__inter_document_masking=True),
        {"dataset.inter_document_masking": True, "train.micro_batch_size": 1, "model.context_parallel_size": 1},
        {"dataset.inter_document_masking": False},
    ),
    Case(
        "pretraining.reset_attention_mask",
        "pretrain_cfg",
        8,
        _set(dataset__reset_attention_mask=True),
        {
            "dataset.reset_attention_mask": True,
            "dataset.create_attention_mask": True,
            "dataset.skip_getting_attention_mask_from_dataset": True,
        },
        {"dataset.reset_attention_mask": False},
    ),
    Case(
        "pretraining.reset_position_ids",
        "pretrain_cfg",
        8,
        _set(dataset__reset_position_ids=True),
        {"dataset.reset_position_ids": True, "model.position_embedding_type": "rope"},
        {"dataset.reset_position_ids": False},
    ),
    Case(
        "dataset.create_attention_mask",
        "pretrain_cfg",
        8,
        _set(**_seq(32768)),
        {
            "dataset.create_attention_mask": True,
            "dataset.seq_length": 32768,
            "dataset.num_workers": 2,
            "blend datasets": 1,
            "host GiB per node": 144.0,
        },
        {"dataset.create_attention_mask": False},
    ),
    Case(
        "cp.hybrid_context_parallel",
        "pretrain_cfg",
        8,
        _set(model__hybrid_context_parallel=True),
        {"model.hybrid_context_parallel": True, "model.pipeline_model_parallel_size": 1},
        {"model.hybrid_context_parallel": False},
    ),
    Case(
        "cp.comm_type_known",
        "packed_cfg",
        8,
        _set(**CP2_LOSS, dataset__offline_packing_specs__pad_seq_to_mult=4, model__cp_comm_type="allgather"),
        {"model.cp_comm_type": "allgather", "model.context_parallel_size": 2},
        {"model.cp_comm_type": "all_gather"},
    ),
    Case(
        "tp_comm_overlap.token_count",
        "packed_cfg",
        8,
        _set(**TP2_SP, model__tp_comm_overlap=True),
        {
            "model.tp_comm_overlap": True,
            "model.seq_length": 4096,
            "train.micro_batch_size": 1,
            "model.context_parallel_size": 1,
        },
        {KW: True},
    ),
    Case(
        "tp_comm_overlap.token_count",
        "pretrain_cfg",
        8,
        _set(
            **TP2_SP,
            model__tp_comm_overlap=True,
            validation__eval_micro_batch_size=2,
            validation__eval_global_batch_size=32,
        ),
        {
            "model.tp_comm_overlap": True,
            "model.seq_length": 4096,
            "train.micro_batch_size": 1,
            "validation.eval_micro_batch_size": 2,
        },
        {"validation.eval_micro_batch_size": 1},
    ),
    Case(
        "vlm.collate_refuses_packing",
        "vlm_cfg",
        8,
        _qwen3_omni,
        {"model": "Qwen3OmniModelProvider", "dataset.enable_in_batch_packing": True},
        {"dataset.enable_in_batch_packing": False},
    ),
    Case(
        "mamba.packing_needs_hybrid",
        "packed_cfg",
        8,
        _hybrid_mamba,
        {"model": "HybridModelProvider", "model.is_hybrid_model": False, "dataset.enable_offline_packing": True},
        {"model.is_hybrid_model": True},
    ),
    Case(
        "moe.router_counts_padding",
        "unpacked_cfg",
        8,
        _set(
            model__num_moe_experts=4,
            model__moe_router_topk=2,
            model__moe_aux_loss_coeff=0.01,
            **{"dataset__dataset_kwargs['pad_to_max_length']": True},
        ),
        {"model.num_moe_experts": 4, KW: True, "router terms": ["moe_aux_loss_coeff"]},
        fix="pack the rows (dataset.enable_offline_packing / enable_in_batch_packing) or leave them variable-width "
        "where the layout allows; Megatron-Bridge 0.6.2 has no setting that masks padding in the router",
        repair=_set(model__moe_aux_loss_coeff=0.0),
    ),
    Case(
        "fp8.packed_tokens_per_rank",
        "packed_cfg",
        8,
        _set(mixed_precision="bf16_with_nvfp4_mixed", **TP2_SP),
        {
            f"{SPECS}.packed_sequence_size": 4096,
            "dataset.dataset_kwargs.pad_seq_length_to_mult": 16,
            KW: False,
            "model.context_parallel_size": 1,
            "model.tensor_model_parallel_size": 2,
            "model.sequence_parallel": True,
        },
        {"dataset.dataset_kwargs.pad_seq_length_to_mult": 32},
    ),
]
CASES += MECHANISM_CASES


# ---- the rules whose only tests were elsewhere: one case each, on the same footing --------------------------------
def _env(**values: str) -> Callable[[Any, Any], None]:
    """Environment variables the launch has (the conftest fixture restores the environment after each test)."""

    def mutate(cfg: Any, tmp_path: Any) -> None:
        os.environ.update(values)

    return mutate


def _cp(n: int) -> Callable[[Any, Any], None]:
    """Context parallelism ``n`` with every field that follows from it derived (compose/derive.py)."""

    def mutate(cfg: Any, tmp_path: Any) -> None:
        from mbridge_seqpack.compose.mixins import derive

        cfg.model.context_parallel_size = n
        derive(cfg)

    return mutate


def _both_packing_flags(cfg: Any, tmp_path: Any) -> None:
    """A custom SFT dataset config that carries both packing switches, both on."""
    from megatron.bridge.data.builders import GPTSFTDatasetConfig

    @dataclass(kw_only=True)
    class HybridSFT(GPTSFTDatasetConfig):
        enable_in_batch_packing: bool = False

    old = cfg.dataset
    cfg.dataset = HybridSFT(
        seq_length=4096,
        dataset_root=old.dataset_root,
        enable_offline_packing=True,
        offline_packing_specs=old.offline_packing_specs,
        enable_in_batch_packing=True,
    )


def _old_mcore(monkeypatch: pytest.MonkeyPatch) -> None:
    from mbridge_seqpack.rules import cp

    monkeypatch.setattr(cp, "_mcore_version", lambda: (0, 17, 1))


def _eval_cp(cfg: Any, tmp_path: Any) -> None:
    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import ContextParallel

    apply(cfg, ContextParallel(2))
    cfg.dist.eval_context_parallel_size = 4


def _flash_over_padded_rows(cfg: Any, tmp_path: Any) -> None:
    """FlashAttention asked for over padded rows: FlashAttention 2 refuses THD with padding between sequences."""
    from megatron.core.transformer.enums import AttnBackend

    cfg.model.attention_backend = AttnBackend.flash
    cfg.dataset.offline_packing_specs.pad_seq_to_mult = 4


def _drop_kwarg(key: str) -> Callable[[Any, Any], None]:
    def mutate(cfg: Any, tmp_path: Any) -> None:
        cfg.dataset.dataset_kwargs.pop(key)

    return mutate


def _checkpoint_before_the_pack(cfg: Any, tmp_path: Any) -> None:
    """A checkpoint as Megatron-Bridge writes one, older than the pack the config reads."""
    from tests.support.checkpoints import write_checkpoint

    local = write_checkpoint(cfg, tmp_path / "ckpt", step=10, consumed=80)
    pack = Path(cfg.dataset.offline_packing_specs.packed_train_data_path).parent
    oldest = min(p.stat().st_mtime for p in pack.glob("*.parquet")) - 60
    os.utime(local, (oldest, oldest))


ROUTED_MOE = {"model__num_moe_experts": 4, "model__moe_router_topk": 2, "model__moe_aux_loss_coeff": 0.01}
CASES += [
    Case(
        "config.types",
        "packed_cfg",
        8,
        _set(model__tensor_model_parallel_size="1"),
        {"model.tensor_model_parallel_size": "1", "type": "str"},
        {"model.tensor_model_parallel_size": 1},
    ),
    Case(
        "packing.modes_exclusive",
        "packed_cfg",
        8,
        _both_packing_flags,
        {"dataset.enable_offline_packing": True, "dataset.enable_in_batch_packing": True},
        {"dataset.enable_in_batch_packing": False},
        also=("in_batch.micro_batch_gt_one",),
        repair=_set(dataset__enable_in_batch_packing=False),
    ),
    Case(
        "cp.thd_mcore_version",
        "packed_cfg",
        8,
        _cp(2),
        {"megatron.core.__version__": "0.17.1", "model.context_parallel_size": 2},
        fix="pip install 'megatron-core>=0.18' (or set cfg.model.context_parallel_size = 1)",
        patch=_old_mcore,
        repair=_cp(1),
    ),
    Case(
        "cp.eval_cp_has_no_effect",
        "packed_cfg",
        8,
        _eval_cp,
        {"dist.eval_context_parallel_size": 4, "model.context_parallel_size": 2},
        {"dist.eval_context_parallel_size": None},
    ),
    Case(
        "cuda_graphs.pad_cu_seqlens_needs_metadata",
        "packed_cfg",
        8,
        _metadata_breaks,
        lambda cfg, tmp_path: {
            f"{SPECS}.packed_metadata_path": None,
            f"{SPECS}.packed_train_data_path": str(tmp_path / "training_4096.idx.parquet"),
        },
        repair=_metadata_repair,
    ),
    Case(
        "cuda_graphs.te_scope_inputs",
        "hybrid_cfg",
        8,
        _both(_graphs(["mamba"]), _set(**{"dataset__dataset_kwargs['pad_to_max_length']": True})),
        {
            "model.cuda_graph_impl": "transformer_engine",
            "model.cuda_graph_modules": ["mamba"],
            "layer kinds": "mamba",
            "dataset.enable_offline_packing": True,
        },
        {"model.cuda_graph_modules": ["mlp"]},
    ),
    Case(
        "cuda_graphs.capture_host_reads",
        "packed_cfg",
        8,
        _both(
            _full_iteration(injected=True),
            _set(
                **{
                    "dataset__dataset_kwargs['pad_to_max_length']": True,
                    f"{SPECS}.pad_cu_seqlens".replace(".", "__"): True,
                    "ddp__check_for_nan_in_grad": True,  # Megatron-Bridge's SFT default: a host read in the step
                }
            ),
        ),
        {"model.cuda_graph_impl": "full_iteration", "ddp.check_for_nan_in_grad": True},
        {"ddp.check_for_nan_in_grad": False},
    ),
    Case(
        "attention.backend_available",
        "packed_cfg",
        8,
        _both(_env(MBRIDGE_SEQPACK_GPU_ARCH="sm90"), _flash_over_padded_rows),
        {
            "layers": "all 12 layers",
            "model.attention_backend": "AttnBackend.flash",
            f"{SPECS}.pad_seq_to_mult": 4,
            "pad_between_seqs": True,
            "env NVTE_FUSED_ATTN": "0",
            "env NVTE_UNFUSED_ATTN": "0",
            "target": "sm90",
        },
    ),
    Case(
        "attention.backend_env_conflict",
        "packed_cfg",
        8,
        _env(MBRIDGE_SEQPACK_GPU_ARCH="sm90", NVTE_FUSED_ATTN="0"),
        {"model.attention_backend": "AttnBackend.auto", "env NVTE_FUSED_ATTN": "0"},
        {"model.attention_backend": "auto"},
    ),
    Case(
        "equivalence.labels",
        "packed_cfg",
        8,
        _set(dataset__dataset_kwargs={"chat": True, "answer_only_loss": False}),
        {
            "dataset.enable_offline_packing": True,
            f"{SPECS}.pad_seq_to_mult": 1,
            f"{SPECS}.pad_cu_seqlens": False,
            KW: False,
            "dataset.dataset_kwargs.answer_only_loss": False,
            "measured": "9 tokens the unpacked run does not train get loss packed; 4 of 5 sequences get another loss "
            "sum or token count; the step reports lm loss 1.5 vs 1.462",
        },
        {"dataset.dataset_kwargs.answer_only_loss": True},
    ),
    Case(
        "equivalence.mtp_labels",
        "packed_cfg",
        8,
        _set(model__mtp_num_layers=1, dataset__offline_packing_specs__pad_seq_to_mult=16),
        {
            "model.mtp_num_layers": 1,
            "dataset.enable_offline_packing": True,
            f"{SPECS}.pad_seq_to_mult": 16,
            f"{SPECS}.pad_cu_seqlens": False,
            KW: False,
            "measured": "16 of 34 MTP labels cross a sequence boundary or differ from the unpacked run's",
        },
        {f"{SPECS}.pad_seq_to_mult": 1},
        also=("mtp.no_packing",),
    ),
    Case(
        "equivalence.router_padding",
        "packed_cfg",
        8,
        _set(**ROUTED_MOE),
        {
            "model.num_moe_experts": 4,
            "router terms": ["moe_aux_loss_coeff"],
            "dataset.enable_offline_packing": True,
            f"{SPECS}.pad_seq_to_mult": 1,
            f"{SPECS}.pad_cu_seqlens": False,
            KW: False,
            "measured": "27.1% of routed tokens are padding (13 of 48); tokens per expert move by 37.1% of the real "
            "load; load-balancing loss 1.114 vs 1.031 on real tokens only",
        },
        {"dataset.dataset_kwargs.pad_seq_length_to_mult": 1},
    ),
    Case(
        "gpt_sft.dataset_kwargs_accepted",
        "packed_cfg",
        8,
        _set(**{"dataset__dataset_kwargs['add_eso']": True}),
        {"dataset.dataset_kwargs.add_eso": True},
        fix="remove it: ~dataset.dataset_kwargs.add_eso (did you mean 'add_eos'? set it with "
        "++dataset.dataset_kwargs.add_eos=...)",
        repair=_drop_kwarg("add_eso"),
    ),
    Case(
        "artifact.fingerprint_mismatch",
        "pack_cfg",
        8,
        _set(dataset__offline_packing_specs__pad_seq_to_mult=1),
        lambda cfg, tmp_path: {
            f"{SPECS}.packed_train_data_path": cfg.dataset.offline_packing_specs.packed_train_data_path,
            "artifact pad_seq_to_mult": 4,
            f"{SPECS}.pad_seq_to_mult": 1,
        },
        {f"{SPECS}.pad_seq_to_mult": 4},
        also=("artifact.fingerprint_mismatch",),  # the validation split's file, the same way
    ),
    Case(
        "artifact.balance_layout",
        "pack_cfg",
        8,
        _set(dataset__seed=5678),
        {"pack sampler_seed": 1234, "dataset.seed": 5678},
        {"dataset.seed": 1234},
    ),
    Case(
        "eval.packed_split_rows",
        "pack_cfg",
        8,
        _set(validation__eval_iters=1),
        lambda cfg, tmp_path: {
            f"{SPECS}.packed_val_data_path": cfg.dataset.offline_packing_specs.packed_val_data_path,
            "validation rows": 2,
            "validation.eval_global_batch_size": 8,
            "dataset.dataloader_type": "batch",
        },
        {"validation.eval_iters": 0},
    ),
    Case(
        "resume.repacked_data",
        "pack_cfg",
        8,
        _checkpoint_before_the_pack,
        lambda cfg, tmp_path: {
            "checkpoint.load": str(tmp_path / "ckpt"),
            "checkpoint step": 10,
            "consumed_train_samples": 80,
            "training rows now": 40,
            "changed since the checkpoint": ["the pack was written after the checkpoint"],
        },
        repair=_set(checkpoint__finetune=True),
    ),
]


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


CASES += [
    Case(
        "launch.model_build",
        "packed_cfg",
        8,
        _set(model__calculate_per_token_loss=True, ddp__average_in_collective=True),
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
