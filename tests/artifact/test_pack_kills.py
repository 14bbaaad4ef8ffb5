"""#35: ``pack`` killed with SIGKILL at each of its phases, locally and on a Ray cluster: afterwards nothing that
``check`` or Megatron-Bridge's dataset builder accepts is there (no pack where the builder looks, or the previous
pack, intact, when replacing one), and running the same ``pack`` again succeeds and leaves nothing behind but the
lock file, which is harmless (its ``flock`` died with the killed process; the re-run took it).

How a phase is hit: ``MBRIDGE_SEQPACK_STOP_AT=<phase>`` makes the pack stop itself (``SIGSTOP``) where the phase
begins (artifact/pack_phases.py), the test checks what the staging directory holds at that moment, then sends
``SIGKILL``. Tokenizing on one machine is hit by polling the staging directory every millisecond until the
spilled tokens grow. Local packs run in children of a fork server that imported Megatron-Bridge once; Ray packs
run their driver in an actor of this module's cluster, whose workers import Megatron-Bridge once for all runs."""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.artifact.inspect_artifact import inspect_artifact
from mbridge_seqpack.artifact.pack_phases import STOP_ENV
from mbridge_seqpack.recipes.building_blocks import embedded_data_dir
from tests.support.fork_server import fork_context, pack_child

pytestmark = pytest.mark.slow

DATA = embedded_data_dir()
RECIPE = "small_gpt_smoke_4k"


def _root(tmp_path: Path, records: int = 1799) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    lines = (DATA / "training.jsonl").read_text().splitlines()[:records]
    (root / "training.jsonl").write_text("".join(line + "\n" for line in lines))
    return root


def _location(root: Path) -> tuple[Any, Any]:
    """(Megatron-Bridge's builder for the recipe at ``root``, the config)."""
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetBuilder
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    from mbridge_seqpack.recipes.targets import build_launch

    # a training-only root: the launch must not prepare a validation split into the sealed folder
    cfg = build_launch(RECIPE, [f"dataset.dataset_root={root}", "dataset.do_validation=false"]).cfg
    return GPTSFTDatasetBuilder(config=cfg.dataset, tokenizer=build_tokenizer(cfg.tokenizer)), cfg


def _argv(root: Path, *extra: str) -> list[str]:
    return ["pack", "--recipe", RECIPE, f"dataset.dataset_root={root}", "--workers", "1", *extra]


def _staging(root: Path) -> list[Path]:
    return [p for p in (root / "packed").glob(".*") if ".staging-" in p.name or ".old-" in p.name]


def _nothing_accepted(root: Path, previous: bytes | None) -> None:
    """No pack where the builder looks (or the previous one, byte for byte), none the rule or inspect accepts."""
    from megatron.bridge.data.packing.paths import resolve_packed_parquet_paths

    from mbridge_seqpack.artifact.pack_files import content_plan
    from mbridge_seqpack.artifact.store import ArtifactError
    from mbridge_seqpack.report import check

    builder, cfg = _location(root)
    target = Path(builder.train_path_packed)
    if previous is None:
        assert not builder._packed_path_exists(target)  # its prep would make its own, not read a partial one
        assert not list(target.parent.iterdir())  # (the builder's default_pack_path makes the folder, empty)
        with pytest.raises(ArtifactError):
            inspect_artifact(target.parent)
        with pytest.raises(ValueError):  # nothing under packed/ is a Parquet file it would read (staging is hidden)
            resolve_packed_parquet_paths(str(root / "packed"))
        assert content_plan(cfg).packs == []
    else:
        assert target.read_bytes() == previous
        assert inspect_artifact(target.parent).ok
    assert [v for v in check(cfg, world_size=1) if v.rule_id == "artifact.fingerprint_mismatch"] == []


def _rerun_succeeds(root: Path, run: Any, argv: list[str] | None = None) -> None:
    assert run(argv or _argv(root, "--overwrite")) == 0
    builder, _ = _location(root)
    directory = Path(builder.train_path_packed).parent
    assert inspect_artifact(directory).ok
    assert _staging(root) == []  # the dead run's staging / old directories were removed under the lock
    locks = [p.name for p in (root / "packed").glob(".*.lock")]
    assert locks == [f".{directory.name}.lock"]
    with open(root / "packed" / locks[0], "w") as handle:  # harmless: nobody holds it
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


# --- on this machine ----------------------------------------------------------------------------------------


def _local_run(argv: list[str]) -> int:
    process = fork_context().Process(target=pack_child, args=(argv, None))
    process.start()
    process.join(300)
    return process.exitcode


