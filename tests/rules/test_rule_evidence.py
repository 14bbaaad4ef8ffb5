"""Every error-level rule's boundary is where Megatron's own code fails, shown by running that code on CPU
(or, where it needs a GPU, by citing it in the rule's evidence); documentation-only rules are advisories."""

from __future__ import annotations

import os
from typing import Any

import pytest

from mbridge_seqpack import check
from mbridge_seqpack.errors import ADVISORY, ERROR
from tests.support.validation import mb_validate

pytestmark = pytest.mark.slow


def _ids(cfg: Any, world_size: int, severity: str = ERROR) -> set[str]:
    return {v.rule_id for v in check(cfg, world_size=world_size) if v.severity == severity}


def test_every_rule_states_severity_and_evidence() -> None:
    from mbridge_seqpack.rules import all_rules

    rules = all_rules()
    assert len({r.rule_id for r in rules}) == len(rules)
    for r in rules:
        assert r.severity in (ERROR, ADVISORY), r.rule_id
        assert len(r.evidence) > 40 and ("py" in r.evidence or "Megatron" in r.evidence), r.rule_id
    advisories = {r.rule_id for r in rules if r.severity == ADVISORY}
    assert {
        "mtp.no_packing",
        "model.offline_packing_opt_out",
        "model.in_batch_packing_opt_out",
        "offline.pack_size_matches_seq_length",
        "fixed_width.gpt_sft_experts",
    } <= advisories


@pytest.mark.evidence("offline.micro_batch_one")
@pytest.mark.parametrize("mbs", [1, 2])
def test_offline_micro_batch_boundary_is_megatron_bridges(packed_cfg: Any, mbs: int) -> None:
    packed_cfg.train.micro_batch_size = mbs
    packed_cfg.train.global_batch_size = 16 * mbs
    mb_error = mb_validate(packed_cfg, 8)
    flagged = "offline.micro_batch_one" in _ids(packed_cfg, 8)
    assert flagged == (mbs > 1)
    assert (mb_error is not None and "Micro batch size should be 1" in str(mb_error)) == (mbs > 1)


@pytest.mark.evidence("batch.global_batch_divisible", "batch.global_batch_min")
@pytest.mark.parametrize("gbs", [8, 12, 16, 4])
def test_global_batch_boundary_is_megatron_cores_calculator(packed_cfg: Any, gbs: int) -> None:
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    packed_cfg.train.global_batch_size = gbs
    try:
        ConstantNumMicroBatchesCalculator(gbs, 1, 8, False, 0)  # what setup() runs at world size 8
        failed = False
    except AssertionError:
        failed = True
    assert failed == (gbs in (12, 4))
    assert bool(_ids(packed_cfg, 8) & {"batch.global_batch_divisible", "batch.global_batch_min"}) == failed


def _moe_cfg(megatron_bridge: Any, ep: int, etp: int | None) -> Any:
    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

    cfg = sft_base(small_gpt_provider(4096), seq_length=4096, global_batch_size=16)
    cfg.model.num_moe_experts = 16
    cfg.model.moe_router_topk = 2
    cfg.model.moe_token_dispatcher_type = "alltoall"
    cfg.model.tensor_model_parallel_size = 2
    cfg.model.sequence_parallel = True
    cfg.model.expert_model_parallel_size = ep
    cfg.model.expert_tensor_parallel_size = etp
    cfg.dataset.dataset_kwargs = {"pad_to_max_length": True}
    return cfg


