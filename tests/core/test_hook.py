"""The config-finalize hook inside ConfigContainer.validate(), driven through runtime_config_update()."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest

import mbridge_seqpack
from mbridge_seqpack import PackingConfigError
from mbridge_seqpack.hook import MODE_ENV, PackingConfigWarning


@pytest.fixture(autouse=True)
def _clean_hook(megatron_bridge, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(MODE_ENV, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "8")
    mbridge_seqpack.uninstall()
    yield
    mbridge_seqpack.uninstall()


def _runtime_update(cfg: Any) -> None:
    from megatron.bridge.training.config import runtime_config_update

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Could not determine rank")
        warnings.filterwarnings("ignore", message="Distributed optimizer settings were not in sync")
        runtime_config_update(cfg)


def _misaligned(cfg: Any) -> Any:
    """CP=2 with per-token loss but pad_seq_to_mult=1: Megatron-Bridge 0.6.2 accepts it, THD drops tokens."""
    cfg.model.context_parallel_size = 2
    cfg.model.calculate_per_token_loss = True
    cfg.ddp.average_in_collective = False
    return cfg


def test_unhooked_megatron_bridge_accepts_the_misaligned_pack(packed_cfg: Any) -> None:
    _runtime_update(_misaligned(packed_cfg))  # the gap the plugin closes


def test_hook_fires_through_runtime_config_update(packed_cfg: Any) -> None:
    mbridge_seqpack.install()
    with pytest.raises(PackingConfigError) as info:
        _runtime_update(_misaligned(packed_cfg))
    assert info.value.rule_ids == ["offline.alignment_multiple"]
    assert isinstance(info.value, ValueError)
    assert str(info.value) == (
        "mbridge_seqpack: 1 packing/long-context config violation:\n"
        "  [offline.alignment_multiple] dataset.offline_packing_specs.pad_seq_to_mult=1,\n"
        "      model.context_parallel_size=2\n"
        "    rule: THD context parallelism splits every packed sequence into 2*CP chunks, so each sequence\n"
        "          must be padded to a multiple of 4; otherwise the split rounds lengths down and drops\n"
        "          tokens\n"
        "    fix:  cfg.dataset.offline_packing_specs.pad_seq_to_mult = 4\n"
        "    override: dataset.offline_packing_specs.pad_seq_to_mult=4"
    )


def test_megatron_bridge_checks_still_run_after_ours(packed_cfg: Any) -> None:
    """One failure of Megatron-Bridge's own and none of the plugin's: its validate() raises it, as written."""
    mbridge_seqpack.install()
    packed_cfg.train.num_epochs = 1
    with pytest.raises(AssertionError, match="Cannot specify more than one of train_iters, train_samples") as info:
        _runtime_update(packed_cfg)
    assert not isinstance(info.value, PackingConfigError)


def test_valid_config_passes_both(packed_cfg: Any) -> None:
    mbridge_seqpack.install()
    _runtime_update(packed_cfg)
    assert packed_cfg.data_parallel_size == 8


def test_uninstall_restores_the_original_method_exactly(megatron_bridge: Any) -> None:
    cls = megatron_bridge.ConfigContainer
    original = cls.__dict__["validate"]
    mbridge_seqpack.install()
    assert cls.__dict__["validate"] is not original
    assert mbridge_seqpack.is_installed()
    mbridge_seqpack.uninstall()
    assert cls.__dict__["validate"] is original
    assert not mbridge_seqpack.is_installed()
    mbridge_seqpack.uninstall()  # second uninstall is a no-op
    assert cls.__dict__["validate"] is original


def test_uninstall_restores_set_data_parallel_size_too(megatron_bridge: Any) -> None:
    cls = megatron_bridge.ConfigContainer
    original = cls.__dict__["set_data_parallel_size"]
    with mbridge_seqpack.install():
        assert cls.__dict__["set_data_parallel_size"] is not original
    assert cls.__dict__["set_data_parallel_size"] is original


@pytest.mark.parametrize(
    ("world", "breaks", "bare", "rule_id"),
    [
        # runtime_config_update -> set_data_parallel_size -> get_data_parallel_size asserts divisibility
        ("6", {"model.tensor_model_parallel_size": 4}, AssertionError, "batch.world_size_divisible"),
        # ... and divides by the model-parallel product
        ("8", {"model.context_parallel_size": 0}, ZeroDivisionError, "config.types"),
    ],
)
def test_the_plugins_report_comes_before_megatron_bridges_pre_validation(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch, world: str, breaks: dict, bare: type, rule_id: str
) -> None:
    """Issue #20: runtime_config_update() computes the data-parallel size before validate(); a world size not
    divisible by TP*PP*CP, or CP=0, used to surface as Megatron's bare exception instead of the plugin's report."""
    import copy

    from mbridge_seqpack.config_paths import set_path

    monkeypatch.setenv("WORLD_SIZE", world)
    for path, value in breaks.items():
        set_path(packed_cfg, path, value)
    with pytest.raises(bare):
        _runtime_update(copy.deepcopy(packed_cfg))  # Megatron-Bridge alone
    mbridge_seqpack.install()
    with pytest.raises(PackingConfigError) as info:
        _runtime_update(packed_cfg)
    assert rule_id in info.value.rule_ids


def test_rules_run_once_per_runtime_config_update(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """set_data_parallel_size() and validate() share one evaluation while the config is unchanged; a config
    changed in between is checked again."""
    import mbridge_seqpack.report as report

    calls = []
    real = report.check
    monkeypatch.setattr(report, "check", lambda cfg, world_size=None: calls.append(1) or real(cfg, world_size))
    mbridge_seqpack.install(mode="warn")
    with pytest.warns(PackingConfigWarning) as record:
        _runtime_update(_misaligned(packed_cfg))
    assert len(calls) == 1 and len([w for w in record if w.category is PackingConfigWarning]) == 1
    packed_cfg.set_data_parallel_size()
    packed_cfg.model.context_parallel_size = 1  # changed after: validate() must not reuse the old verdict
    packed_cfg.validate()
    assert len(calls) == 3


def test_installing_twice_is_harmless(megatron_bridge: Any, packed_cfg: Any) -> None:
    cls = megatron_bridge.ConfigContainer
    original = cls.__dict__["validate"]
    mbridge_seqpack.install(mode="warn")
    wrapper = cls.__dict__["validate"]
    mbridge_seqpack.install(mode="warn")
    assert cls.__dict__["validate"] is wrapper
    with pytest.warns(PackingConfigWarning) as record:
        _runtime_update(_misaligned(packed_cfg))
    ours = [w for w in record if issubclass(w.category, PackingConfigWarning)]
    assert len(ours) == 1  # rules ran once, not once per install
    mbridge_seqpack.uninstall()
    assert cls.__dict__["validate"] is original


def test_warn_mode_warns_and_continues(packed_cfg: Any) -> None:
    mbridge_seqpack.install(mode="warn")
    with pytest.warns(PackingConfigWarning, match=r"\[offline.alignment_multiple\]"):
        _runtime_update(_misaligned(packed_cfg))
    assert packed_cfg.data_parallel_size == 4  # Megatron-Bridge's validation completed


def test_off_mode_and_environment_override(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    mbridge_seqpack.install(mode="off")
    _runtime_update(_misaligned(packed_cfg))
    monkeypatch.setenv(MODE_ENV, "error")
    with pytest.raises(PackingConfigError):
        packed_cfg.validate()
    monkeypatch.setenv(MODE_ENV, "off")
    mbridge_seqpack.install(mode="error")
    packed_cfg.validate()  # the environment wins over the argument


def test_bad_modes_are_rejected(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"^mode must be one of error, warn, off; got 'loud'. Fix: mode='error'$"):
        mbridge_seqpack.install(mode="loud")
    assert not mbridge_seqpack.is_installed()
    mbridge_seqpack.install()
    monkeypatch.setenv(MODE_ENV, "silent")
    expected = r"^MBRIDGE_SEQPACK_MODE must be one of error, warn, off, strict; got 'silent'"
    with pytest.raises(ValueError, match=expected):
        packed_cfg.validate()


def test_context_manager_restores_previous_state(megatron_bridge: Any, packed_cfg: Any) -> None:
    cls = megatron_bridge.ConfigContainer
    original = cls.__dict__["validate"]
    with mbridge_seqpack.install():
        with pytest.raises(PackingConfigError):
            _runtime_update(_misaligned(packed_cfg))
    assert cls.__dict__["validate"] is original
    mbridge_seqpack.install(mode="warn")
    with mbridge_seqpack.install(mode="error"):
        from mbridge_seqpack.hook import current_mode

        assert current_mode() == "error"
    assert current_mode() == "warn"


def test_hook_world_size_argument(packed_cfg: Any) -> None:
    mbridge_seqpack.install(world_size=32)  # DP 32 > global batch 16
    with pytest.raises(PackingConfigError) as info:
        packed_cfg.validate()
    assert info.value.rule_ids == ["batch.global_batch_min"]


def test_issue_example_is_rejected_with_every_fix(megatron_bridge: Any) -> None:
    """WORLD_SIZE=8, Llama-3-8B packed SFT: pack 4096 vs seq 8192, CP2, TP2+SP, pad_seq_to_mult=1."""
    from mbridge_seqpack.recipes import build_recipe

    cfg = build_recipe("llama3_8b_sft_packed_8k")
    cfg.dataset.offline_packing_specs.packed_sequence_size = 4096
    cfg.dataset.offline_packing_specs.pad_seq_to_mult = 1
    cfg.model.context_parallel_size = 2
    cfg.model.tensor_model_parallel_size = 2
    cfg.model.sequence_parallel = True
    mbridge_seqpack.install()
    with pytest.raises(PackingConfigError) as info:
        _runtime_update(cfg)
    assert info.value.rule_ids == ["cp.finetune_per_token_loss", "offline.alignment_multiple"]
    mbridge_seqpack.install(strict=True)  # advisories raise too: the short pack wastes half the window
    with pytest.raises(PackingConfigError) as info:
        _runtime_update(cfg)
    by_id = {v.rule_id: v for v in info.value.violations}
    assert list(by_id) == [
        "cp.finetune_per_token_loss",
        "offline.pack_size_matches_seq_length",
        "offline.alignment_multiple",
    ]
    assert by_id["offline.pack_size_matches_seq_length"].severity == "advisory"
    assert by_id["offline.pack_size_matches_seq_length"].assignments == {
        "dataset.offline_packing_specs.packed_sequence_size": 8192,
        "dataset.seq_length": 8192,
    }
    assert by_id["offline.alignment_multiple"].assignments == {"dataset.offline_packing_specs.pad_seq_to_mult": 4}
    assert by_id["cp.finetune_per_token_loss"].assignments == {"model.calculate_per_token_loss": True}
    message = str(info.value)
    assert message.startswith("mbridge_seqpack: 3 packing/long-context config violations:\n")
    assert "[offline.pack_size_matches_seq_length (advisory)]" in message
    flat = " ".join(message.split())  # wrapped at 100 columns
    for v in info.value.violations:
        assert v.fix in flat
    for v in info.value.violations:
        for path, value in v.assignments.items():
            from mbridge_seqpack.config_paths import set_path

            set_path(cfg, path, value)
    _runtime_update(cfg)  # every fix applied: both validations pass, strict included


def test_advisories_warn_in_error_mode(packed_cfg: Any) -> None:
    packed_cfg.model.mtp_num_layers = 1
    mbridge_seqpack.install()
    with pytest.warns(PackingConfigWarning, match=r"\[mtp.no_packing \(advisory\)\]"):
        _runtime_update(packed_cfg)
    mbridge_seqpack.install(strict=True)
    with pytest.raises(PackingConfigError) as info:
        _runtime_update(packed_cfg)
    assert info.value.rule_ids == ["mtp.no_packing"]


def test_warnings_only_on_rank_zero(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    mbridge_seqpack.install(mode="warn")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _runtime_update(_misaligned(packed_cfg))
    assert not [w for w in record if issubclass(w.category, PackingConfigWarning)]


def test_suspended_runs_megatron_alone_then_restores(packed_cfg: Any) -> None:
    from mbridge_seqpack.hook import current_mode, suspended

    mbridge_seqpack.install(mode="warn", world_size=8)
    with suspended():
        assert not mbridge_seqpack.is_installed()
        _runtime_update(_misaligned(packed_cfg))  # no plugin warning: only Megatron-Bridge validates
    assert mbridge_seqpack.is_installed() and current_mode() == "warn"


def _undetermined_attention(cfg: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A deterministic padded-THD config on an undeclared GPU: TE's backend verdict needs cuDNN's device query, so
    ``attention.backend_available`` is not determined here (and the hook accepts it unless strict)."""
    from mbridge_seqpack.analysis import attention_backend as ab
    from mbridge_seqpack.analysis import te_attention as te

    monkeypatch.setattr(te, "visible_gpu_arch", lambda: None)
    monkeypatch.setenv(te.CUDNN_ENV, "9.20.0")
    monkeypatch.setenv("NCCL_ALGO", "Ring")  # Megatron-Bridge's deterministic mode asserts it
    cfg.dataset.offline_packing_specs.pad_seq_to_mult = 4
    cfg.model.deterministic_mode = True
    cfg.model.cross_entropy_loss_fusion = False
    cfg.env_vars = {ab.NONDETERMINISTIC_ENV: "0"}
    return cfg


