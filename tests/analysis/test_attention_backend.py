"""The attention-backend verdict is Transformer Engine's own selection: ``get_attention_backend`` called on the
AttentionParams ``DotProductAttention.forward`` would build, for a declared GPU stack.

Each agreement case pins the params the config must give (written out here, not derived from the code under
test), then asks TE's selection directly, with the three GPU-stack inputs set by monkeypatch, and compares: the
backend TE picks (or none) must be what the check reports. The batches' ``pad_between_seqs`` is checked against
Megatron-Bridge's own collate and ``get_packed_seq_params``; the ``NVTE_*`` variables against Megatron-Core's own
``_set_attention_backend``. A mutant that drops ``pad_between_seqs`` from the params is shown to change verdicts.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch

from mbridge_seqpack import check
from mbridge_seqpack.analysis import attention_backend as ab
from mbridge_seqpack.analysis import te_attention as te
from mbridge_seqpack.rules import RuleContext
from tests.support.attention_cases import (
    AGREEMENTS,
    AUTO_ENV,
    DET_BLACKWELL,
    FA2,
    FA3,
    FP8_DET_BLACKWELL,
    FP8_THD,
    FUSED_ENV,
    FUSED_F16,
    FUSED_FP8,
    LEARNABLE_THD,
    PAD4,
    SM90_THD,
    TE_TEXTS,
    UNFUSED,
    Agreement,
    _all,
    _cp2,
    _fp8,
    _set,
    _verdict,
    agreement_records,
    expected_params,
    te_direct,
)
from tests.support.stderr_text import unwrap

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _no_declared_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (te.ARCH_ENV, te.CUDNN_ENV, te.FLASH_ENV, "NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(ab.NONDETERMINISTIC_ENV, raising=False)


@pytest.mark.evidence("attention.backend_available")
@pytest.mark.parametrize("case", AGREEMENTS, ids=[c.name for c in AGREEMENTS])
def test_verdict_is_te_own_selection(case: Agreement, request: pytest.FixtureRequest) -> None:
    from transformer_engine.pytorch.attention.dot_product_attention.utils import AttentionParams

    cfg = request.getfixturevalue(case.base)
    case.change(cfg)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in case.stack_env.items():
            mp.setenv(name, value)
        verdict = _verdict(cfg, case.arch)
    (kind,) = verdict.kinds
    params = expected_params(**case.params)
    if case.params.get("fp8"):
        params.fp8_meta = kind.params.fp8_meta  # the recipe Megatron-Core's get_fp8_recipe built
        recipes = ("TEDelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling")
        assert type(kind.params.fp8_meta["recipe"]).__name__ in recipes
        assert kind.params.fp8_meta["recipe"].fp8_dpa is True
    assert isinstance(kind.params, AttentionParams)
    assert kind.params == params
    assert {k: v for k, v in verdict.inputs.env if k in ab.BACKEND_ENV or k == ab.NONDETERMINISTIC_ENV} == case.env
    reference = te_direct(params, te.parse_arch(case.arch), case.env, case.flash, case.cudnn, case.rejected_by)
    assert kind.selection.backend == case.backend
    if case.rejected_by:
        reason = f"Disabling FusedAttention: {case.rejected_by}"  # under CP, TE adds the per-step config
        assert any(m == reason or m.startswith(f"{reason} (context-parallel") for m in kind.selection.disabled)
    picked = kind.selection.backend or ""
    assert reference == (picked.startswith("Flash"), picked.startswith("Fused"), picked.startswith("Unfused"))


def test_two_architectures_from_names_env_and_flag(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(te, "visible_gpu_arch", lambda: None)  # as on a CPU machine: NVML sees no GPU
    _fp8("tensorwise")(packed_cfg)
    packed_cfg.model.attention_dropout = 0.0  # Blackwell's FP8 backward (deterministic at head dim 64) takes none
    ctx = RuleContext.build(packed_cfg, 8)
    monkeypatch.setenv(te.CUDNN_ENV, "9.23.0")  # FP8 attention over THD needs cuDNN 9.23 (TE's fixed rules)
    with te.declared(recipe="llama3_70b_sft_64gpu_gb200_fp8cs_config"):
        v = RuleContext.build(packed_cfg, 8).attention_verdict
        assert (v.target.arch, v.target.arch_source) == ((10, 0), "the recipe name says gb200")
        assert v.kinds[0].selection.backend == FUSED_FP8
    assert ctx.attention_verdict.target.arch == (9, 0)  # no GPU declared (no GPU visible: see above)
    assert ctx.attention_verdict.kinds[0].selection.backend is None
    monkeypatch.setenv(te.ARCH_ENV, "b200")
    assert RuleContext.build(packed_cfg, 8).attention_verdict.kinds[0].selection.backend == FUSED_FP8
    with te.declared(gpu_arch="sm90", recipe="x_gb200_config"):  # the flag wins over both
        assert RuleContext.build(packed_cfg, 8).attention_verdict.target.arch_source == "--gpu-arch sm90"
    assert [te.parse_arch(t) for t in ("sm_100", "9.0", "103", "gb300", "H100")] == [
        (10, 0),
        (9, 0),
        (10, 3),
        (10, 3),
        (9, 0),
    ]
    with pytest.raises(ValueError, match="must name a GPU architecture"):
        te.parse_arch("sm9x")


def test_verdicts_do_not_depend_on_the_process_logging_state(megatron_bridge: Any) -> None:
    """A process that has called logging.disable(logging.WARNING) gets every verdict (backend, TE's reasons, the
    rules' findings) the process with logging left alone gets."""
    import json
    import subprocess
    import sys

    script = (
        "import json, logging, warnings; warnings.simplefilter('ignore'); logging.disable(logging.WARNING); "
        "import torch; from tests.support.attention_cases import agreement_records; "
        "print('RECORDS=' + json.dumps(agreement_records()))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTE_")}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=900, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RECORDS="))
    silenced = json.loads(line.removeprefix("RECORDS="))
    here = json.loads(json.dumps(agreement_records()))
    assert [r[0] for r in silenced] == [c.name for c in AGREEMENTS]
    assert silenced == here
    assert all(r[1][0][0] is not None for r in here if r[0] == "thd_sm90")  # a plain pack keeps its backend


