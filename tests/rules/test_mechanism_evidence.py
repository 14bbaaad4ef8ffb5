"""The mechanism classes of issue #32, each held to the Megatron-Bridge / Megatron-Core / Transformer Engine code that
decides it, run on CPU where it runs: the rule fires exactly where that code fails (or, for an advisory, where the
setting does not do what it says) and is quiet on the near-miss."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack import check
from mbridge_seqpack.errors import ADVISORY, ERROR

pytestmark = pytest.mark.slow


def _ids(cfg: Any, world: int = 8, severity: str | None = None) -> set[str]:
    return {v.rule_id for v in check(cfg, world_size=world) if severity is None or v.severity == severity}


def _one(cfg: Any, rule_id: str, world: int = 8) -> Any:
    (found,) = [v for v in check(cfg, world_size=world) if v.rule_id == rule_id]
    return found


# ---- pretraining datasets -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt_dataset(tmp_path_factory: pytest.TempPathFactory, megatron_bridge: Any) -> Any:
    """Megatron-Core's (mock) GPTDataset built by Megatron-Bridge's own pretraining provider, 64 tokens a sample."""

    def build(**fields: Any) -> Any:
        from megatron.bridge.data.utils import pretrain_train_valid_test_datasets_provider
        from megatron.bridge.training.config import GPTDatasetConfig
        from megatron.bridge.training.tokenizers.config import TokenizerConfig
        from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

        defaults = {"reset_position_ids": False, "reset_attention_mask": False, "eod_mask_loss": False}
        config = GPTDatasetConfig(
            seq_length=64,
            random_seed=1234,
            tokenizer=build_tokenizer(TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=1000)),
            path_to_cache=str(tmp_path_factory.mktemp("gpt_index")),
            num_dataset_builder_threads=1,
            split="1,1,1",
            **(defaults | fields),
        )
        config.finalize()
        return pretrain_train_valid_test_datasets_provider([4, 0, 0], config)[0]

    return build


@pytest.mark.evidence("pretraining.inter_document_masking")
def test_inter_document_masking_gives_the_step_no_sequence(gpt_dataset: Any, pretrain_cfg: Any) -> None:
    """GPTDataset pads cu_seqlens with seq_length; Megatron-Bridge's get_packed_seq_params cuts them at argmin (the -1
    padding of packed SFT rows), index 0: micro batch 1 leaves attention no sequence, micro batch 2 raises."""
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params
    from torch.utils.data import default_collate

    dataset = gpt_dataset(inter_document_masking=True)
    sample = dataset[0]
    assert sample["cu_seqlens"].shape == (65,) and int(sample["cu_seqlens"][-1]) == 64
    keys = ("cu_seqlens", "max_seqlen")  # what gpt_step._packed_metadata_for_forward hands on for these batches
    one = default_collate([sample])
    params = get_packed_seq_params({k: one[k] for k in keys})
    assert params.cu_seqlens_q.numel() == 0 and params.max_seqlen_q == int(sample["max_seqlen"])
    two = default_collate([dataset[0], dataset[1]])
    with pytest.raises(ValueError, match="max_seqlen must contain exactly one value, got shape"):
        get_packed_seq_params({k: two[k] for k in keys})

    assert _ids(pretrain_cfg) == set()
    pretrain_cfg.dataset.inter_document_masking = True
    for mbs, cp in ((1, 1), (2, 1), (1, 2)):
        pretrain_cfg.train.micro_batch_size, pretrain_cfg.train.global_batch_size = mbs, 16 * mbs
        pretrain_cfg.model.context_parallel_size = cp
        assert _ids(pretrain_cfg, severity=ERROR) == {"pretraining.inter_document_masking"}, (mbs, cp)


@pytest.mark.evidence("pretraining.reset_attention_mask")
def test_reset_attention_mask_never_reaches_the_attention(gpt_dataset: Any, pretrain_cfg: Any) -> None:
    """The dataset builds the per-document mask; Megatron-Bridge's get_batch drops it by default (and TE's causal
    attention would ignore it), so the advisory fires unless a non-TE attention is given the mask."""
    import torch
    from megatron.bridge.models.gpt_provider import local_layer_spec
    from megatron.bridge.training.gpt_step import get_batch_from_iterator
    from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids

    eod = 0
    tokens = torch.tensor([5, 6, eod, 7, 8, 9])
    reset, _, _ = _get_ltor_masks_and_position_ids(tokens, eod, False, True, False, True)
    causal, _, _ = _get_ltor_masks_and_position_ids(tokens, eod, False, False, False, True)
    assert bool(reset[0, 3, 0]) and not bool(causal[0, 3, 0])  # token 7 may not see token 5 (True = masked)
    assert _get_ltor_masks_and_position_ids(tokens, eod, False, True, False, False)[0] is None
    batch = iter([{"attention_mask": reset.unsqueeze(0)}])
    kept = get_batch_from_iterator(batch, skip_getting_attention_mask_from_dataset=True, is_first_pp_stage=False,
                                   is_last_pp_stage=False)  # fmt: skip
    assert kept == {"attention_mask": None}
    assert gpt_dataset(reset_attention_mask=True)[0]["attention_mask"].shape == (1, 64, 64)

    pretrain_cfg.dataset.reset_attention_mask = True
    violation = _one(pretrain_cfg, "pretraining.reset_attention_mask")
    assert violation.severity == ADVISORY and "get_batch drops" in violation.rule
    pretrain_cfg.dataset.skip_getting_attention_mask_from_dataset = False
    assert "Transformer Engine's causal attention" in _one(pretrain_cfg, "pretraining.reset_attention_mask").rule
    pretrain_cfg.model.transformer_layer_spec = local_layer_spec  # Megatron-Core's own attention applies the mask
    assert "pretraining.reset_attention_mask" not in _ids(pretrain_cfg)


@pytest.mark.evidence("pretraining.reset_position_ids")
def test_reset_position_ids_are_read_only_by_learned_and_mrope_positions(pretrain_cfg: Any) -> None:
    import inspect

    import torch
    from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    _, _, positions = _get_ltor_masks_and_position_ids(torch.tensor([5, 0, 7, 8]), 0, True, False, False, False)
    assert positions.tolist() == [0, 1, 0, 1]
    assert "position_ids" not in inspect.signature(RotaryEmbedding.forward).parameters  # rope: 0..S-1 by length
    pretrain_cfg.dataset.reset_position_ids = True
    assert pretrain_cfg.model.position_embedding_type == "rope"
    assert _one(pretrain_cfg, "pretraining.reset_position_ids").severity == ADVISORY
    pretrain_cfg.model.position_embedding_type = "learned_absolute"
    assert "pretraining.reset_position_ids" not in _ids(pretrain_cfg)


@pytest.mark.evidence("dataset.create_attention_mask")
def test_the_dataset_mask_costs_eight_bytes_per_token_pair_while_built(pretrain_cfg: Any) -> None:
    """Megatron-Core's mask build allocates two float32 S x S tensors (ones, tril), then keeps a bool S x S copy;
    measured with torch's CPU profiler. The advisory's estimate is that 8*S^2 per process plus S^2 per dataset."""
    import torch
    from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids
    from torch.profiler import ProfilerActivity, profile

    from mbridge_seqpack.rules.dataset import mask_host_bytes

    seq = 512
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        mask, _, _ = _get_ltor_masks_and_position_ids(torch.zeros(seq, dtype=torch.long), 1, False, False, False, True)
    events = {e.key: e for e in prof.key_averages()}
    # torch.ones((S, S)) (and the S-float loss mask) and torch.tril's S x S result, all float32, alive together
    assert events["aten::ones"].cpu_memory_usage == 4 * seq * seq + 4 * seq
    assert events["aten::tril"].self_cpu_memory_usage == 4 * seq * seq
    assert mask.dtype == torch.bool and mask.shape == (1, seq, seq)

    # NVIDIA-NeMo/Megatron-Bridge#3555: 4096 tokens, a 455-dataset blend, ~32 workers per node -> a RAM ramp to OOM
    assert mask_host_bytes(4096, 4, 455, 8) > 200 * 2**30
    assert mask_host_bytes(4096, 2, 1, 8) < 64 * 2**30  # the shipped 4k/8k recipes stay quiet
    from mbridge_seqpack.rules.dataset import _blend_size

    assert _blend_size(pretrain_cfg.dataset) == 1  # mock data
    pretrain_cfg.dataset.blend_per_split = [(["a", "b", "c"], None), None, None]
    assert _blend_size(pretrain_cfg.dataset) == 3  # one cached mask per training dataset
    pretrain_cfg.dataset.blend_per_split = None
    assert _ids(pretrain_cfg) == set()
    pretrain_cfg.model.seq_length = pretrain_cfg.dataset.seq_length = 32768
    assert _one(pretrain_cfg, "dataset.create_attention_mask").severity == ADVISORY
    pretrain_cfg.dataset.create_attention_mask = False
    assert _ids(pretrain_cfg) == set()


# ---- communication --------------------------------------------------------------------------------------------
@pytest.mark.evidence("cp.hybrid_context_parallel")
def test_hybrid_cp_schedule_unpacks_what_megatron_bridge_yields(pretrain_cfg: Any) -> None:
    """Megatron-Core's hybrid-CP schedule reads each batch as (batch, sample_id_groups); Megatron-Bridge's iterators
    yield dicts: KeyError at the first step (PP=1). The pipelined schedules never read the flag."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel.hybrid_cp_schedule import hybrid_context_parallel_forward_backward

    parallel_state.set_tensor_model_parallel_rank(0)  # the first TP rank reads the data
    try:
        with pytest.raises(KeyError, match="1"):
            hybrid_context_parallel_forward_backward(
                None, iter([{"tokens": torch.zeros(1, 8, dtype=torch.long)}]), None, 1, None, None, [], None,
                False, None, False, None, None, None, None,
            )  # fmt: skip
    finally:
        parallel_state.set_tensor_model_parallel_rank(None)

    pretrain_cfg.model.hybrid_context_parallel = True
    assert _ids(pretrain_cfg, severity=ERROR) == {"cp.hybrid_context_parallel"}
    pretrain_cfg.model.pipeline_model_parallel_size = 2  # DP x CP = 4: ignored, plain CP
    assert "cp.hybrid_context_parallel" not in _ids(pretrain_cfg)
    pretrain_cfg.train.global_batch_size = 12
    assert "cp.hybrid_context_parallel" in _ids(pretrain_cfg, world=6)  # DP x CP = 3: parallel_state asserts