def _state(pid: int) -> str:
    """The process's state letter (``T``: stopped); ``X`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "X"


@pytest.fixture
def reaped() -> Any:
    """The processes a test starts, killed and joined when it ends, passed or not: a stopped pack left alive by a
    failing assertion would otherwise keep pytest waiting for it at exit."""
    started: list[Any] = []
    yield started
    for process in started:
        if process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
        process.join(30)


def _stopped_at(root: Path, phase: str, argv: list[str], reaped: list[Any]) -> Any:
    """A pack stopped where ``phase`` begins (polled for ``tokenizing``), and the staging it left; the process is
    in ``reaped`` from the moment it starts."""
    process = fork_context().Process(target=pack_child, args=(argv, None if phase == "tokenizing" else phase))
    process.start()
    reaped.append(process)
    deadline = time.time() + 300
    if phase == "tokenizing":
        while time.time() < deadline:
            spills = [p for s in _staging(root) for p in s.glob(".tokens-training/*") if p.is_file()]
            if any(p.stat().st_size for p in spills):
                break
            assert process.is_alive(), "the pack ended before it was seen tokenizing"
            time.sleep(0.001)
        os.kill(process.pid, signal.SIGSTOP)
    while _state(process.pid) not in ("T", "t"):
        assert time.time() < deadline and process.is_alive(), f"the pack did not reach {phase}"
        time.sleep(0.005)
    return process


#: phase -> what the staging directory holds when the pack is there (files named relative to it)
LOCAL_PHASES = {
    "staging": lambda s: [p.name for p in s.iterdir()] == [],
    "tokenizing": lambda s: (s / ".tokens-training").is_dir() and not list(s.glob("*.parquet")),
    "writing": lambda s: (s / "training_4096.idx.parquet").is_file() and not list(s.glob("*_metadata.jsonl")),
    "sealing": lambda s: (s / "training_4096.idx.parquet").is_file() and not list(s.glob("*_metadata.jsonl")),
    "renaming": lambda s: (s / "4096_metadata.jsonl").is_file(),
}


@pytest.mark.parametrize("phase", list(LOCAL_PHASES))
def test_a_local_pack_killed_at_each_phase(tmp_path: Path, megatron_bridge: Any, phase: str, reaped: list) -> None:
    # the whole corpus only where the test must catch the pack mid-tokenizing (it polls); the other phases stop
    # themselves, and a smaller input reaches them sooner
    root = _root(tmp_path, 1799 if phase == "tokenizing" else 300)
    process = _stopped_at(root, phase, _argv(root), reaped)
    (staging,) = _staging(root)
    assert LOCAL_PHASES[phase](staging), sorted(p.name for p in staging.iterdir())
    os.kill(process.pid, signal.SIGKILL)
    process.join(30)
    assert process.exitcode == -signal.SIGKILL
    _nothing_accepted(root, previous=None)
    _rerun_succeeds(root, _local_run)


@pytest.mark.parametrize("phase", ["writing", "renaming", "swapping"])
def test_a_pack_replacing_another_killed_leaves_the_old_one_or_the_new_one(
    tmp_path: Path, megatron_bridge: Any, phase: str, reaped: list
) -> None:
    """--overwrite over a sealed pack: killed before the swap the old pack is there, intact; killed after the
    (atomic) swap the new one is, complete; never neither, never a mix."""
    root = _root(tmp_path, 300)
    assert _local_run(_argv(root)) == 0
    builder, cfg = _location(root)
    target = Path(builder.train_path_packed)
    old = target.read_bytes()
    process = _stopped_at(root, phase, _argv(root, "--overwrite", "--no-balance"), reaped)  # other rows than the old
    os.kill(process.pid, signal.SIGKILL)
    process.join(30)
    if phase == "swapping":
        assert target.read_bytes() != old and inspect_artifact(target.parent).ok  # the new pack, complete
    else:
        _nothing_accepted(root, previous=old)
    _rerun_succeeds(root, _local_run)


# --- on a Ray cluster ---------------------------------------------------------------------------------------


class _PackDriver:
    """The pack's driver, in an actor of this module's job (its workers are this job's: they import
    Megatron-Bridge once for every pack of the module)."""

    def pid(self) -> int:
        return os.getpid()

    def run(self, argv: list[str], phase: str | None) -> int:
        from mbridge_seqpack.cli.main import main

        if phase:
            os.environ[STOP_ENV] = phase
        else:
            os.environ.pop(STOP_ENV, None)
        return main(argv)


RAY_PHASES = {
    "staging": lambda s: [p.name for p in s.iterdir()] == [],
    "tokenizing": lambda s: (s / ".tokens-training").is_dir() and not list(s.glob("*.parquet")),
    "writing": lambda s: (s / ".parts-training").is_dir() and not list(s.glob("*_metadata.jsonl")),
    "sealing": lambda s: (s / "training_4096.idx.parquet").is_file() and not list(s.glob("*_metadata.jsonl")),
    "renaming": lambda s: (s / "4096_metadata.jsonl").is_file(),
}


def test_a_ray_pack_killed_at_each_phase(ray_cluster: Any, tmp_path: Path, megatron_bridge: Any) -> None:
    """The driver killed at each phase in turn (workers' tasks in flight at tokenizing and writing): after each
    kill nothing is accepted; each next run starts by removing the dead run's staging directory under the lock
    (after tasks the dead driver owned may have outlived it) and gets to its own phase; the last run, not killed,
    succeeds. The driver packs INPUT into the recipe's builder location (a recipe would make the actor import
    Megatron-Bridge; a --ray driver does not)."""
    ray = ray_cluster  # the session's (tests/conftest.py)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the driver actor's class, by value
    driver_class = ray.remote(num_cpus=0)(_PackDriver)
    root = _root(tmp_path, 600)
    builder, _ = _location(root)
    argv = ["pack", str(root / "training.jsonl"), "--pack-size", "4096", "--output",
            str(Path(builder.train_path_packed).parent), "--ray", "auto", "--ray-shard-mb", "0.005"]  # fmt: skip
    for phase, holds in RAY_PHASES.items():
        driver = driver_class.remote()
        pid = ray.get(driver.pid.remote())
        pending = driver.run.remote(argv, phase)
        deadline = time.time() + 600
        while _state(pid) != "T":
            assert time.time() < deadline, f"the driver never reached {phase}"
            ready, _ = ray.wait([pending], timeout=0.01)
            assert not ready, f"the pack ended before {phase}: {ray.get(pending)}"
        (staging,) = _staging(root)  # the previous run's, if any, was removed when this one took the lock
        assert holds(staging), (phase, sorted(p.name for p in staging.iterdir()))
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(pending, timeout=60)
        _nothing_accepted(root, previous=None)
        time.sleep(0.5)  # Ray kills the tasks the dead driver owned; a straggler cannot re-create its staging
    _rerun_succeeds(root, lambda command: ray.get(driver_class.remote().run.remote(command, None)), argv)