def test_the_hook_logs_once_per_process_what_it_accepted_as_not_determined(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A warnings filter can hide the per-validate warning; the log says it once per process, with what was not
    run, and strict mode refuses the same verdict."""
    import copy

    from mbridge_seqpack import hook

    monkeypatch.setattr(hook, "_accepted_undetermined", set())
    cfg = _undetermined_attention(packed_cfg, monkeypatch)
    second = copy.deepcopy(cfg)
    mbridge_seqpack.install()
    with caplog.at_level("WARNING", logger="mbridge_seqpack"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the process's filters hide the warnings: the log line is still written
        _runtime_update(cfg)
        _runtime_update(second)  # a second config with the same verdict: said already
    [record] = [r for r in caplog.records if r.name == "mbridge_seqpack"]
    found = [v for v in mbridge_seqpack.check(second, world_size=8) if v.severity == "undetermined"]
    assert [v.rule_id for v in found] == ["attention.backend_available"]
    assert record.getMessage() == (
        "mbridge_seqpack accepted 1 verdict not determined here (MBRIDGE_SEQPACK_MODE=strict refuses them):\n"
        f"  attention.backend_available: {found[0].not_run}"
    )
    mbridge_seqpack.install(strict=True)
    with pytest.raises(PackingConfigError) as info:
        _runtime_update(copy.deepcopy(second))
    assert info.value.rule_ids == ["attention.backend_available"]


def test_other_ranks_log_nothing(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    from mbridge_seqpack import hook

    monkeypatch.setattr(hook, "_accepted_undetermined", set())
    monkeypatch.setenv("RANK", "3")
    mbridge_seqpack.install()
    with caplog.at_level("WARNING", logger="mbridge_seqpack"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _runtime_update(_undetermined_attention(packed_cfg, monkeypatch))
    assert [r for r in caplog.records if r.name == "mbridge_seqpack"] == []


def test_suspended_and_the_context_manager_restore_the_world_size(packed_cfg: Any) -> None:
    """What the hook was installed with comes back whole: DP 32 > global batch 16 is refused again after each."""
    from mbridge_seqpack.hook import suspended

    mbridge_seqpack.install(world_size=32)
    with suspended():
        _runtime_update(copy.deepcopy(packed_cfg))  # Megatron-Bridge alone: it does not know the world size
    with mbridge_seqpack.install(world_size=8):
        _runtime_update(copy.deepcopy(packed_cfg))
    with pytest.raises(PackingConfigError) as info:
        _runtime_update(copy.deepcopy(packed_cfg))
    assert info.value.rule_ids == ["batch.global_batch_min"]


# ---- Megatron-Bridge's own checks in the one error (issue #50 item 2) --------------------------------------------
def _megatron_refusal(cfg: Any) -> str | None:
    """What Megatron-Bridge's runtime_config_update (its validate()), unhooked, raises on a copy of ``cfg``."""
    try:
        _runtime_update(copy.deepcopy(cfg))
    except (AssertionError, ValueError) as exc:
        return str(exc)
    return None


def _three_refusals(cfg: Any) -> None:
    """Three checks of Megatron-Bridge's validate() that fail apart: num_epochs beside train_iters, Megatron-FSDP
    beside torch FSDP2, and Megatron-FSDP without its checkpoint format."""
    cfg.train.num_epochs = 1
    cfg.dist.use_megatron_fsdp = True
    cfg.dist.use_torch_fsdp2 = True


def test_every_megatron_bridge_refusal_is_in_the_one_error(packed_cfg: Any) -> None:
    """Megatron-Bridge's validate() stops at its first failure; inside the hook each of them is listed, with
    Megatron-Bridge's own text. The reference: what its validate() raises first as each earlier one is put right."""
    _three_refusals(packed_cfg)
    expected = [_megatron_refusal(packed_cfg)]
    fixed = copy.deepcopy(packed_cfg)
    fixed.train.num_epochs = None
    expected.append(_megatron_refusal(fixed))
    fixed.dist.use_torch_fsdp2 = False
    expected.append(_megatron_refusal(fixed))
    assert expected == [
        "Cannot specify more than one of train_iters, train_samples, or num_epochs",
        "use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive.",
        "Megatron-FSDP requires the fsdp_dtensor checkpointing format!",
    ]
    mbridge_seqpack.install()
    with pytest.raises(PackingConfigError) as info:
        _runtime_update(packed_cfg)
    assert info.value.rule_ids == ["megatron-bridge.validate"] * 3
    assert [v.rule for v in info.value.violations] == [
        f"Megatron-Bridge's own validate() refuses the config: {text}" for text in expected
    ]
    assert [v.fields["raised"] for v in info.value.violations] == ["AssertionError", "ValueError", "AssertionError"]
    assert info.value.violations[1].fields["at"].startswith("megatron/bridge/training/config.py:")


def test_the_plugins_findings_and_megatron_bridges_come_together(packed_cfg: Any) -> None:
    """A plugin error and failures of Megatron-Bridge's own: one error with all (before, the plugin raised alone and
    Megatron-Bridge's failures came one at a time after the plugin's was fixed). The plugin raises at
    set_data_parallel_size(), before validate(): Megatron-Bridge's checks are collected there."""
    _misaligned(packed_cfg)
    packed_cfg.dist.use_megatron_fsdp = True
    packed_cfg.dist.use_torch_fsdp2 = True
    mbridge_seqpack.install()
    with pytest.raises(PackingConfigError) as info:
        _runtime_update(packed_cfg)
    assert info.value.rule_ids == [
        "offline.alignment_multiple",
        "megatron-bridge.validate",
        "megatron-bridge.validate",
    ]
    assert [v.rule.split(": ", 1)[1] for v in info.value.violations[1:]] == [
        "use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive.",
        "Megatron-FSDP requires the fsdp_dtensor checkpointing format!",
    ]


def test_megatron_bridge_checks_run_on_a_copy_with_the_plugins_fixes(packed_cfg: Any) -> None:
    """What the plugin's own fix removes is not listed twice, and the config and the environment are untouched."""
    import os

    from mbridge_seqpack.errors import Violation
    from mbridge_seqpack.hook import megatron_violations

    _three_refusals(packed_cfg)
    before, environ = copy.deepcopy(packed_cfg), dict(os.environ)
    mbridge_seqpack.install()
    assert len(megatron_violations(packed_cfg, [])) == 3
    assert repr(packed_cfg) == repr(before) and dict(os.environ) == environ
    fix = Violation({"train.num_epochs": 1}, "stand-in", assignments={"train.num_epochs": None})
    quoted = Violation({}, "stand-in quoting 'use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive.'")
    (left,) = megatron_violations(packed_cfg, [fix, quoted])
    assert left.rule.endswith("Megatron-FSDP requires the fsdp_dtensor checkpointing format!")


def test_megatron_bridges_checks_take_the_plugins_world_size(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``install(world_size=8)`` in a process of one rank: Megatron-Bridge's checks are run for the 8 ranks the
    plugin checks for (its data-parallel size from WORLD_SIZE), not for the checking process's one."""
    monkeypatch.delenv("WORLD_SIZE")
    _misaligned(packed_cfg)  # CP 2: a world of 1 is not divisible by TP x PP x CP
    with mbridge_seqpack.install(world_size=8), pytest.raises(PackingConfigError) as info:
        packed_cfg.validate()
    assert info.value.rule_ids == ["offline.alignment_multiple"]