@pytest.mark.evidence("cp.comm_type_known")
@pytest.mark.parametrize(
    ("value", "known"), [("allgather", False), ("A2A", False), ("p2p", True), ("all_gather", True)]
)
def test_cp_comm_types_are_the_ones_transformer_engine_dispatches(packed_cfg: Any, value: str, known: bool) -> None:
    """TE's attn_forward_func_with_cp raises 'Unsupported communication type' past its asserts for any other value;
    the known ones get past the dispatch (and then need a real process group)."""
    import torch
    import torch.distributed as dist
    from transformer_engine.pytorch.attention.dot_product_attention.context_parallel import attn_forward_func_with_cp

    group = dist.ProcessGroup(dist.HashStore(), 0, 1)  # a CP group of one, not a global process group
    q = torch.zeros(2, 8, 2, 4)
    with pytest.raises((ValueError, RuntimeError)) as raised:
        attn_forward_func_with_cp(
            True, q, q, q, None, None, 8, 8, None, None, 0.0, group, [0], None, value,
            qkv_format="bshd", attn_mask_type="causal", attn_bias_type="no_bias", use_fused_attention=True,
        )  # fmt: skip
    assert ("Unsupported communication type" in str(raised.value)) == (not known)

    packed_cfg.model.context_parallel_size = 2
    packed_cfg.model.calculate_per_token_loss = True
    packed_cfg.ddp.average_in_collective = False
    packed_cfg.dataset.offline_packing_specs.pad_seq_to_mult = 4
    packed_cfg.model.cp_comm_type = value
    assert ("cp.comm_type_known" in _ids(packed_cfg)) == (not known)
    packed_cfg.model.cp_comm_type = [value] * packed_cfg.model.num_layers
    if not known:
        assert _one(packed_cfg, "cp.comm_type_known").assignments["model.cp_comm_type"][0] in ("all_gather", "a2a")


