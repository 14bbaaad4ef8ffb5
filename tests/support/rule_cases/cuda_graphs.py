"""The ``cuda_graphs.*`` rule cases (run by ``tests/rules/test_cuda_graphs.py``)."""

from __future__ import annotations

import os
from typing import Any, Callable

from tests.support.rule_cases import KW, SPECS, Case, in_turn, set_fields


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


def metadata_breaks(cfg: Any, tmp_path: Any) -> None:
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


def metadata_repair(cfg: Any, tmp_path: Any) -> None:
    meta = tmp_path / "4096_metadata.jsonl"
    meta.write_text('[{"max_samples_per_bin": 9, "dataset_max_seqlen": 4000, "min_packed_seqlen": 100}]')
    cfg.dataset.offline_packing_specs.packed_metadata_path = str(meta)


CASES = [
    Case(
        "cuda_graphs.pad_cu_seqlens_needs_fixed_width",
        "packed_cfg",
        8,
        set_fields(dataset__offline_packing_specs__pad_cu_seqlens=True),
        {f"{SPECS}.pad_cu_seqlens": True, KW: False},
        {KW: True},
    ),
    Case(
        "cuda_graphs.training_graphs_need_fixed_width",
        "packed_cfg",
        8,
        in_turn(_graphs(["mlp"])),
        {"model.cuda_graph_impl": "transformer_engine", KW: False},
        {KW: True},
    ),
    Case(
        "cuda_graphs.attention_graphs_need_pad_cu_seqlens",
        "packed_cfg",
        8,
        in_turn(_full_iteration(injected=True), set_fields(**{"dataset__dataset_kwargs['pad_to_max_length']": True})),
        {"model.cuda_graph_impl": "full_iteration", f"{SPECS}.pad_cu_seqlens": False},
        {f"{SPECS}.pad_cu_seqlens": True, KW: True},
    ),
    Case(
        "cuda_graphs.te_attention_over_packed",
        "packed_cfg",
        8,
        in_turn(_graphs(["attn"]), set_fields(**{"dataset__dataset_kwargs['pad_to_max_length']": True})),
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
        in_turn(
            _full_iteration(injected=False),
            set_fields(
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
        in_turn(
            _graphs(["mlp"]),
            set_fields(
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
        in_turn(_graphs(["mlp"], impl="local"), set_fields(**{"dataset__dataset_kwargs['pad_to_max_length']": True})),
        {
            "model.cuda_graph_impl": "local",
            "model.cuda_graph_modules": ["mlp"],
            "dataset.enable_offline_packing": True,
        },
        {"model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_modules": ["mlp"]},
    ),
    Case(
        "cuda_graphs.pad_cu_seqlens_needs_metadata",
        "packed_cfg",
        8,
        metadata_breaks,
        lambda cfg, tmp_path: {
            f"{SPECS}.packed_metadata_path": None,
            f"{SPECS}.packed_train_data_path": str(tmp_path / "training_4096.idx.parquet"),
        },
        repair=metadata_repair,
    ),
    Case(
        "cuda_graphs.te_scope_inputs",
        "hybrid_cfg",
        8,
        in_turn(_graphs(["mamba"]), set_fields(**{"dataset__dataset_kwargs['pad_to_max_length']": True})),
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
        in_turn(
            _full_iteration(injected=True),
            set_fields(
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
]