def test_backend_is_read_from_the_return_values() -> None:
    """The name the verdict shows is built from get_attention_backend's return values, as its own log line
    spells it (utils.py: 'Selected backend = FusedAttention (sub-backend 1).')."""
    from packaging.version import Version

    assert te.backend_name(True, Version("3.0.0"), False, None, False) == FA3
    assert te.backend_name(False, None, True, 1, True) == FUSED_F16
    assert te.backend_name(False, None, False, None, True) == UNFUSED
    assert te.backend_name(False, None, False, None, False) is None


# ---- TE's fixed FusedAttention rules against the installed binary ---------------------------------------------
def _held(text: str, data: bytes) -> bool:
    """``text`` in the binary as its compiler stores a message: each whole 16-byte piece, and the rest."""
    raw = text.encode()
    whole = len(raw) // 16
    return all(raw[16 * k : 16 * k + 16] in data for k in range(whole)) and raw[16 * whole :] in data


def test_cited_texts_are_the_binary_s() -> None:
    from mbridge_seqpack.analysis import te_fused_rules as fr

    data = fr.so_path().read_bytes()
    assert all(_held(text, data) for text in TE_TEXTS)
    cited = {r.text for r in fr.RULES}
    assert set(TE_TEXTS) <= cited
    assert fr.drift(data) == []


def test_drift_shows_a_planted_change() -> None:
    """The installed binary's bytes, edited: a cited text changed (the sm90 gate made sm100), a new message piece
    in the v2 function's pool, a new cudnn-frontend deterministic-algorithm reject."""
    from mbridge_seqpack.analysis import te_fused_rules as fr

    data = fr.so_path().read_bytes()
    assert data.count(b"s sm90 or later.") == 1
    edited = data.replace(b"s sm90 or later.", b"s sm100 or later")
    assert fr.drift(edited) == [
        f"f16_thd_arch: the binary no longer holds {SM90_THD!r}",
        "nvte_get_fused_attn_backend_v2: a message piece no rule cites: 's sm100 or later'",
    ]
    new_fe = b"Deterministic algorithm is not supported on blackwell architecture with paged KV\x00"
    assert fr.drift(data + new_fe) == [
        "cudnn-frontend: a deterministic-algorithm reject no rule cites: "
        "'Deterministic algorithm is not supported on blackwell architecture with paged KV'"
    ]
    assert "the binary no longer holds" in fr.drift(data.replace(DET_BLACKWELL.encode(), b"x" * len(DET_BLACKWELL)))[0]


@pytest.mark.evidence("attention.backend_available")
def test_each_rule_refuses_as_te_says(packed_cfg: Any) -> None:
    """Each cited text is what TE's selection reports for a config the text describes (its reasons carry it)."""
    cases = [
        (PAD4, "sm80", {}, SM90_THD),
        (_all(PAD4, _set(model__softmax_type="learnable")), "sm90", {}, LEARNABLE_THD),
        (_fp8("delayed"), "sm100", {}, FP8_THD),
    ]
    import copy

    for change, arch, stack, text in cases:
        cfg = copy.deepcopy(packed_cfg)
        change(cfg)
        with pytest.MonkeyPatch.context() as mp:
            for name, value in stack.items():
                mp.setenv(name, value)
            (kind,) = _verdict(cfg, arch).kinds
        assert f"Disabling FusedAttention: {text}" in kind.selection.disabled


# ---- the batch the config produces ------------------------------------------------------------------------------
def _pad_cu_seqlens(cfg: Any, metadata: Any) -> None:
    cfg.dataset.pad_to_max_length = True
    cfg.dataset.offline_packing_specs.pad_cu_seqlens = True
    cfg.dataset.offline_packing_specs.packed_metadata_path = metadata