@pytest.mark.evidence("tp_comm_overlap.token_count")
def test_tp_overlap_userbuffers_take_one_token_count(packed_cfg: Any, tmp_path: Path) -> None:
    """Megatron-Bridge sizes TE's userbuffers for seq_length * micro_batch / CP tokens (TE then checks each GEMM input
    against that size, a GPU check): its packed collate gives variable-width rows unless pad_to_max_length."""
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split

    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer
    from tests.support.mb_batches import PACK, mb_packed_collate_batches

    _, meta = mb_packed_collate_batches(tmp_path, rows=1)
    widths = {}
    for fixed in (False, True):
        dataset = build_gpt_sft_split(
            tmp_path / f"training_{PACK}.idx.parquet",
            tokenizer=load_megatron_tokenizer(embedded_tokenizer_dir()),
            seq_length=PACK,
            memmap_workers=1,
            seed=1,
            packed_sequence_size=PACK,
            pack_metadata_path=meta,
            pad_seq_to_mult=1,
            dataset_kwargs={"pad_to_max_length": fixed},
        )
        widths[fixed] = {dataset.collate_fn([dataset[i]])["tokens"].shape[1] for i in range(4)}
    assert widths[True] == {PACK} and widths[False] != {PACK}  # the buffer holds PACK tokens at micro batch 1

    packed_cfg.model.tensor_model_parallel_size = 2
    packed_cfg.model.sequence_parallel = True
    packed_cfg.model.tp_comm_overlap = True
    assert _ids(packed_cfg, severity=ERROR) == {"tp_comm_overlap.token_count"}
    packed_cfg.dataset.dataset_kwargs["pad_to_max_length"] = True
    assert _ids(packed_cfg) == set()
    packed_cfg.model.sequence_parallel = False  # Megatron-Bridge turns the overlap off without SP
    packed_cfg.dataset.dataset_kwargs["pad_to_max_length"] = False
    assert "tp_comm_overlap.token_count" not in _ids(packed_cfg)


