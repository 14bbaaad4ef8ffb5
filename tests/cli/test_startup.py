"""The command line's start-up: a status line on stderr before the slow import (within a second of start), no
third-party notice that does not concern the user unless --verbose, and Megatron-Bridge's own warnings about the
config still shown."""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import logging
import os
import py_compile
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from mbridge_seqpack.cli import main, startup
from mbridge_seqpack.cli import recipes as recipes_cli

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(sys.executable).with_name("mbridge-seqpack")
MEGATRON_STATUS = "mbridge-seqpack: loading Megatron-Bridge (with torch and Transformer Engine) ..."
#: Megatron-Bridge's validation about the config itself (``_validate_and_sync_distributed_optimizer_settings``):
#: it concerns the user and stays
CONFIG_WARNING = (
    "megatron/bridge/utils/common_utils.py:112: UserWarning: Distributed optimizer settings were not in sync: "
    "ddp.use_distributed_optimizer=False, optimizer.use_distributed_optimizer=True. Automatically enabling "
    "distributed optimizer for both settings."
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MBRIDGE_SEQPACK_MODE"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _first_line(argv: list[str]) -> tuple[str, float]:
    """The first stderr line of the console script and the seconds from start to it (the process is then ended)."""
    start = time.perf_counter()
    process = subprocess.Popen(
        [str(EXE), *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT
    )
    try:
        line = process.stderr.readline()  # type: ignore[union-attr]
        return line.rstrip("\n"), time.perf_counter() - start
    finally:
        process.kill()
        process.wait()


def test_check_says_what_it_loads_within_a_second() -> None:
    """The status line comes before Megatron-Bridge's import, within 1 s of start (best of 3 on a shared machine)."""
    seen = [_first_line(["check", "small_gpt_smoke_4k"]) for _ in range(3)]
    assert all(line == MEGATRON_STATUS for line, _ in seen), seen
    assert min(seconds for _, seconds in seen) < 1.0, seen


@pytest.mark.slow
def test_check_shows_no_third_party_noise_and_keeps_megatron_bridge_config_warnings() -> None:
    """The default recipe's check, as a user runs it: the status line, then only Megatron-Bridge's warning about the
    config (no torch CUDA probe, Apex, Triton, experimental-API, escape-sequence or transformers rename notice)."""
    done = subprocess.run([str(EXE), "check"], capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("result: OK (1 assumed)\n")
    status = startup.status_line("megatron").splitlines()
    lines = done.stderr.splitlines()
    assert lines[: len(status)] == status and all(len(line) <= 100 for line in status)
    assert lines[len(status) :] == [CONFIG_WARNING], done.stderr[-3000:]


def test_help_imports_nothing_slow() -> None:
    code = (
        "import sys\nfrom mbridge_seqpack.cli import main\ntry:\n    main(['check', '--help'])\n"
        "except SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('megatron', 'torch', 'transformers', 'ray', "
        "'hydra', 'numpy')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert done.stdout.splitlines()[-1] == "[]", done.stderr[-2000:]
    assert done.stderr == ""


def _emit_known_noise() -> None:
    """The known notices, emitted as their libraries emit them (module names and loggers included)."""
    warnings.warn_explicit(
        "Apex is not installed. Falling back to Torch Norm", UserWarning, "backends.py", 34, "megatron.core.models"
    )
    warnings.warn_explicit(
        "Triton is not supported on current platform, roll back to CPU.", UserWarning, "utils.py", 420, "fla.utils"
    )
    warnings.warn_explicit(
        "invalid escape sequence '\\-'",
        SyntaxWarning,
        "/x/site-packages/megatron/core/inference/contexts/kv_block_allocator.py",
        426,
    )
    logging.getLogger("torch.utils.cpp_extension").warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/x")
    logging.getLogger("transformers.configuration_utils").warning("`torch_dtype` is deprecated! Use `dtype` instead!")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("verbose", [False, True])
def test_known_noise_is_filtered_unless_verbose(verbose: bool, capsys: pytest.CaptureFixture[str]) -> None:
    records = _Records()
    loggers = [logging.getLogger(n) for n in ("torch.utils.cpp_extension", "transformers.configuration_utils")]
    propagated = [logger.propagate for logger in loggers]
    for logger in loggers:
        # records only: the handler torch's logging gives the "torch" logger writes to the stderr of whichever test
        # imported torch first (pytest's capture, closed since), so what reaches it depends on the test order
        logger.addHandler(records)
        logger.propagate = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.resetwarnings()
            warnings.simplefilter("ignore", DeprecationWarning)  # Python's default outside __main__
            with startup.command_line(verbose=verbose, stream=io.StringIO()):
                _emit_known_noise()
                warnings.warn_explicit(  # Megatron-Bridge about the config: shown either way
                    "Distributed optimizer settings were not in sync: ddp.use_distributed_optimizer=False",
                    UserWarning,
                    "/x/site-packages/megatron/bridge/utils/common_utils.py",
                    112,
                    "megatron.bridge.utils.common_utils",
                )
                warnings.warn_explicit(  # a deprecation of a config key: shown either way
                    "SFT preprocessing through dataset_kwargs is deprecated",
                    DeprecationWarning,
                    "/x/site-packages/megatron/bridge/data/builders/gpt_sft.py",
                    224,
                    "megatron.bridge.data.builders.gpt_sft",
                )
                warnings.warn_explicit("torch.jit.script is deprecated", DeprecationWarning, "_script.py", 1, "torch")
    finally:
        for logger, propagate in zip(loggers, propagated):
            logger.removeHandler(records)
            logger.propagate = propagate
    err = capsys.readouterr().err
    if verbose:  # everything, as Python shows it
        assert records.messages == [
            "No CUDA runtime is found, using CUDA_HOME='/x'",
            "`torch_dtype` is deprecated! Use `dtype` instead!",
        ]
        assert [str(w.message).split(".")[0] for w in caught] == [
            "Apex is not installed",
            "Triton is not supported on current platform, roll back to CPU",
            "invalid escape sequence '\\-'",
            "Distributed optimizer settings were not in sync: ddp",
            "SFT preprocessing through dataset_kwargs is deprecated",
            "torch",
        ]
        assert err == ""
    else:  # what concerns the config alone, one line each
        assert records.messages == [] and caught == []
        assert err == (
            "megatron/bridge/utils/common_utils.py:112: UserWarning: Distributed optimizer settings were not in sync: "
            "ddp.use_distributed_optimizer=False\n"
            "megatron/bridge/data/builders/gpt_sft.py:224: DeprecationWarning: SFT preprocessing through "
            "dataset_kwargs is deprecated\n"
        )
    assert not any(isinstance(f, startup._DropKnown) for f in logging.getLogger("torch.utils.cpp_extension").filters)


def test_status_line_once_per_slow_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("startup_fake_slow", "startup_fake_other"):
        (tmp_path / f"{name}.py").write_text("import startup_fake_other\n" if name == "startup_fake_slow" else "")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(startup.SLOW_IMPORTS, "startup_fake_slow", "the fake; this takes a while")
    monkeypatch.setitem(startup.SLOW_IMPORTS, "startup_fake_other", "the other; this takes a while")
    monkeypatch.setitem(startup._BROUGHT_ALONG, "startup_fake_slow", ("startup_fake_other",))
    stream = io.StringIO()
    finders = list(sys.meta_path)
    try:
        with startup.command_line(stream=stream):
            importlib.import_module("startup_fake_slow")  # brings the other along: one line
            importlib.import_module("startup_fake_slow")
    finally:
        for name in ("startup_fake_slow", "startup_fake_other"):
            sys.modules.pop(name, None)
    assert stream.getvalue() == "mbridge-seqpack: loading the fake; this takes a while ...\n"
    assert sys.meta_path == finders


def test_status_line_says_why_without_cached_bytecode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    source = tmp_path / "startup_fake_ns" / "bridge" / "__init__.py"
    source.parent.mkdir(parents=True)
    source.write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    state = lambda: startup.bytecode_state("startup_fake_ns")  # noqa: E731
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert state() == "unset"
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert state() == "first"
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert state() == "read-only"
    py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))
    assert state() == "cached"
    assert startup.bytecode_state("startup_no_such_package") == "cached"  # nothing to say


def test_ctrl_c_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(recipes_cli, "recipe_listing", interrupted)
    assert main(["recipes"]) == 130
    assert capsys.readouterr().err == "mbridge-seqpack: interrupted\n"


def test_the_status_line_quotes_the_recorded_measurement_not_a_promise() -> None:
    """Issue #53: the seconds the status line says are those scripts/bench_startup.py recorded for a bare import
    (docs/bench/bench_startup.json), rounded, and said as measured; no range that no run produced."""
    record = json.loads((ROOT / "docs" / "bench" / "bench_startup.json").read_text())["median"]
    assert startup.MEASURED_IMPORT_S == {
        "cached": round(record["import megatron.bridge, bytecode cached"]["wall_s"]),
        "uncached": round(record["import megatron.bridge"]["wall_s"]),
    }
    assert startup.SLOW_IMPORTS["megatron"] == (
        "Megatron-Bridge (with torch and Transformer Engine); measured 20 s on an idle 2-core machine, longer "
        "under load"
    )
    assert all("measured 44 s on an idle 2-core machine" in text for text in startup._UNCACHED.values())