def test_pad_cu_seqlens_batch_is_what_te_sees(packed_cfg: Any, tmp_path: Any) -> None:
    """With pad_cu_seqlens, Megatron-Bridge's collate pads cu_seqlens to max_samples_per_bin + 2 entries and sets
    max_seqlen from the pack metadata (data/packing/gpt_sft.py): TE is asked about 16 sequences of up to 3000
    tokens. Deterministic, with dropout, padded: on sm90 TE keeps FusedAttention for one sequence per row, and
    none for the real batch (its sm90 deterministic THD backward workspace limit, B*H*S*S >= 2**30)."""
    import json

    metadata = tmp_path / "metadata.jsonl"
    metadata.write_text(
        json.dumps([{"max_samples_per_bin": 15, "dataset_max_seqlen": 3000, "min_packed_seqlen": 3500}])
    )
    deterministic = _set(
        model__deterministic_mode=True, model__cross_entropy_loss_fusion=False,
        env_vars={ab.NONDETERMINISTIC_ENV: "0"},
    )  # fmt: skip
    _all(PAD4, deterministic)(packed_cfg)
    (plain,) = _verdict(packed_cfg, "sm90").kinds
    assert plain.selection.backend == FUSED_F16
    _pad_cu_seqlens(packed_cfg, str(metadata))
    (kind,) = _verdict(packed_cfg, "sm90").kinds
    params = expected_params(
        batch_size=16, max_seqlen_q=3000, max_seqlen_kv=3000, pad_between_seqs=True, deterministic=True
    )
    assert kind.params == params
    env = {**AUTO_ENV, ab.NONDETERMINISTIC_ENV: "0"}
    assert te_direct(params, (9, 0), env) == (False, False, False)
    assert kind.selection.backend is None
    assert (
        "Disabling FusedAttention due to a known cuDNN deterministic F16/BF16 THD backward workspace limitation on "
        "sm90 for large BHSS configurations" in kind.selection.disabled
    )
    _pad_cu_seqlens(packed_cfg, str(tmp_path / "absent.json"))  # not readable here: both ends of the range asked
    verdict = _verdict(packed_cfg, "sm90")
    assert verdict.kinds[0].params.batch_size == 2
    assert verdict.failing == []
    assert verdict.undetermined is not None and "pack metadata not readable here: 4096 samples" in verdict.undetermined
    (found,) = [v for v in check(packed_cfg, world_size=8) if v.rule_id == "attention.backend_available"]
    assert found.severity == "undetermined"


