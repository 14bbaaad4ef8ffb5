"""Misconfigurations from public bug reports, traced to the code that fails in Megatron-Bridge 0.6.2 /
Megatron-Core 0.19.2 / TE 2.20, each as a real ConfigContainer (a base config plus Megatron-Bridge Hydra overrides)
with the verdict the plugin must give: the error-level rules that fire, or none for a working near-miss.

``python -m tests.support.real_reports`` prints ``docs/real-reports.md``; ``tests/rules/test_real_reports.py`` runs
every entry and keeps the page current. Reports that do not reproduce in these versions are listed with the reason.
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
    base: str  # a key of BASES
    overrides: tuple[str, ...]
    expected: tuple[str, ...] = ()  # error-level rule ids; () = a working near-miss that must be accepted
    world: int = 8
    pack_mult: int | None = None  # the config reads a pack of the embedded data made at this pad_seq_to_mult
    advisories: tuple[str, ...] = ()  # advisory rule ids the report's config must also get
    val_pack: bool = False  # the config reads a pack of the embedded training and validation data (pad 1)


#: the ConfigContainers the overrides apply to (tests/conftest.py fixtures ``<base>_cfg``), all valid at world size 8
BASES = {
    "packed": "small GPT, GPT SFT offline packed at 4096, micro batch 1, global batch 16",
    "unpacked": "small GPT, GPT SFT without packing (variable-width rows), global batch 16",
    "vlm": "small GPT, Megatron-Bridge's mock VLM dataset, in-batch packed, micro batch 2, global batch 16",
    "qwen3vl": "the vlm base with a small Qwen3VLModelProvider",
    "energon": "small GPT, Energon dataset with online packing (packing_buffer_size 64), per-token loss",
    "gemma2": "the packed base with a small Gemma2ModelProvider (Gemma-2's own core attention)",
    "pretrain": "small GPT on Megatron-Bridge's pretraining defaults (mock GPTDataset data), global batch 16",
    "hybrid": "the packed base with a small Mamba + attention HybridModelProvider (is_hybrid_model=True)",
    "qwen3omni": "the vlm base with a small Qwen3OmniModelProvider",
}
MOE_HYBRIDEP = (
    "model.num_moe_experts=4",
    "model.moe_router_topk=2",
    "model.expert_model_parallel_size=2",
    "model.moe_token_dispatcher_type=flex",
    "model.moe_flex_dispatcher_backend=hybridep",
)
BLOCKWISE_TP4_SP = ("mixed_precision=bf16_with_fp8_subchannel_scaling_mixed", *TP4_SP)
SEQ_32K = (
    "model.seq_length=32768",
    "dataset.seq_length=32768",
    "dataset.offline_packing_specs.packed_sequence_size=32768",
)
CP16 = ("model.context_parallel_size=16", "model.calculate_per_token_loss=true", "ddp.average_in_collective=false")
VLM_CP2_TP4_SP = (*CP2, *TP4_SP, "train.global_batch_size=2")
CP4 = ("model.context_parallel_size=4", "model.calculate_per_token_loss=true", "ddp.average_in_collective=false")
#: windowed layers train without attention dropout (Transformer Engine's FusedAttention takes windows only then, and
#: FlashAttention 3 takes no dropout: with CP over padded THD no backend would be left, attention.backend_available)
SWA_CP2 = (
    "++model.window_size=[512,0]",
    "model.attention_dropout=0.0",
    *CP2,
    "dataset.offline_packing_specs.pad_seq_to_mult=4",
)
A2A_CP4 = (*CP4, "dataset.offline_packing_specs.pad_seq_to_mult=8", "model.cp_comm_type=a2a")
TP32_SP = (
    "model.tensor_model_parallel_size=32",
    "model.sequence_parallel=true",
    "model.num_attention_heads=32",
    "model.num_query_groups=32",
    "train.global_batch_size=32",
)
FP8_TP2_SP = (
    "mixed_precision=bf16_with_fp8_delayed_scaling_mixed",
    "model.tensor_model_parallel_size=2",
    "model.sequence_parallel=true",
)
DETERMINISTIC = ("model.deterministic_mode=true", "model.cross_entropy_loss_fusion=false")
TP2_SP_OVERLAP = ("model.tensor_model_parallel_size=2", "model.sequence_parallel=true", "model.tp_comm_overlap=true")
SEQ_96K = ("model.seq_length=98304", "dataset.seq_length=98304", "dataset.num_workers=0")

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
    Report(
        "https://github.com/alibaba/Pai-Megatron-Patch/issues/413",
        "SFT on packed data fails with micro batch size > 1 (THD varlen attention takes one row)",
        "megatron/bridge/training/config.py ConfigContainer.validate raises 'Micro batch size should be 1'",
        "packed",
        ("train.micro_batch_size=2", "train.global_batch_size=32"),
        ("offline.micro_batch_one",),
    ),
    Report(
        f"{MLM}/pull/5454",
        "micro batch > 1 of packed rows: get_batch keeps only the first row's cu_seqlens, silently",
        "megatron/bridge/training/utils/packed_seq_utils.py get_packed_seq_params on an evaluation micro batch of "
        "several packed rows",
        "packed",
        ("validation.eval_micro_batch_size=2",),
        ("offline.eval_micro_batch_one",),
    ),
    Report(
        "https://github.com/NVIDIA/TransformerEngine/issues/1930",
        "packing + CP: a sequence not a multiple of 2*CP is silently rounded down (its last token dropped)",
        "TE thd_get_partitioned_indices / attention cu_seqlens // (2*CP) at CP=8 with sequences padded to 8",
        "packed",
        (
            "model.context_parallel_size=8",
            "model.calculate_per_token_loss=true",
            "ddp.average_in_collective=false",
            "dataset.offline_packing_specs.pad_seq_to_mult=8",
        ),
        ("offline.alignment_multiple",),
    ),
    Report(
        "https://github.com/hiyouga/LlamaFactory/issues/10108",
        "neat_packing + context_parallel_size=4: sub-sequences not aligned to 2*CP (also alibaba/ROLL#325)",
        "megatron/core/utils.py get_thd_cp_partition_indices -> TE thd_get_partitioned_indices",
        "packed",
        (*SEQ_32K, *CP4, "dataset.offline_packing_specs.pad_seq_to_mult=4"),
        ("offline.alignment_multiple",),
    ),
    Report(
        "https://github.com/hiyouga/LlamaFactory/issues/10108",
        "near-miss: the same 32k CP=4 run with sequences padded to 8",
        "every sequence splits into 2*CP equal chunks",
        "packed",
        (*SEQ_32K, *CP4, "dataset.offline_packing_specs.pad_seq_to_mult=8"),
    ),
    Report(
        f"{MB}/issues/768",
        "model seq_length 131072 against a dataset seq_length of 8192: AssertionError at validate",
        "megatron/bridge/training/config.py ConfigContainer.validate asserts model.seq_length == dataset.seq_length",
        "packed",
        ("model.seq_length=131072",),
        ("seq_length.model_matches_dataset",),
    ),
    Report(
        f"{MB}/issues/1539",
        "near-miss: model and dataset seq_length 2048 with 8192-token packs (the maintainers: safe)",
        "THD attention and RoPE work per sequence (max_seqlen <= 2048); the pack width is not model.seq_length",
        "packed",
        (
            "model.seq_length=2048",
            "dataset.seq_length=2048",
            "dataset.offline_packing_specs.packed_sequence_size=8192",
        ),
    ),
    Report(
        "https://github.com/NVIDIA-NeMo/RL/pull/1884",
        "blockwise FP8 with packing and sequence parallelism: the packed length must suit the FP8 recipe",
        "transformer_engine/pytorch/module/linear.py -> utils.assert_dim_for_fp8_exec on a 4-token-aligned TP "
        "shard (16-token rows split by TP=4)",
        "packed",
        BLOCKWISE_TP4_SP,
        ("fp8.packed_tokens_per_rank",),
    ),
    Report(
        "https://github.com/NVIDIA-NeMo/RL/pull/1884",
        "near-miss: blockwise FP8 + SP with rows rounded to 16 * TP = 64 tokens",
        "16 tokens per TP shard",
        "packed",
        (*BLOCKWISE_TP4_SP, "++dataset.dataset_kwargs.pad_seq_length_to_mult=64"),
    ),
    Report(
        "https://github.com/deepseek-ai/DeepEP/issues/604",
        "HybridEP hangs (and mis-routes) in SFT with variable sequence lengths across EP ranks",
        "megatron/core/transformer/moe/token_dispatcher.py _HybridEPManager.setup_metadata (equal per-rank "
        "token counts unless moe_hybridep_pad_uneven_dispatch_inputs)",
        "unpacked",
        MOE_HYBRIDEP,
        ("moe.hybridep_uneven_inputs",),
    ),
    Report(
        "https://github.com/deepseek-ai/DeepEP/issues/604",
        "near-miss: HybridEP over THD-packed rows (Megatron-Bridge turns the uneven-input padding on)",
        "models/transformer_config.py _enable_safe_hybridep_dispatch sets moe_hybridep_pad_uneven_dispatch_inputs",
        "packed",
        MOE_HYBRIDEP,
    ),
    Report(
        f"{MLM}/pull/7102",
        "full-iteration CUDA graphs replay one captured packed layout; variable packed batches are unsupported",
        "megatron/core/full_cuda_graph.py FullCudaGraphWrapper.data_read copies each batch into the first "
        "batch's buffers",
        "packed",
        ("model.cuda_graph_impl=local", "model.cuda_graph_scope=full_iteration"),
        ("cuda_graphs.attention_graphs_need_pad_cu_seqlens", "cuda_graphs.training_graphs_need_fixed_width"),
    ),
    Report(
        f"{MLM}/pull/5046",
        "local (MCore) per-layer CUDA graphs cannot train on variable-sized packed sequences",
        "megatron/bridge/utils/cuda_graph.py validate_cuda_graph_configuration refuses local per-layer graphs",
        "packed",
        (FIXED, "model.cuda_graph_impl=local"),
        ("cuda_graphs.local_per_layer",),
    ),
    Report(
        f"{MLM}/pull/4359",
        "TE whole-layer CUDA graphs over THD packed rows (partial THD graph support is post-0.19)",
        "megatron/core/transformer/transformer_layer.py TransformerLayer._te_cuda_graph_replay (assert)",
        "packed",
        (
            FIXED,
            "dataset.offline_packing_specs.pad_cu_seqlens=true",
            "model.cuda_graph_impl=transformer_engine",
            "model.cuda_graph_modules=[]",
        ),
        ("cuda_graphs.te_attention_over_packed",),
    ),
    Report(
        f"{MB}/pull/2372",
        "Qwen3-VL CUDA graphs with in-batch packing under PP (variable_seq_lengths)",
        "megatron/bridge/models/qwen_vl/modelling_qwen3_vl/model.py "
        "Qwen3VLModel._expose_language_model_for_cuda_graph_helper (assert)",
        "qwen3vl",
        (
            "model.pipeline_model_parallel_size=2",
            "model.cuda_graph_impl=transformer_engine",
            "model.cuda_graph_modules=[mlp]",
        ),
        ("in_batch.no_cuda_graphs",),
    ),
    Report(
        "https://github.com/radixark/miles/pull/2870",
        "near-miss: Qwen3-VL at CP=2 without calculate_per_token_loss (its provider turns it on in finalize)",
        "models/qwen_vl/qwen3_vl_provider.py Qwen3VLModelProvider.finalize runs before validate's CP assertion",
        "qwen3vl",
        ("model.context_parallel_size=2", "ddp.average_in_collective=false"),
    ),
    Report(
        f"{MLM}/issues/1764",
        "context parallel NaN loss when every token on a CP rank is masked (per-sample loss divides by zero)",
        "megatron/bridge/training/config.py ConfigContainer.validate asserts calculate_per_token_loss under CP",
        "vlm",
        ("model.context_parallel_size=2", "ddp.average_in_collective=false"),
        ("cp.finetune_per_token_loss",),
    ),
    Report(
        f"{MB}/issues/5954",
        "near-miss: Energon online packing with MTP (refused on main until #5990; 0.6.2 has no guard)",
        "multi_token_prediction.py _roll_tensor_packed_seq rolls each packed sequence within its boundaries",
        "energon",
        ("model.mtp_num_layers=1",),
    ),
    Report(
        f"{MLM}/issues/3798",
        "near-miss: gated-delta-net (Qwen3-Next style) layers over packed rows (THD GDN since Megatron-Core 0.18; "
        "also modelscope/ms-swift#7981)",
        "megatron/core/ssm/gated_delta_net.py takes THD cu_seqlens; the recipes' packing opt-out is an advisory",
        "packed",
        ("++model.experimental_attention_variant=gated_delta_net", "++model.linear_attention_freq=4"),
    ),
    Report(
        "https://github.com/icip-cas/AutoAlign/pull/65",
        "pipeline-parallel SFT with dynamic padding needs variable-seq-lengths or fixed seq_length padding",
        "megatron/core/pipeline_parallel/schedules.py get_tensor_shapes sizes P2P buffers from seq_length",
        "packed",
        ("model.pipeline_model_parallel_size=4", "dataset.dataloader_type=single", "train.global_batch_size=8"),
        ("fixed_width.gpt_sft_pipeline",),
    ),
    Report(
        f"{MB}/pull/2825",
        "near-miss: in-batch packing at PP=4 (Megatron-Bridge turns variable_seq_lengths on)",
        "models/transformer_config.py TransformerConfig.finalize sets variable_seq_lengths for in-batch packing "
        "under PP",
        "vlm",
        ("model.pipeline_model_parallel_size=4",),
    ),
    Report(
        "https://github.com/NVIDIA-NeMo/Speech/issues/14488",
        "NaN loss with context parallelism on heavily padded fine-tuning data",
        "megatron/bridge/training/config.py ConfigContainer.validate asserts average_in_collective=False under "
        "CP fine-tuning (per-token sums must not be averaged again)",
        "packed",
        (*CP2, "dataset.offline_packing_specs.pad_seq_to_mult=4", "ddp.average_in_collective=true"),
        ("cp.finetune_average_in_collective",),
    ),
    Report(
        f"{MB}/issues/2642",
        "variable-length GPT SFT rows padded to 16 while CP=16 needs 32: the CP split fails",
        "megatron/core/utils.py get_batch_on_this_cp_rank views each 16-aligned row as 2*CP = 32 chunks",
        "unpacked",
        (*CP16, "train.global_batch_size=8"),
        ("gpt_sft.row_width_alignment",),
        world=16,
    ),
    Report(
        f"{MB}/issues/2642",
        "near-miss: the same run with pad_seq_length_to_mult=32",
        "every row splits into 2*CP equal chunks",
        "unpacked",
        (*CP16, "train.global_batch_size=8", "++dataset.dataset_kwargs.pad_seq_length_to_mult=32"),
        world=16,
    ),
    Report(
        f"{MB}/pull/2932",
        "VLM packing with CP=2 + TP=4 + SP: the collate multiple must be lcm(2*CP, CP*TP) = 8",
        "megatron/bridge/training/config.py ConfigContainer.validate raises '<Dataset>.seq_length must be "
        "divisible by the CP/SP collate padding multiple'",
        "vlm",
        (*VLM_CP2_TP4_SP, "model.seq_length=4100", "dataset.seq_length=4100"),
        ("collate.seq_length_alignment",),
    ),
    Report(
        f"{MB}/pull/2932",
        "near-miss: the same VLM run at seq_length 4096",
        "in-batch packing pads every sequence to lcm(2*CP, CP*TP) = 8",
        "vlm",
        VLM_CP2_TP4_SP,
    ),
    Report(
        "https://github.com/PaddlePaddle/PaddleNLP/pull/8973",
        "variable-length (zero-padding) batches not divisible by the TP degree under sequence parallelism",
        "megatron/core/tensor_parallel/mappings.py _split_along_first_dim on a 16-aligned row at TP=32",
        "unpacked",
        TP32_SP,
        ("gpt_sft.row_width_alignment",),
        world=32,
    ),
    Report(
        "https://github.com/PaddlePaddle/PaddleNLP/pull/8973",
        "near-miss: the same run padding every row to max length (the PR's fix)",
        "4096-token rows split 32 ways",
        "unpacked",
        (*TP32_SP, "++dataset.dataset_kwargs.pad_to_max_length=true"),
        world=32,
    ),
    Report(
        "https://github.com/NVIDIA/TransformerEngine/pull/2911",
        "FP8 GEMMs over unaligned packed token counts: 'Assertion failed: ret.lda % 16 == 0' (TP=2 shards of "
        "16-aligned rows)",
        "transformer_engine/pytorch/module/linear.py FP8 wgrad GEMM on an 8-token-aligned TP shard",
        "packed",
        FP8_TP2_SP,
        ("fp8.packed_tokens_per_rank",),
    ),
    Report(
        "https://github.com/NVIDIA/TransformerEngine/pull/2911",
        "near-miss: the same FP8 run with rows rounded to 16 * TP = 32 tokens",
        "16 tokens per TP shard",
        "packed",
        (*FP8_TP2_SP, "++dataset.dataset_kwargs.pad_seq_length_to_mult=32"),
    ),
    Report(
        "https://github.com/NVIDIA-NeMo/Automodel/issues/3325",
        "MoE + EP + HybridEP with natural (unpadded) sequence lengths per rank fails at the first backward; "
        "max-length padding passes",
        "megatron/core/transformer/moe/token_dispatcher.py _HybridEPManager.setup_metadata (unequal token counts "
        "across the EP group)",
        "unpacked",
        (
            *MOE_HYBRIDEP,
            "model.recompute_granularity=full",
            "model.recompute_method=uniform",
            "model.recompute_num_layers=1",
        ),
        ("moe.hybridep_uneven_inputs",),
    ),
    Report(
        "https://github.com/NVIDIA-NeMo/Automodel/issues/3325",
        "near-miss: the same run padded to max length (the report's passing configuration)",
        "every EP rank dispatches seq_length tokens",
        "unpacked",
        (*MOE_HYBRIDEP, "++dataset.dataset_kwargs.pad_to_max_length=true"),
    ),
    Report(
        f"{MB}/pull/1867",
        "a pack prepared at CP=1 reused after raising CP to 2 (review: the packed path must record the CP padding)",
        "megatron/bridge/data/datasets/gpt_sft.py GPTSFTPackedDataset reads sequences padded to 1, which the "
        "THD CP split cannot cut into 2*CP chunks",
        "packed",
        (*CP2, "dataset.offline_packing_specs.pad_seq_to_mult=4"),
        ("artifact.fingerprint_mismatch",),
        pack_mult=1,
    ),
    Report(
        f"{MB}/pull/1867",
        "near-miss: the same CP=2 run reading a pack prepared with pad_seq_to_mult=4",
        "the pack's sequences are padded to 2*CP",
        "packed",
        (*CP2, "dataset.offline_packing_specs.pad_seq_to_mult=4"),
        pack_mult=4,
    ),
    Report(
        "https://github.com/meta-pytorch/torchtune/issues/2056",
        "Gemma-2 with packed=True fails: its attention cannot take packed-document masks (Megatron-Bridge "
        "0.6.2 ships its Gemma-2 SFT recipes packed)",
        "megatron/bridge/models/gemma/gemma2_provider.py Gemma2FlexDotProductAttention.forward raises 'Packed "
        "sequence is not supported by DotProductAttention'",
        "gemma2",
        (),
        ("model.core_attention_packing",),
    ),
    Report(
        "https://github.com/meta-pytorch/torchtune/issues/2056",
        "near-miss: the same Gemma-2 fine-tuning unpacked (the report's workaround, packed=False)",
        "no packed_seq_params reach the core attention",
        "gemma2",
        ("dataset.enable_offline_packing=false", "dataset.offline_packing_specs=null"),
    ),
    Report(
        "https://github.com/NVIDIA-NeMo/Speech/pull/11290",
        "CUDA graphs over packed sequences need cu_seqlens padded to a constant size",
        "megatron/bridge/training/config.py ConfigContainer.validate raises 'Packed attention CUDA graphs require "
        "offline_packing_specs.pad_cu_seqlens=True'; FullCudaGraphWrapper.data_read keeps the first batch's "
        "shapes",
        "packed",
        (FIXED, "model.cuda_graph_impl=local", "model.cuda_graph_scope=full_iteration"),
        # the captured step also reads the host (non-fused RoPE, the DDP NaN check): cuda_graphs.capture_host_reads
        (
            "cuda_graphs.attention_graphs_need_pad_cu_seqlens",
            "cuda_graphs.capture_host_reads",
            "cuda_graphs.full_iteration_needs_injection",
        ),
    ),
    Report(
        f"{MLM}/pull/3869",
        "CUDA graph capture of attention and MLP over packed (variable-length) sequences is not supported",
        "megatron/core/transformer/transformer_layer.py TransformerLayer._te_cuda_graph_replay (assert)",
        "packed",
        (
            FIXED,
            "dataset.offline_packing_specs.pad_cu_seqlens=true",
            "model.cuda_graph_impl=transformer_engine",
            "model.cuda_graph_modules=[attn,mlp]",
        ),
        ("cuda_graphs.te_attention_over_packed",),
    ),
    Report(
        f"{MB}/issues/2298",
        "gpt-oss (learnable-softmax attention sinks) cannot train with CP > 1: 'No dot product attention backend is "
        "available'",
        "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py attn_forward_func_with_cp "
        "(softmax_type needs cp_comm_type a2a)",
        "packed",
        (*CP2, "dataset.offline_packing_specs.pad_seq_to_mult=4", "model.softmax_type=learnable"),
        ("cp.softmax_type_comm_type",),
    ),
    Report(
        "https://github.com/NVIDIA/TransformerEngine/issues/2541",
        "near-miss: learnable softmax with CP over cp_comm_type a2a (the report's workaround)",
        "AttnFuncWithCPAndQKVOA2A passes softmax_type and softmax_offset",
        "packed",
        (
            *CP2,
            "dataset.offline_packing_specs.pad_seq_to_mult=4",
            "model.softmax_type=learnable",
            "model.cp_comm_type=a2a",
        ),
    ),
    Report(
        f"{MLM}/pull/1160",
        "sliding-window attention with CP at the default cp_comm_type p2p: Transformer Engine refuses it",
        "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py "
        "attn_forward_func_with_cp (assert)",
        "packed",
        SWA_CP2,
        ("cp.sliding_window_comm_type",),
    ),
    Report(
        f"{MLM}/issues/2222",
        "near-miss: sliding-window attention with CP over all_gather (the maintainers' answer)",
        "AttnFuncWithCPAndKVAllGather takes window_size",
        "packed",
        (*SWA_CP2, "model.cp_comm_type=all_gather"),
    ),
    Report(
        "https://github.com/hiyouga/LlamaFactory/pull/10794",
        "all-to-all CP with 2 key/value heads over 4 ranks: the head scatter has empty shards",
        "context_parallel.py AttnFuncWithCPAndQKVOA2A.forward asserts num_heads % cp_size == 0 for Q, K, V",
        "packed",
        (*A2A_CP4, "model.num_query_groups=2"),
        ("cp.a2a_heads_divisible",),
    ),
    Report(
        "https://github.com/hiyouga/LlamaFactory/pull/10794",
        "near-miss: all-to-all CP=4 with 4 key/value heads",
        "one key/value head per CP rank",
        "packed",
        (*A2A_CP4, "model.num_query_groups=4"),
    ),
    Report(
        "https://github.com/areal-project/AReaL/pull/1544",
        "deterministic mode without NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 before the model is built",
        "megatron/core/extensions/transformer_engine.py TEDotProductAttention.__init__ raises RuntimeError",
        "packed",
        (*DETERMINISTIC, "++env_vars={NCCL_ALGO:Ring}"),
        ("determinism.te_attention_env",),
    ),
    Report(
        "https://github.com/areal-project/AReaL/pull/1544",
        "near-miss: deterministic mode with the variable exported through env_vars",
        "runtime_config_update exports env_vars before the model is built",
        "packed",
        (*DETERMINISTIC, "++env_vars={NCCL_ALGO:Ring,NVTE_ALLOW_NONDETERMINISTIC_ALGO:'0'}"),
    ),
)

#: the mechanism classes of issue #32
REPORTS += (
    Report(
        "https://github.com/NVIDIA/TransformerEngine/issues/1303",
        "TP communication overlap over THD packed rows: 'the sequence length has to be constant' (maintainer)",
        "transformer_engine csrc comm_gemm_overlap.cpp copy_into_buffer checks each GEMM input against the "
        "userbuffer Megatron-Bridge sized for seq_length * micro_batch / CP tokens",
        "packed",
        TP2_SP_OVERLAP,
        ("tp_comm_overlap.token_count",),
    ),
    Report(
        "https://github.com/NVIDIA/TransformerEngine/issues/1303",
        "near-miss: the same overlap over fixed-width packed rows ('pad your sequences up to a static maximum')",
        "every micro batch holds seq_length tokens",
        "packed",
        (*TP2_SP_OVERLAP, FIXED),
    ),
    Report(
        f"{MB}/issues/4586",
        "dynamic (hybrid) context parallelism does not work in Megatron-Bridge: its glue lives in Megatron-LM's "
        "training loop",
        "megatron/core/pipeline_parallel/hybrid_cp_schedule.py hybrid_context_parallel_forward_backward reads each "
        "batch as (batch, sample_id_groups): KeyError on Megatron-Bridge's dict",
        "pretrain",
        ("model.hybrid_context_parallel=true",),
        ("cp.hybrid_context_parallel",),
    ),
    Report(
        f"{MB}/issues/4586",
        "near-miss: the same pretraining with plain CP=2",
        "forward_backward_no_pipelining runs its own loop",
        "pretrain",
        ("model.context_parallel_size=2",),
    ),
    Report(
        f"{MLM}/issues/6156",
        "inter-document masking with CP > 1 (unsupported upstream; Megatron-Bridge's step also misreads its "
        f"cu_seqlens at CP 1: {MLM}/pull/5298 added the option)",
        "megatron/bridge/training/gpt_step.py _trim_padded_cu_seqlens_for_cp raises for want of cu_seqlens_argmin; "
        "at CP 1 get_packed_seq_params cuts the cu_seqlens to nothing",
        "pretrain",
        ("dataset.inter_document_masking=true", "model.context_parallel_size=2"),
        ("pretraining.inter_document_masking",),
    ),
    Report(
        f"{MB}/issues/3474",
        "Nemotron-H packed SFT: SSM state bleeds across packed sequences without seq_idx (fixed by "
        f"{MB}/pull/3484 for models that set is_hybrid_model; also NovaSky-AI/SkyRL#2056)",
        "megatron/bridge/training/gpt_step.py passes total_tokens (hence seq_idx) only when is_hybrid_model; "
        "megatron/core/ssm/mamba_mixer.py scans with seq_idx=None",
        "hybrid",
        ("model.is_hybrid_model=false",),
        ("mamba.packing_needs_hybrid",),
    ),
    Report(
        f"{MB}/issues/3474",
        "near-miss: the same hybrid model with is_hybrid_model=True (what the Nemotron-H bridge sets)",
        "PackedSeqParams gets total_tokens and builds seq_idx",
        "hybrid",
        (),
    ),
    Report(
        f"{MB}/pull/4304",
        "Qwen3-Omni with in-batch packing: the registered collate refuses it (review: 'not wired through a "
        "supported Qwen3-Omni data path')",
        "megatron/bridge/models/qwen_omni/data/collate_fn.py qwen3_omni_collate_fn raises 'Qwen3-Omni does not "
        "support in-batch packing'",
        "qwen3omni",
        (),
        ("vlm.collate_refuses_packing",),
    ),
    Report(
        f"{MB}/pull/4304",
        "near-miss: Qwen3-Omni unpacked (what its recipes ship)",
        "the collate pads rows; the step gets no packed batch",
        "qwen3omni",
        ("dataset.enable_in_batch_packing=false",),
    ),
    Report(
        f"{MB}/pull/5239",
        "GPT SFT validation split smaller than the evaluation global batch: 'drop_last=True requires at least one "
        f"full global batch' at the first evaluation (also {MB}/pull/4914)",
        "megatron/bridge/data/samplers.py MegatronPretrainingBatchSampler._active_total_samples (2 packed "
        "validation rows, evaluation global batch 4)",
        "packed",
        ("validation.eval_global_batch_size=4",),
        ("eval.packed_split_rows",),
        world=1,
        val_pack=True,
    ),
    Report(
        f"{MB}/pull/5239",
        "near-miss: the same split read two rows per evaluation batch",
        "one full global batch of rows",
        "packed",
        ("validation.eval_global_batch_size=2",),
        world=1,
        val_pack=True,
    ),
    Report(
        f"{MLM}/issues/1657",
        "DataLoader worker killed above 90K tokens (num-workers 0, 1 TB host): the dataset's S x S attention mask "
        f"(advisory; {MB}/issues/3555: RAM ramp fixed by create_attention_mask=False)",
        "megatron/core/datasets/gpt_dataset.py _get_ltor_masks_and_position_ids torch.tril(torch.ones((S, S)))",
        "pretrain",
        SEQ_96K,
        advisories=("dataset.create_attention_mask",),
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
        f"{MLM}/pull/5243",
        "unfused THD RoPE under CP indexing packed per-token frequencies from sequence 0: Megatron-Core 0.19.2's "
        "rope_utils._apply_rotary_pos_emb_thd already selects each sequence's slice by its cu_seqlens offset",
    ),
    (
        f"{MB}/pull/4598",
        "a near-pack-size document pre-padded past the pack (max_seq_length + 1): Megatron-Bridge 0.6.2's "
        "data/packing/offline.py tokenize_dataset caps the pad target at (max_seq_length // mult) * mult",
    ),
    (
        "https://github.com/alibaba/Pai-Megatron-Patch/issues/717",
        "max() of an empty tensor when a micro batch holds one sequence: Pai's get_batch derives cu_seqlens from "
        "position_ids; Megatron-Bridge reads them from the pack's own boundaries",
    ),
    (
        "https://github.com/KempnerInstitute/KempnerForge/issues/204",
        "document ids dropped under pipeline parallelism: KempnerForge's own stage module; Megatron-Bridge 0.6.2 "
        "gives packed middle stages their cu_seqlens (the Megatron-Bridge#2952 near-miss above)",
    ),
    (
        "https://github.com/NVIDIA/TransformerEngine/issues/2892",
        "FP8 (blockwise/delayed) fused attention with cu_seqlens != cu_seqlens_padded: needs FP8 dot-product "
        "attention over THD, which no Megatron-Bridge 0.6.2 recipe turns on; not traced in TE 2.20 on CPU",
    ),
    (
        f"{MLM}/issues/6108",
        "sequence-level MoE aux loss over variable-length packs counts a pack as one sequence: a loss-semantics "
        "feature request, nothing fails",
    ),
    (
        f"{MLM}/issues/4092",
        "cu_seqlens not broadcast to TP ranks of middle pipeline stages: Megatron-LM's get_batch_on_this_tp_rank; "
        "Megatron-Bridge 0.6.2's gpt_step reads every rank's batch from its own iterator and keeps packed "
        "metadata on middle stages (_middle_pp_stage_needs_batch)",
    ),
    (
        f"{MLM}/issues/620",
        "variable_seq_lengths shapes exchanged outside the pipeline group (hang at TP>1, PP=4): Megatron-Core "
        "0.19.2's P2PCommunicator._communicate_shapes sends on the pipeline group",
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
        "Generated from `tests/support/real_reports.py` (`python scripts/generate.py`); a test builds",
        "every row as a Megatron-Bridge `ConfigContainer` (a base config plus Hydra overrides) and checks the",
        "verdict. Failures must be rejected by exactly the rules named; near-misses must be accepted (no error);",
        "an advisory named in the verdict must be reported too.",
        "",
        "Bases (all valid at world size 8): " + "; ".join(f"`{name}`: {what}" for name, what in BASES.items()) + ".",
        "",
        f"{sum(1 for r in REPORTS if r.expected)} failures, {sum(1 for r in REPORTS if not r.expected)} near-misses, "
        f"from {len({r.url for r in REPORTS})} public reports.",
        "",
        "| report | what | failing code | world | overrides | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for r in REPORTS:
        verdict = ", ".join(f"`{x}`" for x in r.expected) if r.expected else "accepted"
        if r.advisories:
            verdict += " (advisory: " + ", ".join(f"`{x}`" for x in r.advisories) + ")"
        overrides = " ".join(f"`{o}`" for o in r.overrides)
        if r.pack_mult is not None:
            overrides += f" (reading a pack of the embedded data made with `pad_seq_to_mult={r.pack_mult}`)"
        if r.val_pack:
            overrides += " (reading a pack of the embedded training and validation data)"
        lines.append(f"| {r.url} | {r.title} | {r.failing} | {r.world} | {r.base}: {overrides} | {verdict} |")
    lines += ["", "## Reports that do not reproduce in these versions", ""]
    lines += [f"- {url}: {why}." for url, why in NOT_REPRODUCED]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