@pytest.mark.evidence("batch.world_size_divisible")
def test_expert_tensor_parallel_defaults_to_one_with_experts(megatron_bridge: Any) -> None:
    """EP=16 on 16 GPUs with TP=2 and expert-TP unset: Megatron-Bridge sets expert-TP to 1, so it fits."""
    import copy

    from megatron.bridge.training.config import runtime_config_update

    from mbridge_seqpack.hook import suspended

    cfg = _moe_cfg(megatron_bridge, ep=16, etp=None)
    assert mb_validate(cfg, 16) is None
    finalized = copy.deepcopy(cfg)
    os.environ["WORLD_SIZE"] = "16"
    try:
        with suspended():
            runtime_config_update(finalized)
    finally:
        os.environ.pop("WORLD_SIZE")
    assert finalized.model.expert_tensor_parallel_size == 1
    assert 16 % (finalized.model.expert_tensor_parallel_size * 16 * 1) == 0  # initialize_model_parallel's test
    assert "batch.world_size_divisible" not in _ids(cfg, 16)
    explicit = _moe_cfg(megatron_bridge, ep=16, etp=2)  # expert-TP 2 x EP 16 = 32 does not divide 16
    [v] = [v for v in check(explicit, world_size=16) if v.rule_id == "batch.world_size_divisible"]
    assert v.fields["model.expert_tensor_parallel_size"] == 2
    assert "16 / 32" in v.rule


@pytest.mark.evidence("mtp.no_packing")
def test_mtp_labels_roll_within_packed_sequences(packed_cfg: Any) -> None:
    """Megatron-Core 0.19.2's roll_tensor keeps each packed sequence's labels inside it: MTP is advisory."""
    import torch
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.multi_token_prediction import roll_tensor

    labels = torch.arange(1, 11).view(1, 10)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    rolled, _ = roll_tensor(labels, shifts=-1, dims=-1, packed_seq_params=params)
    assert rolled[0, :4].tolist() == [2, 3, 4, 0]  # first sequence does not see the second's token 5
    assert rolled[0, 4:].tolist() == [6, 7, 8, 9, 10, 0]
    packed_cfg.model.mtp_num_layers = 1
    found = [v for v in check(packed_cfg, world_size=8) if v.rule_id == "mtp.no_packing"]
    assert [v.severity for v in found] == [ADVISORY]
    assert "mtp.no_packing" not in _ids(packed_cfg, 8)


def _packed_rows(tmp_path: Any, lengths_per_row: list[list[int]], eos: int) -> Any:
    from megatron.bridge.data.packing.parquet import write_packed_parquet

    rows = []
    for lengths in lengths_per_row:
        ids, starts = [], []
        for n in lengths:
            starts.append(len(ids))
            ids += [7] * (n - 1) + [eos]
        rows.append({"input_ids": ids, "loss_mask": [1] * len(ids), "seq_start_id": starts})
    path = tmp_path / "training_64.idx.parquet"
    write_packed_parquet(rows, path)
    return path


@pytest.mark.evidence("offline.row_width_alignment")
@pytest.mark.parametrize("row_mult", [16, 32])
def test_row_width_boundary_is_megatron_bridges_collate(packed_cfg: Any, tmp_path: Any, row_mult: int) -> None:
    """GPT SFT's packed collate makes variable rows ceil(len, pad_seq_length_to_mult) wide; with SP at TP=32
    every width must divide by 32, which only pad_seq_length_to_mult=32 guarantees."""
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.bridge.training.tokenizers.config import TokenizerConfig
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir

    tok = build_tokenizer(
        TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(embedded_tokenizer_dir()))
    )
    path = _packed_rows(tmp_path, [[9, 9], [30, 5], [17]], tok.eos_id)
    dataset = build_gpt_sft_split(
        path,
        tokenizer=tok,
        seq_length=64,
        memmap_workers=1,
        seed=1,
        packed_sequence_size=64,
        pad_seq_to_mult=1,
        dataset_kwargs={"pad_seq_length_to_mult": row_mult},
    )
    widths = [dataset.collate_fn([dataset[i]])["tokens"].shape[1] for i in range(len(dataset))]
    assert widths == ([16, 48, 16] if row_mult == 16 else [32, 64, 32])
    splits_evenly = all(w % 32 == 0 for w in widths)  # _split_along_first_dim's assert at TP=32 with SP

    cfg = packed_cfg
    cfg.model.tensor_model_parallel_size = 32
    cfg.model.sequence_parallel = True
    cfg.model.num_attention_heads = 32
    cfg.dataset.dataset_kwargs = {"pad_seq_length_to_mult": row_mult}
    flagged = "offline.row_width_alignment" in _ids(cfg, 32)
    assert flagged == (not splits_evenly)
    if flagged:
        [v] = [v for v in check(cfg, world_size=32) if v.rule_id == "offline.row_width_alignment"]
        assert v.assignments == {"dataset.dataset_kwargs.pad_seq_length_to_mult": 32}