# ---- model families -------------------------------------------------------------------------------------------
@pytest.mark.evidence("vlm.collate_refuses_packing")
@pytest.mark.parametrize("processor", ["NemotronNanoVLV2Processor", "Qwen3OmniMoeProcessor"])
def test_registered_vlm_collates_refuse_in_batch_packing(processor: str, vlm_cfg: Any) -> None:
    """DirectSFTDataset binds the collate registered for the processor type; both refuse packing at the first batch."""
    from megatron.bridge.data.collators.registry import resolve_model_collate

    from mbridge_seqpack.rules.vlm import _refusing_collate_families

    assert processor in _refusing_collate_families().values()  # both provider modules import here
    examples = [{"conversation": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}] * 2
    with pytest.raises(ValueError, match="does not support in-batch packing"):
        resolve_model_collate(processor)(examples, None, enable_in_batch_packing=True)
    if processor == "Qwen3OmniMoeProcessor":
        from megatron.bridge.models.qwen_omni.qwen3_omni_provider import Qwen3OmniModelProvider

        vlm_cfg.model = Qwen3OmniModelProvider(
            num_layers=2, hidden_size=128, num_attention_heads=4, ffn_hidden_size=256, seq_length=4096
        )
        assert _ids(vlm_cfg, severity=ERROR) == {"vlm.collate_refuses_packing"}
        vlm_cfg.dataset.enable_in_batch_packing = False
        assert "vlm.collate_refuses_packing" not in _ids(vlm_cfg)


