"""Summarise the zoo and (with ``--write``) refresh the committed expectations.

.venv/bin/python -m tests.zoo.report [--write]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

EXPECTED = Path(__file__).with_name("expected.json")


def snapshot(zoo: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    """The committed form: per variant, per recipe, world size, Megatron's verdict and the plugin's flags."""
    out: dict[str, dict[str, Any]] = {}
    for variant, verdicts in zoo.items():
        out[variant] = {
            v.recipe: {
                "world_size": v.world_size,
                "megatron": ("not built: " + v.build_error[:80])
                if not v.built
                else ("accepted" if v.mb_accepts else "rejected: " + v.mb_error[:80]),
                "flags": sorted({f"{f['rule_id']}:{f['severity']}" for f in v.flags}),
            }
            for v in verdicts
        }
    return out


def summary(snap: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for variant, recipes in snap.items():
        built = [r for r in recipes.values() if not r["megatron"].startswith("not built")]
        accepted = [r for r in built if r["megatron"] == "accepted"]
        errors = [r for r in accepted if any(f.endswith(":error") for f in r["flags"])]
        advisory = [r for r in accepted if r["flags"] and r not in errors]
        counts = Counter(f for r in accepted for f in r["flags"])
        lines.append(
            f"{variant}: {len(recipes)} configs, {len(built)} built, {len(accepted)} accepted by "
            f"Megatron-Bridge, {len(errors)} with an error flag, {len(advisory)} with advisories only; "
            + ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))
        )
    return lines


def main(argv: list[str]) -> int:
    from tests.zoo.harness import run_zoo

    snap = snapshot(run_zoo())
    print("\n".join(summary(snap)))
    if "--write" in argv:
        EXPECTED.write_text(json.dumps(snap, indent=1, sort_keys=True) + "\n")
        print(f"wrote {EXPECTED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