def test_cp1_needs_no_per_sequence_alignment_even_with_sp(packed_cfg: Any) -> None:
    """Megatron-Bridge's own 405B recipe shape: TP8+SP, CP1, fixed width, pad_seq_to_mult=1 is valid."""
    packed_cfg.model.tensor_model_parallel_size = 8
    packed_cfg.model.num_attention_heads = 16
    packed_cfg.model.num_query_groups = 8
    packed_cfg.model.sequence_parallel = True
    packed_cfg.dataset.dataset_kwargs = {"pad_to_max_length": True}
    packed_cfg.dataset.offline_packing_specs.pad_seq_to_mult = 1
    assert mb_validate(packed_cfg, 8) is None
    assert check(packed_cfg, world_size=8) == []


@pytest.mark.parametrize("mult, flagged", [(1, True), (2, True), (4, False), (8, False)])
def test_cp2_per_sequence_alignment(packed_cfg: Any, mult: int, flagged: bool) -> None:
    packed_cfg.model.context_parallel_size = 2
    packed_cfg.model.calculate_per_token_loss = True
    packed_cfg.ddp.average_in_collective = False
    packed_cfg.dataset.offline_packing_specs.pad_seq_to_mult = mult
    assert mb_validate(packed_cfg, 8) is None  # Megatron-Bridge accepts it either way
    ids = _ids(packed_cfg, 8)
    assert ("offline.alignment_multiple" in ids) == flagged
    if flagged:
        [v] = [v for v in check(packed_cfg, world_size=8) if v.rule_id == "offline.alignment_multiple"]
        assert v.assignments == {"dataset.offline_packing_specs.pad_seq_to_mult": 4}


#: the error rules whose evidence is Megatron-Bridge's ConfigContainer.validate, with a case: the test below is their
#: evidence (named here, so tests/rules/test_coverage.py reads it from the source)
VALIDATE_BACKED = (
    "collate.seq_length_alignment",
    "config.types",
    "cp.seq_length_divisible",
    "cp.finetune_per_token_loss",
    "cp.finetune_average_in_collective",
    "cuda_graphs.pad_cu_seqlens_needs_fixed_width",
    "cuda_graphs.training_graphs_need_fixed_width",
    "cuda_graphs.attention_graphs_need_pad_cu_seqlens",
    "in_batch.micro_batch_gt_one",
    "offline.specs_required",
    "offline.flag_required",
    "offline.micro_batch_one",
    "offline.pack_size_positive",
    "packing.modes_exclusive",
    "seq_length.model_matches_dataset",
)


def _validate_backed_cases() -> list[Any]:
    from mbridge_seqpack.rules import all_rules
    from tests.support.rule_cases import all_cases

    backed = {r.rule_id for r in all_rules() if "ConfigContainer.validate" in r.evidence and r.severity == ERROR}
    return [c for c in all_cases() if c.rule_id in backed]


def test_the_validate_backed_rules_are_the_ones_named() -> None:
    assert [c.rule_id for c in _validate_backed_cases()] == list(VALIDATE_BACKED)