@pytest.mark.evidence("mamba.packing_needs_hybrid")
def test_mamba_gets_a_sequence_index_only_with_total_tokens(packed_cfg: Any) -> None:
    """Megatron-Bridge's step adds total_tokens to the packed metadata only for is_hybrid_model; without it
    PackedSeqParams has no seq_idx and the Mamba scan runs across document boundaries."""
    import torch
    from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    metadata = {"cu_seqlens": torch.tensor([[0, 5, 8, -1]]), "max_seqlen": torch.tensor([5])}
    assert get_packed_seq_params(dict(metadata)).seq_idx is None
    indexed = get_packed_seq_params({**metadata, "total_tokens": 8}).seq_idx
    assert indexed.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1]]

    packed_cfg.model = HybridModelProvider(
        hybrid_layer_pattern="M*M-", hidden_size=256, num_attention_heads=4, mamba_num_heads=8, mamba_head_dim=32,
        vocab_size=1024, seq_length=4096,
    )  # fmt: skip
    assert packed_cfg.model.is_hybrid_model is False  # the provider's default
    assert _ids(packed_cfg, severity=ERROR) == {"mamba.packing_needs_hybrid"}
    packed_cfg.model.is_hybrid_model = True
    assert _ids(packed_cfg) == set()
    packed_cfg.model.is_hybrid_model = False
    packed_cfg.model.hybrid_layer_pattern = "*-*-"  # no Mamba layer: nothing carries state
    assert "mamba.packing_needs_hybrid" not in _ids(packed_cfg)


@pytest.mark.evidence("moe.router_counts_padding")
def test_moe_losses_count_padding_without_a_padding_mask() -> None:
    """Megatron-Core's router losses exclude padding only when given padding_mask, which Megatron-Bridge's step never
    passes: the z-loss of a row half padding differs from that of its text."""
    import torch
    from megatron.core.transformer.moe.moe_utils import z_loss_func

    logits = torch.tensor([[1.0, 0.0], [0.0, 1.0], [9.0, 9.0], [9.0, 9.0]])  # two text tokens, two pad tokens
    padding = torch.tensor([False, False, True, True])
    assert z_loss_func(logits, 1.0, padding_mask=padding) == z_loss_func(logits[:2], 1.0)
    assert z_loss_func(logits, 1.0) > 10 * z_loss_func(logits[:2], 1.0)


@pytest.mark.evidence("fp8.packed_tokens_per_rank")
def test_nvfp4_quantizes_sixteen_token_blocks(packed_cfg: Any) -> None:
    import torch
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

    quantizer = NVFP4Quantizer.__new__(NVFP4Quantizer)  # the shape test only; building one needs a GPU
    quantizer.row_scaled_nvfp4 = False
    assert not quantizer.is_quantizable(torch.empty(8, 64)) and quantizer.is_quantizable(torch.empty(16, 64))
    packed_cfg.mixed_precision = "bf16_with_nvfp4_mixed"
    assert _ids(packed_cfg) == set()  # 16-token rows, whole on one rank
    packed_cfg.model.tensor_model_parallel_size = 2
    packed_cfg.model.sequence_parallel = True  # 8 tokens per rank
    assert _ids(packed_cfg, severity=ERROR) == {"fp8.packed_tokens_per_rank"}


