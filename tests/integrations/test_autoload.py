"""Zero-code activation: with MBRIDGE_SEQPACK_MODE set, the wheel's .pth startup hook installs the rules in a
training script that never imports the plugin; unset, it costs nothing (the plugin is not even imported)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).resolve().parents[1] / "scripts" / "recipe_runner.py"


def _start(
    site_dir: Path,
    *overrides: str,
    mode: str | None,
    script: Path | None = RUNNER,
    world_size: str | None = "8",
    env_extra: dict[str, str] | None = None,
) -> subprocess.Popen:
    """A fresh interpreter whose site-packages holds the .pth (site.addsitedir processes it as at start-up), started
    and not waited for: each imports Megatron-Bridge (~40 s), so a test starts its runs together."""
    run = (
        "import runpy, sys; sys.argv = ['runner', *sys.argv[1:]]; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    loaded = "import sys; print(sorted(m for m in sys.modules if m.startswith('mbridge')))"
    code = f"import site; site.addsitedir({str(site_dir)!r}); " + (run if script else loaded)
    env = {k: v for k, v in os.environ.items() if k not in ("MBRIDGE_SEQPACK_MODE", "WORLD_SIZE")}
    env["PYTHONPATH"] = str(ROOT)
    if world_size is not None:
        env["WORLD_SIZE"] = world_size
    if mode is not None:
        env["MBRIDGE_SEQPACK_MODE"] = mode
    env.update(env_extra or {})
    command = [sys.executable, "-c", code, *overrides]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=900)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _run(site_dir: Path, *overrides: str, **kwargs: Any) -> subprocess.CompletedProcess:
    return _finish(_start(site_dir, *overrides, **kwargs))


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("site")
    shutil.copy(ROOT / "mbridge_seqpack_autoload.pth", where)
    return where


@pytest.mark.slow
def test_variable_set_rejects_a_bad_override_without_any_plugin_import(site_dir: Path) -> None:
    assert "import mbridge_seqpack" not in RUNNER.read_text() and "from mbridge_seqpack" not in RUNNER.read_text()
    started = _start(site_dir, "model.context_parallel_size=2", mode="error")
    good = _start(
        site_dir,
        "model.context_parallel_size=2",
        "model.calculate_per_token_loss=true",
        "dataset.offline_packing_specs.pad_seq_to_mult=4",
        mode="error",
    )
    done, good = _finish(started), _finish(good)
    assert done.returncode == 1
    assert (
        "mbridge_seqpack.errors.PackingConfigError: mbridge_seqpack: 2 packing/long-context config violations"
        in done.stderr
    )
    assert "[cp.finetune_per_token_loss]" in done.stderr and "[offline.alignment_multiple]" in done.stderr
    assert good.returncode == 0 and "accepted\ndata_read injected: True" in good.stdout, good.stderr[-2000:]


@pytest.mark.slow
def test_variable_unset_or_off_changes_nothing(site_dir: Path) -> None:
    started = _start(site_dir, "model.context_parallel_size=2", "model.calculate_per_token_loss=true", mode=None)
    assert _run(site_dir, mode=None, script=None).stdout.strip() == "[]"  # not even imported
    assert _run(site_dir, mode="off", script=None).stdout.strip() == "[]"
    done = _finish(started)
    assert done.returncode == 0 and "accepted\ndata_read injected: False" in done.stdout  # Megatron-Bridge alone


FULL_ITERATION_PACKED = (
    "model.cuda_graph_impl=full_iteration",
    "rerun_state_machine.check_for_nan_in_loss=false",
    # a capture-safe step (cuda_graphs.capture_host_reads): fused RoPE, no DDP NaN check of the grad buckets
    "model.apply_rope_fusion=true",
    "ddp.check_for_nan_in_grad=false",
    "dataset.dataset_kwargs.pad_to_max_length=true",
    "dataset.offline_packing_specs.pad_cu_seqlens=true",
)


@pytest.mark.slow
def test_full_iteration_graphs_over_packs_get_the_injection_without_code(site_dir: Path) -> None:
    """Megatron-Bridge alone accepts a full-iteration graph over its packed rows, whose capture then reads
    max_seqlen back from the device; with the variable set, the same runner-shaped script (no plugin import)
    gets FullCudaGraphWrapper.data_read wrapped so the step receives a host max_seqlen."""
    alone, plugged = (
        _start(site_dir, *FULL_ITERATION_PACKED, mode=None),
        _start(site_dir, *FULL_ITERATION_PACKED, mode="error"),
    )
    alone, plugged = _finish(alone), _finish(plugged)
    assert alone.returncode == 0 and "accepted\ndata_read injected: False" in alone.stdout, alone.stderr[-2000:]
    assert plugged.returncode == 0 and "accepted\ndata_read injected: True" in plugged.stdout, plugged.stderr[-2000:]


def test_a_bad_value_warns_and_never_breaks_startup(site_dir: Path) -> None:
    done = _run(site_dir, mode="loud", script=None)
    assert done.returncode == 0
    assert "MBRIDGE_SEQPACK_MODE must be error, warn, off or strict; got 'loud' - not activated" in done.stderr


@pytest.mark.slow
def test_a_dry_run_checks_the_config_it_writes(site_dir: Path, tmp_path: Path) -> None:
    """run_recipe.py --dry-run writes the config's YAML and never calls runtime_config_update(): with the variable
    set the rules run at to_yaml(), against the smallest world the layout fits (no WORLD_SIZE on a login node)."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "dry_run.py"
    fixed = ("model.calculate_per_token_loss=true", "dataset.offline_packing_specs.pad_seq_to_mult=4")
    runs = {
        "bad": (("model.context_parallel_size=2",), "error"),
        "good": (("model.context_parallel_size=2", *fixed), "error"),
        "unset": (("model.context_parallel_size=2",), None),
    }
    yaml = {name: tmp_path / f"{name}.yaml" for name in runs}
    started = {
        name: _start(
            site_dir,
            *overrides,
            mode=mode,
            script=script,
            world_size=None,
            env_extra={"DRY_RUN_YAML": str(yaml[name])},
        )
        for name, (overrides, mode) in runs.items()
    }
    bad, good, unset = (_finish(started[name]) for name in runs)
    assert bad.returncode == 1 and not yaml["bad"].exists()
    assert "[cp.finetune_per_token_loss]" in bad.stderr and "[offline.alignment_multiple]" in bad.stderr
    assert good.returncode == 0 and good.stdout.strip().endswith("written"), good.stderr[-2000:]
    assert "context_parallel_size: 2" in yaml["good"].read_text()
    assert unset.returncode == 0 and yaml["unset"].exists()  # Megatron-Bridge's dry run alone writes it