@pytest.mark.evidence(*VALIDATE_BACKED)
@pytest.mark.parametrize("case", _validate_backed_cases(), ids=lambda c: c.rule_id)
def test_validate_backed_rules_fail_exactly_where_megatron_bridge_fails(
    case: Any, request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    """The rule's break makes Megatron-Bridge's own validate() fail; the rule's fix makes it pass."""
    from mbridge_seqpack.config_paths import set_path

    cfg = request.getfixturevalue(case.base)
    world = case.base_world or case.repaired_world or case.world
    assert mb_validate(cfg, world) is None
    case.breaks(cfg, tmp_path)
    assert mb_validate(cfg, case.world) is not None, f"{case.rule_id}: Megatron-Bridge accepts the break"
    found = [v for v in check(cfg, world_size=case.world) if v.rule_id == case.rule_id]
    assert found
    if case.repair is not None:
        case.repair(cfg, tmp_path)
    else:
        for path, value in found[0].assignments.items():
            set_path(cfg, path, value)
    assert mb_validate(cfg, case.repaired_world or case.world) is None


@pytest.mark.evidence("cp.eval_cp_has_no_effect")
def test_eval_cp_is_never_wired_in_megatron_bridge(packed_cfg: Any) -> None:
    """dist.eval_context_parallel_size: nothing in Megatron-Bridge 0.6.2 assigns GlobalState._eval_pgs or enters
    eval_cp_context, so evaluation runs at the training CP; the plugin reports the field as an advisory, and a
    pack aligned for the training CP only is accepted."""
    from pathlib import Path

    import megatron.bridge

    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import ContextParallel

    root = Path(megatron.bridge.__file__).parent
    assigned, entered = [], []
    for path in root.rglob("*.py"):
        text = path.read_text()
        if "_eval_pgs =" in text or "_eval_pgs: " in text:
            assigned.append(path.relative_to(root).as_posix())
        if "eval_cp_context(" in text and path.name != "eval_context_parallel_rebinding.py":
            entered.append(path.relative_to(root).as_posix())
    assert assigned == ["training/state.py"] and entered == []
    from megatron.bridge.training.state import GlobalState

    assert GlobalState()._eval_pgs is None
    apply(packed_cfg, ContextParallel(2))
    packed_cfg.dist.eval_context_parallel_size = 4
    assert mb_validate(packed_cfg, 8) is None
    [v] = check(packed_cfg, world_size=8)
    assert (v.rule_id, v.severity, v.fields, v.assignments) == (
        "cp.eval_cp_has_no_effect",
        ADVISORY,
        {"dist.eval_context_parallel_size": 4, "model.context_parallel_size": 2},
        {"dist.eval_context_parallel_size": None},
    )


@pytest.mark.evidence("fp8.packed_tokens_per_rank")
def test_fp8_gemms_need_the_rank_local_token_multiple(megatron_bridge: Any, packed_cfg: Any) -> None:
    """TE's own shape checks, run on CPU: the FP8 GEMM input check (leading dims % 8; cuBLASLt needs 16 for the
    wgrad GEMM, NovaSky-AI/SkyRL#1828) and MXFP8's 32-token blocks (modelscope/ms-swift#9723: MXFP8 + SP +
    packing). A GPT SFT row 16 tokens wide split over TP=2 under SP leaves 8 tokens per rank."""
    import torch
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    from transformer_engine.pytorch.utils import assert_dim_for_fp8_exec

    weight = torch.empty(64, 64)
    with pytest.raises(ValueError, match="FP8 execution requires the product of all dimensions except the last"):
        assert_dim_for_fp8_exec(torch.empty(4, 1, 64), weight)  # a 16-token row at TP=4 under SP
    assert_dim_for_fp8_exec(torch.empty(16, 1, 64), weight)
    assert not MXFP8Quantizer.is_quantizable(None, torch.empty(16, 64))
    assert MXFP8Quantizer.is_quantizable(None, torch.empty(32, 64))

    packed_cfg.mixed_precision = "bf16_with_fp8_current_scaling_mixed"
    packed_cfg.model.tensor_model_parallel_size = 2
    packed_cfg.model.sequence_parallel = True
    assert _ids(packed_cfg, 8) == {"fp8.packed_tokens_per_rank"}  # 16-wide rows: 8 tokens per rank
    packed_cfg.dataset.dataset_kwargs["pad_seq_length_to_mult"] = 32
    assert _ids(packed_cfg, 8) == set()
    packed_cfg.mixed_precision = "bf16_with_mxfp8_mixed"
    assert _ids(packed_cfg, 8) == {"fp8.packed_tokens_per_rank"}
    packed_cfg.dataset.dataset_kwargs["pad_to_max_length"] = True  # fixed 4096-token rows: 2048 per rank
    assert _ids(packed_cfg, 8) == set()


@pytest.mark.evidence("offline.eval_micro_batch_one")
@pytest.mark.parametrize("eval_mbs", [1, 2])
def test_packed_evaluation_needs_one_row_per_micro_batch(packed_cfg: Any, tmp_path: Any, eval_mbs: int) -> None:
    """Megatron-Bridge's validate() passes validation.eval_micro_batch_size=2 with offline packing; its packed
    collate then stacks two rows and get_packed_seq_params fails at the first evaluation."""
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    from tests.support.mb_batches import mb_packed_collate_batches

    packed_cfg.validation.eval_micro_batch_size = eval_mbs
    packed_cfg.validation.eval_global_batch_size = 16 * eval_mbs
    assert mb_validate(packed_cfg, 8) is None
    [batch], _ = mb_packed_collate_batches(tmp_path, rows=eval_mbs, micro_batch=eval_mbs)
    if eval_mbs == 1:
        get_packed_seq_params(batch)
        assert "offline.eval_micro_batch_one" not in _ids(packed_cfg, 8)
    else:
        with pytest.raises(ValueError, match="max_seqlen_q must contain exactly one value, got shape"):
            get_packed_seq_params(batch)
        assert "offline.eval_micro_batch_one" in _ids(packed_cfg, 8)


@pytest.mark.evidence("gpt_sft.dataset_kwargs_accepted")
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("add_eso", True),  # a typo of add_eos
        ("seed", 7),  # build_gpt_sft_split passes it itself
        ("return_cu_seqlen", True),  # GPTSFTPackedDataset's own keyword
        ("pad_seq_to_mult", 1),  # passed to a packed split by the builder
        ("add_eos", False),
        ("index_mapping_dir", None),  # popped by the builder
        ("chat_template", "{{ messages }}"),  # popped by the packing prep only, on rank 0 (see the next test)
    ],
)
def test_dataset_kwargs_are_refused_where_megatron_bridges_builder_raises(
    request: pytest.FixtureRequest, tiny_pack: Any, key: str, value: Any, packed: bool
) -> None:
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split

    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    pack = tiny_pack / "pack"
    try:
        build_gpt_sft_split(
            pack / "training_64.idx.parquet" if packed else tiny_pack / "training.jsonl",
            tokenizer=load_megatron_tokenizer(embedded_tokenizer_dir()),
            seq_length=64,
            memmap_workers=1,
            seed=1234,
            packed_sequence_size=64 if packed else -1,
            pack_metadata_path=pack / "64_metadata.jsonl",
            dataset_kwargs={key: value},
        )
        raised = None
    except TypeError as exc:
        raised = str(exc)
    cfg = request.getfixturevalue("packed_cfg" if packed else "unpacked_cfg")
    cfg.dataset.dataset_kwargs = {**(cfg.dataset.dataset_kwargs or {}), key: value}
    found = [v for v in check(cfg, world_size=8) if v.rule_id == "gpt_sft.dataset_kwargs_accepted"]
    assert bool(found) == (raised is not None), raised
    expected_error = {
        ("add_eso", False): "unexpected keyword argument 'add_eso'",
        ("add_eso", True): "unexpected keyword argument 'add_eso'",
        ("seed", False): "multiple values for keyword argument 'seed'",
        ("seed", True): "multiple values for keyword argument 'seed'",
        ("return_cu_seqlen", False): "unexpected keyword argument 'return_cu_seqlen'",
        ("pad_seq_to_mult", False): "unexpected keyword argument 'pad_seq_to_mult'",
        ("pad_seq_to_mult", True): "multiple values for keyword argument 'pad_seq_to_mult'",
        ("chat_template", False): "unexpected keyword argument 'chat_template'",
        ("chat_template", True): "unexpected keyword argument 'chat_template'",
    }.get((key, packed))
    assert (raised is None) == (expected_error is None) and (raised is None or expected_error in raised), raised
    if found:
        (violation,) = found
        assert violation.fields == {f"dataset.dataset_kwargs.{key}": value}
        assert violation.fix.startswith(f"remove it: ~dataset.dataset_kwargs.{key}")