# ---- packed splits over a run's life --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def val_pack(tmp_path_factory: pytest.TempPathFactory, megatron_bridge: Any) -> tuple[Path, int]:
    """The embedded corpus packed at 4096 with its validation split, and that split's row count."""
    from mbridge_seqpack.rules.shared import parquet_rows
    from tests.support.packs import small_validation_pack

    out = small_validation_pack(tmp_path_factory.mktemp("val_pack") / "pack")
    return out, parquet_rows([out / "validation_4096.idx.parquet"])


def _point_at(cfg: Any, pack: Path) -> None:
    specs = cfg.dataset.offline_packing_specs
    specs.packed_train_data_path = str(pack / "training_4096.idx.parquet")
    specs.packed_val_data_path = str(pack / "validation_4096.idx.parquet")
    specs.packed_metadata_path = str(pack / "4096_metadata.jsonl")


@pytest.mark.evidence("eval.packed_split_rows")
def test_validation_split_smaller_than_its_global_batch_fails_at_the_first_evaluation(
    packed_cfg: Any, val_pack: tuple[Path, int]
) -> None:
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.bridge.data.loaders import cyclic_iter
    from megatron.bridge.data.samplers import build_pretraining_data_loader

    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    pack, rows = val_pack
    assert 1 < rows < 16
    valid = build_gpt_sft_split(  # as GPTSFTDatasetBuilder._build_datasets builds a packed validation split
        pack / "validation_4096.idx.parquet",
        tokenizer=load_megatron_tokenizer(embedded_tokenizer_dir()),
        seq_length=4096,
        memmap_workers=1,
        seed=1234,
        packed_sequence_size=4096,
        pack_metadata_path=pack / "4096_metadata.jsonl",
        pad_seq_to_mult=1,
        is_test=True,
        dataset_kwargs={},
    )
    assert len(valid) == rows

    def first_eval_batch(gbs: int) -> Any:  # loaders.py: the validation loader, iterated at the first evaluation
        loader = build_pretraining_data_loader(
            valid, 0, "batch", 1, 0, False, collate_fn=valid.collate_fn, data_parallel_size=1, global_batch_size=gbs
        )
        return next(iter(cyclic_iter(loader)))

    with pytest.raises(AssertionError, match="drop_last=True requires at least one full global batch"):
        first_eval_batch(16)
    assert first_eval_batch(rows)["tokens"].shape[0] == rows

    _point_at(packed_cfg, pack)
    violation = _one(packed_cfg, "eval.packed_split_rows", world=1)
    assert violation.fields["validation rows"] == rows
    assert violation.assignments == {"validation.eval_global_batch_size": rows}
    packed_cfg.validation.eval_global_batch_size = rows
    assert _ids(packed_cfg, world=1, severity=ERROR) == set()  # (the pack is balanced for 8 ranks: an advisory)
    packed_cfg.validation.eval_global_batch_size = None  # the training global batch, 16, over 8 DP ranks
    assert _one(packed_cfg, "eval.packed_split_rows").assignments == {"validation.eval_iters": 0}  # < 1 row a rank


@pytest.mark.evidence("resume.repacked_data")
def test_resumed_sampler_continues_at_a_row_count_of_another_pack() -> None:
    """MegatronPretrainingBatchSampler resumes at consumed % rows of the epoch's permutation: over a re-made pack of
    other rows, a resumed epoch repeats rows and skips others."""
    from megatron.bridge.data.samplers import MegatronPretrainingBatchSampler

    def epoch(consumed: int) -> list[int]:
        sampler = MegatronPretrainingBatchSampler(10, consumed, 1, 2, 0, 1, seed=7)
        return [i for batch in sampler for i in batch]

    old_pack = list("abcdefghij")  # what each row holds
    assert sorted(old_pack[i] for i in epoch(0)[:4] + epoch(4)) == old_pack  # resumed over the same pack
    new_pack = old_pack[::-1]  # the same data re-packed: rows hold other documents
    trained = [old_pack[i] for i in epoch(0)[:4]] + [new_pack[i] for i in epoch(4)]
    assert len(set(trained)) < len(old_pack)  # the epoch repeats some rows' data and never shows others