# ---- a verdict that depends on what is not declared -------------------------------------------------------------
def test_no_declared_gpu_asks_each_generation(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting, recipe name or GPU: a plain pack is served on every generation (no finding); deterministic
    with dropout over padded rows is served on sm90 and refused on Blackwell: not determined, naming both."""
    monkeypatch.setattr(te, "visible_gpu_arch", lambda: None)
    monkeypatch.setenv(te.CUDNN_ENV, "9.20.0")
    plain = RuleContext.build(packed_cfg, 8).attention_verdict
    assert [label for label, _ in plain.others] == ["sm100", "sm103"]
    assert plain.undetermined is None and plain.failing == []
    assert [v for v in check(packed_cfg, world_size=8) if v.rule_id.startswith("attention.")] == []
    _all(
        PAD4,
        _set(
            model__deterministic_mode=True, model__cross_entropy_loss_fusion=False,
            env_vars={ab.NONDETERMINISTIC_ENV: "0"},
        ),
    )(packed_cfg)  # fmt: skip
    verdict = RuleContext.build(packed_cfg, 8).attention_verdict
    assert verdict.failing == []
    assert verdict.undetermined == (
        f"{FUSED_F16} on sm90; NO BACKEND (Disabling FusedAttention: {DET_BLACKWELL}) on sm100, sm103"
    )
    (found,) = [v for v in check(packed_cfg, world_size=8) if v.rule_id.startswith("attention.")]
    assert (found.rule_id, found.severity) == ("attention.backend_available", "undetermined")
    assert "the GPU not declared here" in found.not_run
    monkeypatch.setenv(te.ARCH_ENV, "sm100")  # declared: TE's answer there is an error
    assert [
        (v.rule_id, v.severity) for v in check(packed_cfg, world_size=8) if v.rule_id.startswith("attention.")
    ] == [("attention.backend_available", "error")]


def test_check_shows_each_undetermined_mechanism_on_one_line(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same undeclared-GPU config through check's report: the result says NOT DETERMINED (never OK), one line
    names the rule and what could not run, and --json carries the same entry."""
    import json

    from mbridge_seqpack.report import CheckReport, derived_values
    from mbridge_seqpack.rules import evaluate

    monkeypatch.setattr(te, "visible_gpu_arch", lambda: None)
    monkeypatch.setenv(te.CUDNN_ENV, "9.20.0")
    _all(
        PAD4,
        _set(
            model__deterministic_mode=True, model__cross_entropy_loss_fusion=False,
            env_vars={ab.NONDETERMINISTIC_ENV: "0"},
        ),
    )(packed_cfg)  # fmt: skip
    ctx = RuleContext.build(packed_cfg, 8)
    report = CheckReport("cfg", derived_values(ctx), evaluate(ctx), megatron_ran=False)
    [(found, rule)] = [
        (v, r.rule.rule_id) for r in report.results for v in r.violations if v.severity == "undetermined"
    ]
    assert report.undetermined_mechanisms() == [{"rule_id": rule, "not_run": found.not_run}]
    assert rule == "attention.backend_available" and "the GPU not declared here" in found.not_run
    text = report.to_text().splitlines()
    assert text[0] == "result: NOT DETERMINED, no violation found (1 not determined here)"
    at = text.index("not determined here (1):")
    assert " ".join(line.strip() for line in text[at + 1 :]).startswith(f"{rule}: {found.not_run}")
    assert json.loads(report.to_json())["undetermined"] == [{"rule_id": rule, "not_run": found.not_run}]


def test_megatron_bridge_gb200_mxfp8_recipe_is_not_rejected(megatron_bridge: Any) -> None:
    """Megatron-Bridge's own GB200 MXFP8 recipe: its name gives sm100; MXFP8 attention needs cuDNN 9.21 (TE's
    fixed rule), the cuDNN installed here is older and the target's is not declared: not determined, never an
    error; with the target's cuDNN declared new enough, TE keeps FusedAttention."""
    from megatron.bridge.recipes.qwen.gb200.qwen3_moe import qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_functional_config

    from tests.zoo.harness import offline

    name = "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_functional_config"
    with offline():
        cfg = qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_functional_config()
    with te.declared(recipe=name):
        found = [v for v in check(cfg, world_size=8) if v.rule_id == "attention.backend_available"]
        verdict = RuleContext.build(cfg, 8).attention_verdict
    assert verdict.target.arch == (10, 0)
    assert all(v.severity == "undetermined" for v in found)
    with pytest.MonkeyPatch.context() as mp, te.declared(recipe=name):
        mp.setenv(te.CUDNN_ENV, "9.21.0")
        verdict = RuleContext.build(cfg, 8).attention_verdict
        assert [v for v in check(cfg, world_size=8) if v.rule_id == "attention.backend_available"] == []
    assert {k.selection.backend for k in verdict.kinds} <= {FUSED_FP8, FUSED_F16}


def test_declared_stack_is_put_back(packed_cfg: Any) -> None:
    """The selection leaves TE's module state, its logger and the NVTE_* variables as it found them."""
    import logging

    from transformer_engine.pytorch.attention.dot_product_attention import utils as dpa

    before = (
        dpa.get_device_compute_capability,
        dpa.get_cudnn_version,
        dpa._get_fused_attn_backend,
        dpa.FlashAttentionUtils.is_installed,
        dpa.FlashAttentionUtils.v3_is_installed,
        list(logging.getLogger("DotProductAttention").handlers),
        {k: v for k, v in os.environ.items() if k.startswith("NVTE_")},
    )
    packed_cfg.model.softmax_type = "learnable"
    _verdict(packed_cfg, "sm100")
    after = (
        dpa.get_device_compute_capability,
        dpa.get_cudnn_version,
        dpa._get_fused_attn_backend,
        dpa.FlashAttentionUtils.is_installed,
        dpa.FlashAttentionUtils.v3_is_installed,
        list(logging.getLogger("DotProductAttention").handlers),
        {k: v for k, v in os.environ.items() if k.startswith("NVTE_")},
    )
    assert after == before


# ---- inputs taken from Megatron-Bridge's batches and Megatron-Core's own code ---------------------------------
@pytest.mark.parametrize(("pad", "pad_cu_seqlens"), [(1, True), (1, False), (4, True), (4, False)])
def test_pad_between_seqs_is_what_megatron_bridge_batches_carry(
    packed_cfg: Any, tmp_path: Any, pad: int, pad_cu_seqlens: bool
) -> None:
    """Megatron-Bridge's collate and get_packed_seq_params (gpt_step's path): TE infers padding between sequences
    from a cu_seqlens_q_padded that is not cu_seqlens_q itself (dot_product_attention.py forward)."""
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    from tests.support.mb_batches import PACK, mb_packed_collate_batches

    batches, _ = mb_packed_collate_batches(tmp_path, pad_seq_to_mult=pad, pad_cu_seqlens=pad_cu_seqlens, rows=1)
    psp = get_packed_seq_params({k: v for k, v in batches[0].items() if k.startswith(("cu_seqlens", "max_seqlen"))})
    te_infers = psp.cu_seqlens_q_padded is not None and psp.cu_seqlens_q_padded is not psp.cu_seqlens_q
    specs = packed_cfg.dataset.offline_packing_specs
    specs.pad_seq_to_mult, specs.pad_cu_seqlens, specs.packed_sequence_size = pad, pad_cu_seqlens, PACK
    inputs = ab.inputs_of(packed_cfg)
    assert (inputs.thd, inputs.pad_between_seqs, inputs.max_seqlen) == (True, te_infers, PACK)
    assert te_infers is (pad > 1)


@pytest.mark.parametrize(("tp", "sp", "cp", "padded"), [(1, False, 1, False), (2, True, 1, True), (1, False, 2, True)])
def test_in_batch_pad_between_seqs_follows_the_collate_multiple(
    vlm_cfg: Any, tp: int, sp: bool, cp: int, padded: bool
) -> None:
    """In-batch packing (data/packing/in_batch.py) adds cu_seqlens_q_padded when the multiple Megatron-Bridge's
    validate() gives the collate is > 1; run its packer at that multiple."""
    from megatron.bridge.data.packing.in_batch import build_mcore_thd_sequence_batch_from_rows

    vlm_cfg.model.tensor_model_parallel_size, vlm_cfg.model.sequence_parallel = tp, sp
    vlm_cfg.model.context_parallel_size = cp
    multiple = RuleContext.build(vlm_cfg, 8).topology.alignment
    rows = [{"input_ids": torch.arange(n), "position_ids": torch.arange(n)} for n in (5, 7)]
    packed = build_mcore_thd_sequence_batch_from_rows(rows, pad_to_multiple_of=multiple)
    assert ("cu_seqlens_q_padded" in packed) is padded
    assert ab.inputs_of(vlm_cfg).pad_between_seqs is padded


@pytest.mark.evidence("attention.backend_env_conflict")
def test_backend_variables_are_megatron_core_own(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """_set_attention_backend, run on a copy: the enum sets, a string sets nothing, a contradiction asserts."""
    from megatron.core.transformer.enums import AttnBackend

    model = packed_cfg.model
    assert ab.mcore_backend_env(model, {}) == (AUTO_ENV, None)  # run on {}: TE's own NVTE_CUDA_INCLUDE_DIR left out
    model.attention_backend = AttnBackend.fused
    assert ab.mcore_backend_env(model, {}) == (FUSED_ENV, None)
    model.attention_backend = "fused"
    assert ab.mcore_backend_env(model, {"NVTE_FUSED_ATTN": "0"}) == ({"NVTE_FUSED_ATTN": "0"}, None)
    model.attention_backend = AttnBackend.auto
    env, conflict = ab.mcore_backend_env(model, {"NVTE_FUSED_ATTN": "0"})
    assert env == AUTO_ENV
    assert conflict is not None and conflict.startswith(
        "NVTE_FUSED_ATTN set to 0, but expected 1 for attention backend type auto."
    )
    model.flash_attention_version = 3
    assert ab.mcore_backend_env(model, {})[0] == {**AUTO_ENV, "NVTE_FLASH_ATTN_V2": "0", "NVTE_FLASH_ATTN_V4": "0"}
    assert os.environ.get("NVTE_FLASH_ATTN_V2") is None  # only the copy was written


def test_launch_environment_wins_over_env_vars(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """runtime_config_update exports env_vars with os.environ.setdefault: a launch value stays."""
    packed_cfg.env_vars = {"NVTE_FUSED_ATTN": "1", ab.NONDETERMINISTIC_ENV: "0"}
    for name in [k for k in os.environ if k.startswith("NVTE_")]:  # TE's import sets NVTE_CUDA_INCLUDE_DIR
        monkeypatch.delenv(name)
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    assert ab.training_env(packed_cfg) == {"NVTE_FUSED_ATTN": "0", ab.NONDETERMINISTIC_ENV: "0"}
    assert ab.env_value(packed_cfg, "NVTE_FUSED_ATTN") == "0"


def test_window_layers_and_fp8_layers_are_separate_kinds(packed_cfg: Any) -> None:
    """Megatron-Core's is_layer_window_attention picks the windowed layers; first/last BF16 layers run outside FP8."""
    _fp8("tensorwise")(packed_cfg)
    packed_cfg.model.window_size = (256, 0)
    packed_cfg.model.window_attn_skip_freq = 4  # every 4th layer is global
    packed_cfg.model.first_last_layers_bf16 = True
    packed_cfg.model.num_layers_at_start_in_bf16 = 1
    packed_cfg.model.num_layers_at_end_in_bf16 = 1
    verdict = _verdict(packed_cfg, "sm90")
    found = {(k.kind.window, k.kind.fp8): (k.kind.layers, k.selection.backend) for k in verdict.kinds}
    assert found == {
        ((256, 0), False): ((1,), FA2),  # FusedAttention takes windows only without dropout
        ((256, 0), True): ((2, 3, 5, 6, 7, 9, 10, 11), None),
        ((None), True): ((4, 8), None),
        ((None), False): ((12,), FUSED_F16),
    }


# ---- the rules ---------------------------------------------------------------------------------------------------
def _errors(cfg: Any, arch: str = "sm90", world: int = 8) -> list[Any]:
    with te.declared(gpu_arch=arch):
        return [v for v in check(cfg, world_size=world) if v.severity == "error"]


def test_no_backend_is_one_violation_with_te_reasons_and_a_fix(packed_cfg: Any) -> None:
    from megatron.core.transformer.enums import AttnBackend

    packed_cfg.model.attention_backend = AttnBackend.flash
    packed_cfg.dataset.offline_packing_specs.pad_seq_to_mult = 4
    (v,) = _errors(packed_cfg)
    assert v.rule_id == "attention.backend_available"
    assert v.fields == {
        "layers": "all 12 layers",
        "model.attention_backend": "AttnBackend.flash",
        "dataset.offline_packing_specs.pad_seq_to_mult": 4,
        "pad_between_seqs": True,
        "env NVTE_FUSED_ATTN": "0",
        "env NVTE_UNFUSED_ATTN": "0",
        "target": "sm90",
    }
    assert v.rule == (
        "Transformer Engine's get_attention_backend leaves no backend for all 12 layers on sm90 (--gpu-arch sm90), "
        "cuDNN 9.20.0 (installed here), flash-attn 2.7.4.post1 + flash-attn 3.0.0 (assumed as NGC PyTorch ships "
        "them; MBRIDGE_SEQPACK_FLASH_ATTN declares); TE's fixed FusedAttention rules applied "
        "(nvte_get_fused_attn_backend_v2, cudnn-frontend), cuDNN's own support query (needs a GPU) assumed to "
        "accept: Disabling FusedAttention due to NVTE_FUSED_ATTN=0; Disabling "
        "UnfusedDotProductAttention due to NVTE_UNFUSED_ATTN=0; Disabling FlashAttention 2 for qkv_format = thd "
        "when there is padding between sequences, i.e. [a, a, PAD, b, b, b, PAD, c, PAD]; Disabling FlashAttention "
        "3 for dropout. DotProductAttention.forward then raises 'No dot product attention backend is available for "
        "the provided inputs' at the first forward"
    )
    assert v.assignments == {"model.attention_backend": "auto"}
    assert v.overrides == ["model.attention_backend=auto"]
    assert v.fix == "cfg.model.attention_backend = 'auto'"


def test_fixes_converge_through_megatron_bridge_overrides(packed_cfg: Any) -> None:
    """check --fix's loop: the fixes, applied as overrides by Megatron-Bridge's parser, leave no error. A sink
    softmax under CP first needs a2a (cp.softmax_type_comm_type); deterministic, it then still has no backend
    (TE: sink attention requires NVTE_ALLOW_NONDETERMINISTIC_ALGO=1)."""
    from mbridge_seqpack.overrides import converged_fix

    _cp2(packed_cfg)
    packed_cfg.model.softmax_type = "learnable"
    packed_cfg.model.deterministic_mode = True
    packed_cfg.model.cross_entropy_loss_fusion = False
    packed_cfg.env_vars = {ab.NONDETERMINISTIC_ENV: "0"}
    with te.declared(gpu_arch="sm90"), pytest.MonkeyPatch.context() as mp:
        mp.setenv(te.CUDNN_ENV, "9.26.0")  # below it, TE's fixed rule refuses learnable sinks over THD first
        assert [v.rule_id for v in check(packed_cfg, world_size=8)] == ["cp.softmax_type_comm_type"]
        packed_cfg.model.cp_comm_type = "a2a"
        (v,) = check(packed_cfg, world_size=8)
        assert v.rule_id == "attention.backend_available"
        assert "Disabling FusedAttention for determinism reasons with softmax_type = learnable" in v.rule
        packed_cfg.model.cp_comm_type = None
        fixes, remaining = converged_fix(packed_cfg, lambda c: check(c, world_size=8))
    assert fixes == [
        "model.cp_comm_type=a2a",
        "model.deterministic_mode=false",
        f"++env_vars.{ab.NONDETERMINISTIC_ENV}=1",
    ]
    assert remaining == []


def test_the_fix_for_fp8_current_scaling_on_hopper(packed_cfg: Any) -> None:
    _fp8("tensorwise")(packed_cfg)
    (v,) = _errors(packed_cfg, "sm90")
    assert v.fields["fp8 attention"] == "Float8CurrentScaling"
    assert "Disabling FusedAttention for FP8 current scaling on arch < sm100" in v.rule
    assert v.assignments == {"model.fp8_dot_product_attention": False}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(te.CUDNN_ENV, "9.26.0")
        (blackwell,) = _errors(packed_cfg, "sm100")  # its FP8 backward at head dim 64 is deterministic: no dropout
        assert f"Disabling FusedAttention: {FP8_DET_BLACKWELL}" in blackwell.rule
    packed_cfg.model.attention_dropout = 0.0
    assert _errors(packed_cfg, "sm100") == []


def test_the_attention_recipe_switch_makes_fp8_attention_not_determined(packed_cfg: Any) -> None:
    """``NVTE_DPA_FP8_RECIPE=DelayedScaling`` (TE's own advice for FP8 current scaling on Hopper): TE swaps the
    attention's recipe at the first forward, so the config's recipe is not what TE selects for; the verdict is not
    determined (with what was not run), never the config recipe's error."""
    _fp8("tensorwise")(packed_cfg)
    packed_cfg.env_vars = {ab.DPA_FP8_RECIPE_ENV: "DelayedScaling"}
    assert _errors(packed_cfg, "sm90") == []
    with te.declared(gpu_arch="sm90"):
        (v,) = [v for v in check(packed_cfg, world_size=8) if v.rule_id == "attention.backend_available"]
    assert v.severity == "undetermined"
    assert v.fields == {"env NVTE_DPA_FP8_RECIPE": "DelayedScaling", "fp8 attention": "Float8CurrentScaling"}
    assert v.not_run.startswith(
        "NVTE_DPA_FP8_RECIPE=DelayedScaling is set for the launch: Transformer Engine's DotProductAttention."
        "init_fp8_metadata replaces the config's Float8CurrentScaling recipe for attention at the first forward"
    )
    packed_cfg.model.fp8_dot_product_attention = False  # no FP8 attention: the switch changes nothing, TE is asked
    with te.declared(gpu_arch="sm90"):
        assert [v for v in check(packed_cfg, world_size=8) if v.rule_id == "attention.backend_available"] == []


def _attention_state(cfg: Any) -> tuple[str, list[Any]]:
    """``attention.backend_available``'s state in ``check()``'s report, and its findings."""
    from mbridge_seqpack.report.check_report import state_of

    with te.declared(gpu_arch="sm90"):
        report = check(cfg, world_size=8)
    (result,) = [r for r in report.results if r.rule.rule_id == "attention.backend_available"]
    return state_of(result), result.violations


def test_a_stack_without_attention_layers_gets_no_attention_verdict(hybrid_cfg: Any) -> None:
    """A hybrid pattern with no attention symbol (Megatron-Core's own parser counts the layers) runs no TE core
    attention: n/a, not TE's selection for layers that do not exist; with one attention layer, TE is asked."""
    assert _attention_state(hybrid_cfg)[0] == "assumed"  # M*M-: computed, cuDNN's own query assumed off a GPU
    hybrid_cfg.model.hybrid_layer_pattern = "MMM-"
    assert _attention_state(hybrid_cfg) == ("n/a", ())
    verdict = ab.verdict_of(hybrid_cfg)
    assert (verdict.computed, verdict.applies) == (False, False)
    assert verdict.skipped == "no attention layer: the hybrid pattern 'MMM-' has none of *, D, +"


def test_a_selection_that_cannot_run_here_is_not_determined(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Transformer Engine's selection decides the config but cannot be asked (its Python module does not load
    here): not determined, with why, never n/a and never ok."""
    import sys

    assert _attention_state(packed_cfg)[0] == "assumed"
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch.utils", None)  # an import of it raises ImportError
    state, (v,) = _attention_state(packed_cfg)
    assert state == "undetermined"
    assert v.severity == "undetermined"
    assert v.fields == {"model": type(packed_cfg.model).__name__}
    assert v.rule == "Transformer Engine's backend selection for this model's attention is not computed here"
    assert v.fix == "run the attention once on the target GPU (scripts/gpu_check.py) before the full launch"
    assert v.not_run.startswith("Transformer Engine cannot be imported here (import of transformer_engine.pytorch.")


@pytest.mark.evidence("cp.softmax_type_comm_type")
def test_windowed_and_sink_layers_are_left_to_their_cp_rules(packed_cfg: Any) -> None:
    """Whether TE's selection finds a backend for them (the CP code asserts after it) or none, the cp.* rule is
    the one report."""
    _cp2(packed_cfg)
    packed_cfg.model.window_size = (512, 0)
    packed_cfg.model.attention_dropout = 0.0
    assert _verdict(packed_cfg, "sm90").kinds[0].selection.backend == FA3  # then context_parallel.py asserts
    assert [v.rule_id for v in _errors(packed_cfg)] == ["cp.sliding_window_comm_type"]
    assert _verdict(packed_cfg, "sm100").kinds[0].selection.backend is None  # no FA3 there: none at all
    assert [v.rule_id for v in _errors(packed_cfg, "sm100")] == ["cp.sliding_window_comm_type"]
    packed_cfg.model.window_size = None
    packed_cfg.model.softmax_type = "learnable"
    (v,) = _errors(packed_cfg)
    assert v.rule_id == "cp.softmax_type_comm_type"
    assert v.rule.endswith(
        "(TE's selection on sm90: Disabling FlashAttention 2 for qkv_format = thd when there is padding between "
        "sequences, i.e. [a, a, PAD, b, b, b, PAD, c, PAD]; Disabling UnfusedDotProductAttention for "
        "pad_between_seqs = True; Disabling FlashAttention for softmax_type = learnable; Disabling FusedAttention "
        "for context parallelism with softmax_type = learnable and cp_comm_type = p2p)"
    )


def test_nvte_variable_against_the_default_auto_asserts_in_megatron_core(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    (v,) = _errors(packed_cfg)
    assert v.rule_id == "attention.backend_env_conflict"
    assert v.fields == {"model.attention_backend": "AttnBackend.auto", "env NVTE_FUSED_ATTN": "0"}
    assert v.assignments == {"model.attention_backend": "auto"}
    packed_cfg.model.attention_backend = "auto"  # what the override gives: a string; TE then honours the variable
    assert _errors(packed_cfg) == []
    packed_cfg.dataset.offline_packing_specs.pad_seq_to_mult = 4  # padded THD: FlashAttention 2 and unfused out
    packed_cfg.model.attention_dropout = 0.0  # FlashAttention 3 serves on sm90
    assert _errors(packed_cfg) == []
    (v,) = _errors(packed_cfg, "sm100")
    assert v.rule_id == "attention.backend_available"
    assert v.fields["env NVTE_FUSED_ATTN"] == "0"


def test_local_swaps_in_megatron_core_attention_at_provide(packed_cfg: Any) -> None:
    from megatron.core.transformer.enums import AttnBackend

    packed_cfg.model.attention_backend = AttnBackend.local
    (v,) = _errors(packed_cfg)
    assert v.rule_id == "model.core_attention_packing"
    assert v.fields == {
        "core attention": "DotProductAttention (attention_backend=local)",
        "dataset.enable_offline_packing": True,
    }
    assert v.assignments == {"model.attention_backend": "auto"}
    packed_cfg.model.attention_backend = "local"  # a string: the GPT provider compares with the enum
    assert _errors(packed_cfg) == []


def test_check_reports_the_pick_and_the_string_that_sets_nothing(packed_cfg: Any) -> None:
    packed_cfg.model.attention_backend = "fused"
    verdict = _verdict(packed_cfg, "sm90")
    notes = ab.verdict_notes(verdict, packed_cfg.model)
    assert notes[0].startswith(
        "model.attention_backend='fused' is a string (as an override or YAML gives it): Megatron-Core's "
        "_set_attention_backend compares it with the AttnBackend members and sets no NVTE_* variable"
    )
    assert notes[1].startswith("attention: Transformer Engine picks FusedAttention (sub-backend 1) for all 12 layers")
    assert ab.verdict_summary(verdict)["kinds"][0]["backend"] == FUSED_F16


# ---- a mutant of the params must change verdicts -----------------------------------------------------------------
def test_dropping_pad_between_seqs_is_caught(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With pad_between_seqs left out of the params, TE would be asked about unpadded rows and FlashAttention 2
    would seem to serve a flash-pinned padded pack: the agreement case above, run on the mutant, fails."""
    from megatron.core.transformer.enums import AttnBackend

    real = ab.attention_params
    packed_cfg.model.attention_backend = AttnBackend.flash
    packed_cfg.dataset.offline_packing_specs.pad_seq_to_mult = 4
    assert _verdict(packed_cfg, "sm90").kinds[0].selection.backend is None
    monkeypatch.setattr(ab, "attention_params", lambda inputs, kind: _unpadded(real(inputs, kind)))
    mutant = _verdict(packed_cfg, "sm90").kinds[0]
    assert mutant.selection.backend == FA2
    assert mutant.params != expected_params(pad_between_seqs=True)


def _unpadded(params: Any) -> Any:
    params.pad_between_seqs = False
    return params


# ---- cost --------------------------------------------------------------------------------------------------------
def test_selection_runs_once_per_distinct_params(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformer_engine.pytorch.attention.dot_product_attention import utils as dpa

    calls: list[Any] = []
    real = dpa.get_attention_backend
    monkeypatch.setattr(dpa, "get_attention_backend", lambda p: calls.append(p) or real(p))
    packed_cfg.model.attention_dropout = 0.05  # params no earlier test asked about
    _verdict(packed_cfg, "sm90")
    start = time.perf_counter()
    for _ in range(20):
        _verdict(packed_cfg, "sm90")
    per_check = (time.perf_counter() - start) / 20
    from mbridge_seqpack.analysis.cudnn_gates import cudnn_versions_to_ask

    assert len(calls) == len(cudnn_versions_to_ask())  # once per cuDNN interval (the target's is not declared)
    assert per_check < 0.25  # measured ~2 ms on a loaded 2-core machine


# ---- the command line ----------------------------------------------------------------------------------------------
RECIPE = """
from megatron.core.transformer.enums import AttnBackend

from mbridge_seqpack import apply
from mbridge_seqpack.compose.mixins import OfflinePacking
from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider


def flash_padded():
    cfg = apply(sft_base(small_gpt_provider(4096), seq_length=4096, global_batch_size=16), OfflinePacking(4096))
    cfg.model.attention_backend = AttnBackend.flash
    cfg.model.attention_dropout = 0.0
    cfg.dataset.offline_packing_specs.pad_seq_to_mult = 4
    return cfg
"""


def test_check_gpu_arch_flag_and_recipe_name(
    megatron_bridge: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flash-pinned padded pack: FlashAttention 3 serves it on H100; on the GB200 its file name says, nothing."""
    from mbridge_seqpack.cli.main import main

    recipe = tmp_path / "recipe_gb200.py"
    recipe.write_text(RECIPE)
    target = f"{recipe}:flash_padded"
    assert main(["check", target, "--world-size", "8", "--rules-only", "--gpu-arch", "h100"]) == 0
    out = capsys.readouterr().out
    assert (
        "note: attention: Transformer Engine picks FlashAttention (3.0.0) for all 12 layers, on sm90 (--gpu-arch"
        in (" ".join(out.split()))
    )
    assert main(["check", target, "--world-size", "8", "--rules-only"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "FAIL attention.backend_available" in out
    assert "NO BACKEND for all 12 layers, on sm100 (the recipe name says gb200)" in out
    assert main(["check", target, "--world-size", "8", "--json", "--rules-only"]) == 1
    assert '"backend": null' in capsys.readouterr().out
    assert main(["check", target, "--world-size", "8", "--fix"]) == 0
    assert capsys.readouterr().out.strip() == "model.attention_backend=auto"
    with pytest.raises(SystemExit) as exit_info:
        main(["check", target, "--gpu-arch", "sm9x"])
    assert exit_info.value.code == 2
    assert "--gpu-arch must name a GPU architecture" in unwrap(capsys.readouterr().err)


# ---- on a GPU: nothing assumed -------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize(
    "name", ["thd_sm90", "thd_padded_sm90", "cp2_p2p", "cp2_sink_a2a", "deterministic_thd_padded"]
)
def test_on_a_gpu_the_real_cudnn_query_agrees_with_the_assumed_one(name: str, request: pytest.FixtureRequest) -> None:
    """With CUDA up and nothing declared, the selection runs on the device (cuDNN's own query included); declared
    as the same stack on the CPU path, it must give the same backend for these configs."""
    from transformer_engine.pytorch.attention.dot_product_attention.utils import FlashAttentionUtils as fa

    case = next(c for c in AGREEMENTS if c.name == name)
    cfg = request.getfixturevalue(case.base)
    case.change(cfg)
    assert te.visible_gpu_arch() == torch.cuda.get_device_capability()  # NVML, before CUDA is initialized
    torch.cuda.init()
    real = RuleContext.build(cfg, 8).attention_verdict
    assert real.target.on_device
    installed = [str(v) for v, on in ((fa.version, fa.is_installed), (fa.fa3_version, fa.v3_is_installed)) if on]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(te.FLASH_ENV, ",".join(installed) or "none")
        sm = "sm{}{}".format(*torch.cuda.get_device_capability())
        assumed = _verdict(cfg, sm)
    assert not assumed.target.on_device
    assert [k.selection.backend for k in real.kinds] == [k.selection.backend for k in assumed.kinds]
