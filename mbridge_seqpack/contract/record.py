"""``contract record``: the observations of one Megatron-Bridge, run in a fresh interpreter so the checkout's
``src`` comes first on its path (Megatron-Bridge is pure Python; Megatron-Core and TE stay the installed ones),
written as one JSON record, atomically."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from mbridge_seqpack.contract.observations import VERSION, names
from mbridge_seqpack.errors import SeqpackError, UsageError

__all__ = ["FORMAT", "CheckoutImportError", "RecordingFailed", "checkout_src", "record", "write_record", "load_record"]

FORMAT = "mbridge-seqpack contract record"
_RUN = "mbridge_seqpack.contract._run"
IMPORT_FAILED = 125  # _run.py's exit when megatron.bridge cannot be imported from where it was asked


class CheckoutImportError(SeqpackError):
    """The checkout's ``megatron.bridge`` does not import with the installed Megatron-Core (``bisect-run``: 125)."""


class RecordingFailed(RuntimeError):
    """The recording subprocess died (it records every exception of an observation, so this is the commit's import
    or the interpreter itself): ``bisect-run`` skips such a commit, ``record`` reports it with its stderr."""


def checkout_src(checkout: Path) -> Path:
    """The ``src`` folder of a Megatron-Bridge repository root, or a usage error naming what is missing."""
    src = checkout / "src"
    if not (src / "megatron" / "bridge" / "__init__.py").is_file():
        raise UsageError(
            f"--megatron-bridge {checkout}: not a Megatron-Bridge repository root "
            "(no src/megatron/bridge/__init__.py);"
            " pass the folder that holds src/"
        )
    return src


def check_names(only: Sequence[str] | None) -> list[str] | None:
    if not only:
        return None
    unknown = [n for n in only if n not in names()]
    if unknown:
        raise UsageError(f"--only {' '.join(unknown)}: no such observation; the observations are {', '.join(names())}")
    return list(only)


def _commit(checkout: Path | None) -> str | None:
    if checkout is None:
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _installed(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def record(checkout: Path | None = None, only: Sequence[str] | None = None) -> dict[str, Any]:
    """The record of ``checkout`` (a repository root) or, without one, of the installed Megatron-Bridge."""
    import mbridge_seqpack

    wanted = check_names(only)
    src = checkout_src(checkout) if checkout is not None else None
    env = {k: v for k, v in os.environ.items() if k not in ("MBRIDGE_SEQPACK_MODE", "PYTHONSAFEPATH")}
    env["PYTHONHASHSEED"] = "0"  # set and dict orders of str keys the same in every record
    plugin_root = str(Path(mbridge_seqpack.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([plugin_root, *filter(None, [os.environ.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory(prefix="mbridge_seqpack_record_") as scratch:
        out = Path(scratch) / "observations.json"
        argv = [sys.executable, "-m", _RUN, str(out)]
        if src is not None:
            argv += ["--src", str(src.resolve())]
        if wanted:
            argv += ["--only", *wanted]
        done = subprocess.run(argv, cwd=scratch, env=env, capture_output=True, text=True, check=False)
        if done.returncode == IMPORT_FAILED:
            last = (done.stderr.strip().splitlines() or ["megatron.bridge cannot be imported"])[-1]
            raise CheckoutImportError(f"{checkout or 'the installed Megatron-Bridge'}: {last}")
        if done.returncode != 0 or not out.is_file():
            tail = "\n".join(done.stderr.strip().splitlines()[-20:])
            raise RecordingFailed(f"the recording subprocess exited {done.returncode}:\n{tail}")
        ran = json.loads(out.read_text())
    return {
        "format": FORMAT,
        "observations_version": VERSION,
        "plugin_version": mbridge_seqpack.__version__,
        "megatron_bridge": {
            **ran["megatron_bridge"],
            "checkout": str(checkout.resolve()) if checkout is not None else None,
            "commit": _commit(checkout),
        },
        "megatron_core": _installed("megatron-core"),
        "seconds": ran["seconds"],
        "only": wanted,
        "observations": ran["observations"],
    }


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_record(data: dict[str, Any], output: Path) -> None:
    """JSON to ``output`` through a scratch file in its folder and one rename: a reader never sees half a record."""
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        os.chmod(scratch, 0o666 & ~_umask())
        os.replace(scratch, output)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise


def load_record(path: Path) -> dict[str, Any]:
    """A record from disk, or a usage error naming the file and what is wrong with it."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(
            f"{path}: no such record; write one with `mbridge-seqpack contract record --output`"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not a contract record (not JSON: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("observations"), dict):
        raise UsageError(f'{path}: not a contract record (no "format": {FORMAT!r}); write one with `contract record`')
    return data