@pytest.mark.evidence("resume.repacked_data")
def test_resuming_over_a_pack_written_after_the_checkpoint_is_reported(
    packed_cfg: Any, val_pack: tuple[Path, int], tmp_path: Path
) -> None:
    """A checkpoint as Megatron-Bridge writes one (train state, its latest copy, run_config.yaml); the pack's files
    newer than it, or other pack settings in its run_config.yaml, give the advisory."""
    from tests.support.checkpoints import write_checkpoint

    pack, _ = val_pack
    _point_at(packed_cfg, pack)
    packed_cfg.validation.eval_iters = 0
    local = write_checkpoint(packed_cfg, tmp_path / "ckpt", step=10, consumed=160)
    newest_pack = max(p.stat().st_mtime for p in pack.glob("*.parquet"))
    os.utime(local, (newest_pack + 60, newest_pack + 60))
    assert "resume.repacked_data" not in _ids(packed_cfg)

    os.utime(local, (newest_pack - 60, newest_pack - 60))  # the pack was written after the checkpoint
    violation = _one(packed_cfg, "resume.repacked_data")
    assert violation.severity == ADVISORY
    assert violation.fields["consumed_train_samples"] == 160
    assert violation.fields["changed since the checkpoint"] == ["the pack was written after the checkpoint"]
    packed_cfg.checkpoint.finetune = True  # weights only: the sample count starts again
    assert "resume.repacked_data" not in _ids(packed_cfg)


# ---- fixes ----------------------------------------------------------------------------------------------------
TP2_SP = ["model.tensor_model_parallel_size=2", "model.sequence_parallel=true"]
CP2 = ["model.context_parallel_size=2", "model.calculate_per_token_loss=true", "ddp.average_in_collective=false"]
FIX_CASES = [
    ("pretrain", ["dataset.inter_document_masking=true", "train.micro_batch_size=2", "train.global_batch_size=32"]),
    ("pretrain", ["dataset.reset_attention_mask=true", "dataset.reset_position_ids=true"]),
    ("pretrain", ["model.seq_length=65536", "dataset.seq_length=65536", "dataset.num_workers=8"]),
    ("pretrain", ["model.hybrid_context_parallel=true"]),
    ("pretrain", [*TP2_SP, "model.tp_comm_overlap=true", "validation.eval_micro_batch_size=2"]),
    ("packed", [*CP2, "dataset.offline_packing_specs.pad_seq_to_mult=4", "model.cp_comm_type=allgather"]),
    ("packed", [*TP2_SP, "model.tp_comm_overlap=true"]),
    ("packed", [*TP2_SP, "mixed_precision=bf16_with_nvfp4_mixed"]),
    ("unpacked", [*TP2_SP, "model.tp_comm_overlap=true"]),
]


@pytest.mark.parametrize(("base", "overrides"), FIX_CASES, ids=[" ".join(o)[:70] for _, o in FIX_CASES])
def test_the_fixes_converge_through_megatron_bridges_overrides(
    request: pytest.FixtureRequest, base: str, overrides: list[str]
) -> None:
    """`check --fix`: one override set, applied by Megatron-Bridge's process_config_with_overrides, clears them."""
    import copy

    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    from mbridge_seqpack.overrides import check_override_syntax, converged_fix

    def apply(extra: list[str]) -> Any:
        cfg = copy.deepcopy(request.getfixturevalue(f"{base}_cfg"))
        return process_config_with_overrides(cfg, cli_overrides=overrides + extra)

    broken = apply([])
    assert check(broken, world_size=8)
    fixes, remaining = converged_fix(broken, lambda c: check(c, world_size=8))
    assert remaining == [] and fixes
    check_override_syntax(fixes)
    assert check(apply(fixes), world_size=8) == []
