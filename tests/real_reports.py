"""Misconfigurations from public bug reports, traced to the code that fails in Megatron-Bridge 0.6.2 /
Megatron-Core 0.19.2 / TE 2.20, each as a real ConfigContainer (a base config plus Megatron-Bridge Hydra overrides)
with the verdict the plugin must give: the error-level rules that fire, or none for a working near-miss.

``python -m tests.real_reports`` prints ``docs/real-reports.md``; ``tests/test_real_reports.py`` runs every entry and
keeps the page current. Reports that do not reproduce in these versions are listed with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

FIXED = "++dataset.dataset_kwargs.pad_to_max_length=true"
CP2 = ["model.context_parallel_size=2", "model.calculate_per_token_loss=true", "ddp.average_in_collective=false"]
TP8_SP = ["model.tensor_model_parallel_size=8", "model.sequence_parallel=true"]
TP4_SP = (
    "model.tensor_model_parallel_size=4",
    "model.sequence_parallel=true",
    "model.num_attention_heads=8",
    "model.num_query_groups=4",
)
SEQ_4100 = (
    "model.seq_length=4100",
    "dataset.seq_length=4100",
    "dataset.offline_packing_specs.packed_sequence_size=4100",
)
CP4_A2A_P2P = (
    "model.context_parallel_size=4",
    "model.calculate_per_token_loss=true",
    "ddp.average_in_collective=false",
    "dataset.offline_packing_specs.pad_seq_to_mult=8",
    "model.cp_comm_type=a2a+p2p",
)


@dataclass(frozen=True)
class Report:
    """One traced report: where it was reported, what fails where, and the config that reproduces it."""

    url: str
    title: str
    failing: str  # file:function that fails (or, for a near-miss, why the config works)
    base: str  # "packed": GPT SFT offline packed at 4096, global batch 16; "vlm": in-batch packed, micro batch 2
    overrides: tuple[str, ...]
    expected: tuple[str, ...] = ()  # error-level rule ids; () = a working near-miss that must be accepted
    world: int = 8


MLM = "https://github.com/NVIDIA/Megatron-LM"
MB = "https://github.com/NVIDIA-NeMo/Megatron-Bridge"

REPORTS: tuple[Report, ...] = (
    Report(
        f"{MLM}/issues/5619",
        "TE CUDA graphs do not support THD packed attention",
        "megatron/core/transformer/transformer_layer.py TransformerLayer._te_cuda_graph_replay (assert)",
        "packed",
        (
            FIXED,
            "dataset.offline_packing_specs.pad_cu_seqlens=true",
            "model.cuda_graph_impl=transformer_engine",
            "model.cuda_graph_modules=[attn]",
        ),
        ("cuda_graphs.te_attention_over_packed",),
    ),
    Report(
        f"{MLM}/issues/5619",
        "near-miss: the same graphs capturing only the MLP",
        "attention runs eagerly with the packed params; the graph takes fixed-width hidden states",
        "packed",
        (FIXED, "model.cuda_graph_impl=transformer_engine", "model.cuda_graph_modules=[mlp]"),
    ),
    Report(
        "https://github.com/modelscope/ms-swift/issues/9723",
        "MXFP8 + sequence parallel + packing: dims must be divisible by 32",
        "transformer_engine/pytorch/csrc/quantizer.cpp create_tensor (MXFP8 block of 32 tokens per TP shard)",
        "packed",
        (
            "mixed_precision=bf16_with_mxfp8_mixed",
            "model.tensor_model_parallel_size=2",
            "model.sequence_parallel=true",
        ),
        ("fp8.packed_tokens_per_rank",),
    ),
    Report(
        "https://github.com/modelscope/ms-swift/issues/9723",
        "near-miss: MXFP8 + SP over fixed-width 4096-token rows (2048 tokens per shard)",
        "every shard is a multiple of 32 tokens",
        "packed",
        (
            "mixed_precision=bf16_with_mxfp8_mixed",
            "model.tensor_model_parallel_size=2",
            "model.sequence_parallel=true",
            FIXED,
        ),
    ),
    Report(
        "https://github.com/NovaSky-AI/SkyRL/pull/1828",
        "FP8 packed sequences: the rank-local token dimension must be 16-aligned (TP=8)",
        "transformer_engine/pytorch/utils.py assert_dim_for_fp8_exec; cuBLASLt FP8 GEMM 'lda % 16'",
        "packed",
        (
            "mixed_precision=bf16_with_fp8_current_scaling_mixed",
            *TP8_SP,
            "model.num_attention_heads=16",
            "model.num_query_groups=8",
        ),
        ("fp8.packed_tokens_per_rank",),
    ),
    Report(
        "https://github.com/NovaSky-AI/SkyRL/pull/1828",
        "near-miss: the same with rows rounded to 16 * TP = 128 tokens",
        "16 tokens per rank",
        "packed",
        (
            "mixed_precision=bf16_with_fp8_current_scaling_mixed",
            *TP8_SP,
            "model.num_attention_heads=16",
            "model.num_query_groups=8",
            "++dataset.dataset_kwargs.pad_seq_length_to_mult=128",
        ),
    ),
    Report(
        "https://github.com/NVIDIA-NeMo/Speech/pull/8869",
        "GPT SFT with CP and FP8: 'FP8 execution requires 2D input matrices with height divisible by 8'",
        "transformer_engine/pytorch/utils.py assert_dim_for_fp8_exec on the CP-local share of a variable-width row",
        "packed",
        (
            "mixed_precision=bf16_with_fp8_delayed_scaling_mixed",
            *CP2,
            "dataset.offline_packing_specs.pad_seq_to_mult=4",
        ),
        ("fp8.packed_tokens_per_rank",),
    ),
    Report(
        "https://github.com/NVIDIA-NeMo/Speech/pull/8869",
        "near-miss: the same with rows rounded to 16 * CP = 32 tokens (the PR's fix)",
        "16 tokens per CP rank",
        "packed",
        (
            "mixed_precision=bf16_with_fp8_delayed_scaling_mixed",
            *CP2,
            "dataset.offline_packing_specs.pad_seq_to_mult=4",
            "++dataset.dataset_kwargs.pad_seq_length_to_mult=32",
        ),
    ),
    Report(
        "https://github.com/NVIDIA-NeMo/RL/pull/3563",
        "sequence parallelism runs on the CP-local sequence: rows need lcm(2*CP, CP*TP)",
        "megatron/core/tensor_parallel/mappings.py _split_along_first_dim after the THD CP split (4100 % 8)",
        "packed",
        (*SEQ_4100, FIXED, *CP2, "dataset.offline_packing_specs.pad_seq_to_mult=4", *TP4_SP),
        ("offline.row_width_alignment",),
    ),
    Report(
        "https://github.com/NVIDIA-NeMo/RL/pull/3563",
        "near-miss: 4104-token rows (divisible by lcm(2*CP, CP*TP) = 8)",
        "every CP shard splits evenly across TP",
        "packed",
        (
            *(o.replace("4100", "4104") for o in SEQ_4100),
            FIXED,
            *CP2,
            "dataset.offline_packing_specs.pad_seq_to_mult=4",
            *TP4_SP,
        ),
    ),
    Report(
        f"{MB}/issues/1292",
        "Sequence packing with context parallel (CP) > 1 is not working",
        "megatron/core/utils.py get_thd_cp_partition_indices -> TE thd_get_partitioned_indices (sequences not "
        "padded to 2*CP)",
        "packed",
        (*CP2, "dataset.offline_packing_specs.pad_seq_to_mult=1"),
        ("offline.alignment_multiple",),
    ),
    Report(
        f"{MB}/issues/1292",
        "near-miss: CP=2 with every sequence padded to 4",
        "the THD split cuts every sequence into 4 equal chunks",
        "packed",
        (*CP2, "dataset.offline_packing_specs.pad_seq_to_mult=4"),
    ),
    Report(
        f"{MLM}/pull/3714",
        "CP > 1 without per-token loss: the loss is averaged per CP shard (padding and loss masks skew it)",
        "megatron/bridge/training/config.py ConfigContainer.validate asserts it for fine-tuning",
        "packed",
        ("model.context_parallel_size=2", "dataset.offline_packing_specs.pad_seq_to_mult=4"),
        ("cp.finetune_per_token_loss",),
    ),
    Report(
        "https://github.com/NVIDIA/TransformerEngine/issues/1080",
        "var-len attention with CP: every sequence must be padded to a multiple of 2*CP",
        "TE thd_get_partitioned_indices (a multiple of 2, not 4, at CP=2)",
        "packed",
        (*CP2, "dataset.offline_packing_specs.pad_seq_to_mult=2"),
        ("offline.alignment_multiple",),
    ),
    Report(
        "https://github.com/snowflakedb/ArcticTraining/pull/312",
        "SFT data packing only with micro batch size 1",
        "megatron/bridge/training/config.py ConfigContainer.validate raises 'Micro batch size should be 1'",
        "packed",
        ("train.micro_batch_size=2", "train.global_batch_size=32"),
        ("offline.micro_batch_one",),
    ),
    Report(
        f"{MB}/pull/1916",
        "pipeline parallelism expects static shapes but GPT SFT batches are only as wide as their content",
        "megatron/core/pipeline_parallel/schedules.py get_tensor_shapes sizes P2P buffers from seq_length",
        "packed",
        ("model.pipeline_model_parallel_size=2", "dataset.dataloader_type=single"),
        ("fixed_width.gpt_sft_pipeline",),
    ),
    Report(
        f"{MB}/pull/1916",
        "near-miss: the same pipeline over fixed-width packed rows",
        "every micro batch is seq_length wide",
        "packed",
        ("model.pipeline_model_parallel_size=2", "dataset.dataloader_type=single", FIXED),
    ),
    Report(
        f"{MB}/issues/2667",
        "cp_comm_type=a2a+p2p silently disables context parallelism without hierarchical_context_parallel_sizes",
        "megatron/core/extensions/transformer_engine.py TEDotProductAttention.__init__ (cp_group None)",
        "packed",
        CP4_A2A_P2P,
        ("cp.hierarchical_sizes_required",),
    ),
    Report(
        f"{MB}/issues/2667",
        "near-miss: a2a+p2p with hierarchical sizes [2, 2]",
        "the hierarchical CP groups exist",
        "packed",
        (*CP4_A2A_P2P, "model.hierarchical_context_parallel_sizes=[2,2]"),
    ),
    Report(
        "https://github.com/NVIDIA-NeMo/RL/issues/2110",
        "TP > 1 with sequence parallelism and packing: sequence length not divisible",
        "megatron/core/tensor_parallel/mappings.py _reduce_scatter_along_first_dim (rows 16-token aligned, TP=32)",
        "packed",
        (
            "model.tensor_model_parallel_size=32",
            "model.sequence_parallel=true",
            "model.num_attention_heads=32",
            "model.num_query_groups=32",
            "train.global_batch_size=32",
        ),
        ("offline.row_width_alignment",),
        world=32,
    ),
    Report(
        "https://github.com/NVIDIA-NeMo/RL/issues/2110",
        "near-miss: TP=8 with sequence parallelism (16-token rows split 8 ways)",
        "every row divides by TP",
        "packed",
        (*TP8_SP, "model.num_attention_heads=16", "model.num_query_groups=8"),
    ),
    Report(
        f"{MLM}/pull/5271",
        "variable_seq_lengths at PP=2 with the interleaved schedule: P2P shapes silently swapped (also "
        f"{MLM}/issues/5100)",
        "megatron/core/pipeline_parallel/p2p_communication.py P2PCommunicator._communicate_shapes",
        "vlm",
        ("model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=2"),
        ("pipeline.variable_shapes_interleaved_pp2",),
    ),
    Report(
        f"{MLM}/pull/5271",
        "near-miss: in-batch packing at PP=2 without the interleaved schedule",
        "one send and one receive per peer per step",
        "vlm",
        ("model.pipeline_model_parallel_size=2",),
    ),
    Report(
        f"{MLM}/pull/4495",
        "MTP roll for THD with CP uses the unpadded cu_seqlens: labels leak across sequences",
        "megatron/core/transformer/multi_token_prediction.py _roll_tensor_packed_seq (CP branch)",
        "packed",
        (*CP2, "dataset.offline_packing_specs.pad_seq_to_mult=4", "model.mtp_num_layers=1"),
        ("mtp.packed_context_parallel",),
    ),
    Report(
        f"{MLM}/issues/1661",
        "near-miss: MTP + sequence packing at CP=1 (reported incompatible; 0.19.2 rolls within sequences)",
        "multi_token_prediction.py _roll_tensor_packed_seq rolls each sequence within its boundaries",
        "packed",
        ("model.mtp_num_layers=1",),
    ),
    Report(
        f"{MB}/issues/2952",
        "near-miss: PP>2 packed SFT (middle stages used to miss cu_seqlens; 0.6.2 passes them)",
        "training/gpt_step.py get_batch: _middle_pp_stage_needs_batch is True for packed data",
        "packed",
        (FIXED, "model.pipeline_model_parallel_size=4", "train.global_batch_size=8"),
    ),
)

#: reports looked at that do not reproduce as a config in these versions, and why
NOT_REPRODUCED: tuple[tuple[str, str], ...] = (
    (
        f"{MB}/issues/2952",
        "middle pipeline stages without cu_seqlens (documents attend across each other): fixed before 0.6.2 "
        "(gpt_step.get_batch gives packed middle stages the full batch); kept above as a near-miss",
    ),
    (
        f"{MB}/issues/4143",
        "Qwen3-VL SFT with dynamic padding under CP/TP/PP: for its VLM datasets Megatron-Bridge 0.6.2's validate() "
        "turns pad_to_max_length on whenever PP>1 (training/config.py), so the dynamic-padding path never runs",
    ),
    (
        f"{MLM}/issues/1647",
        "MTP roll across packed sequences at CP=1: Megatron-Core 0.19.2 rolls within each sequence",
    ),
    (
        f"{MB}/issues/1232",
        "get_packed_seq_params fails converting a tensor to a scalar during evaluation: the thread's visible part "
        "does not show the config; an evaluation micro batch of several packed rows fails exactly so "
        "(offline.eval_micro_batch_one, tested on Megatron-Bridge's collate), but the report is not confirmed as "
        "that case",
    ),
)


def render_markdown() -> str:
    lines = [
        "# Packing failures from public reports",
        "",
        "Generated from `tests/real_reports.py` (`python -m tests.real_reports`); `tests/test_real_reports.py` builds",
        "every row as a Megatron-Bridge `ConfigContainer` (a base config plus Hydra overrides) and checks the",
        "verdict. Failures must be rejected by exactly the rules named; near-misses must be accepted.",
        "",
        f"{sum(1 for r in REPORTS if r.expected)} failures, {sum(1 for r in REPORTS if not r.expected)} near-misses.",
        "",
        "| report | what | failing code | world | overrides | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for r in REPORTS:
        verdict = ", ".join(f"`{x}`" for x in r.expected) if r.expected else "accepted"
        overrides = " ".join(f"`{o}`" for o in r.overrides)
        lines.append(f"| {r.url} | {r.title} | {r.failing} | {r.world} | {r.base}: {overrides} | {verdict} |")
    lines += ["", "## Reports that do not reproduce in these versions", ""]
    lines += [f"- {url}: {why}." for url, why in NOT_REPRODUCED]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