def test_the_dataset_kwargs_fix_pastes_into_megatron_bridges_overrides(packed_cfg: Any) -> None:
    from mbridge_seqpack.overrides import apply_overrides

    packed_cfg.dataset.dataset_kwargs = {**packed_cfg.dataset.dataset_kwargs, "add_eso": True}
    (violation,) = [v for v in check(packed_cfg, world_size=8) if v.rule_id == "gpt_sft.dataset_kwargs_accepted"]
    assert violation.rule == (
        "GPTSFTPackedParquetDataset takes no keyword 'add_eso': TypeError when the datasets are built, after the "
        "model is on the GPUs"
    )
    assert violation.fix == (
        "remove it: ~dataset.dataset_kwargs.add_eso (did you mean 'add_eos'? set it with "
        "++dataset.dataset_kwargs.add_eos=...)"
    )
    fixed = apply_overrides(packed_cfg, [violation.fix.split()[2], "++dataset.dataset_kwargs.add_eos=true"])
    assert fixed.dataset.dataset_kwargs["add_eos"] is True and "add_eso" not in fixed.dataset.dataset_kwargs
    assert not [v for v in check(fixed, world_size=8) if v.rule_id == "gpt_sft.dataset_kwargs_accepted"]


@pytest.mark.evidence("gpt_sft.dataset_kwargs_accepted")
def test_only_the_packing_prep_takes_chat_template_out_of_the_builders_dataset_kwargs(
    tiny_pack: Any, packed_cfg: Any
) -> None:
    # GPTSFTDatasetBuilder.build runs prepare_data on rank 0 only, and tokenize_dataset pops chat_template from the
    # builder's own dataset_kwargs: rank 0 then builds its split without it, every other rank (and rank 0 once the
    # pack exists) with it, which the test above shows is a TypeError
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.bridge.data.packing.offline import tokenize_dataset

    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    kwargs = {"chat_template": "{{ messages }}", "add_eos": True}
    tokenize_dataset(
        tiny_pack / "training.jsonl",
        load_megatron_tokenizer(embedded_tokenizer_dir()),
        64,
        1234,
        kwargs,
        dataset_builder=build_gpt_sft_split,
    )
    assert kwargs == {"add_eos": True}
    packed_cfg.dataset.dataset_kwargs = {**packed_cfg.dataset.dataset_kwargs, "chat_template": "{{ messages }}"}
    (violation,) = [v for v in check(packed_cfg, world_size=8) if v.rule_id == "gpt_sft.dataset_kwargs_accepted"]
    assert violation.fix == (
        "remove it: ~dataset.dataset_kwargs.chat_template and give the template to the tokenizer: "
        "tokenizer.chat_template=..."
    )
    from mbridge_seqpack.overrides import apply_overrides

    fixed = apply_overrides(packed_cfg, ["~dataset.dataset_kwargs.chat_template", "tokenizer.chat_template=plain"])
    assert fixed.tokenizer.chat_template == "plain" and "chat_template" not in fixed.dataset.dataset_kwargs
    assert not [v for v in check(fixed, world_size=8) if v.rule_id == "gpt_sft.dataset_kwargs_accepted"]
