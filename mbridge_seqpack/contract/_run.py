"""The recording subprocess: ``python -m mbridge_seqpack.contract._run OUTPUT [--src DIR] [--only NAME ...]``.

``--src`` goes first on ``sys.path`` before anything imports ``megatron``, so ``megatron.bridge`` is the checkout's
(``megatron`` is a namespace package: Megatron-Core stays the installed one). Exit 0 with the observations written
to OUTPUT; exit 125 with one line on stderr when ``megatron.bridge`` cannot be imported from where it was asked.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

IMPORT_FAILED = 125


def _describe_checkout() -> dict[str, object]:
    import megatron.bridge

    where = Path(megatron.bridge.__file__).resolve()
    info: dict[str, object] = {"file": str(where), "version": getattr(megatron.bridge, "__version__", None)}
    try:
        from megatron.bridge import package_info

        info["version"] = package_info.__version__
    except Exception:  # noqa: BLE001  (a version string is what it is; a missing one is recorded as None)
        pass
    return info


def main(argv: list[str]) -> int:
    output = Path(argv[0])
    src = argv[argv.index("--src") + 1] if "--src" in argv else None
    only = argv[argv.index("--only") + 1 :] if "--only" in argv else None
    if src is not None:
        sys.path.insert(0, src)
    started = time.monotonic()
    try:
        import megatron.bridge  # noqa: F401
        import megatron.bridge.training.config  # noqa: F401  (the package's config imports the step's modules)

        checkout = _describe_checkout()
    except Exception as exc:  # noqa: BLE001  (any import failure makes the checkout unusable for this kit)
        print(f"megatron.bridge cannot be imported: {type(exc).__name__}: {exc}", file=sys.stderr)
        return IMPORT_FAILED
    if src is not None and not str(checkout["file"]).startswith(str(Path(src).resolve())):
        print(f"megatron.bridge was imported from {checkout['file']}, not from {src}", file=sys.stderr)
        return IMPORT_FAILED
    imported = time.monotonic() - started

    from mbridge_seqpack.contract.observations import RESOLVED, run_all

    observations = run_all(only)
    result = {
        "megatron_bridge": {**checkout, "resolved": sorted(RESOLVED)},
        "seconds": {"import": round(imported, 1), "observations": round(time.monotonic() - started - imported, 1)},
        "observations": observations,
    }
    output.write_text(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
