"""The equivalence check on the configs it passes (``tests/support/equivalence_configs.py`` PASSING, the same
list ``tests/equivalence/test_equivalence_loss.py`` asserts): per config the signals compared, the result and the
seconds it took, as a Markdown table. Running it records the rows in ``docs/bench/equivalence_table.json``;
``section()`` renders what docs/equivalence.md carries between its markers from that record
(``scripts/generate.py`` writes and checks it without running the check), and says the record is stale when the
list of configs changed since.

    .venv/bin/python scripts/equivalence_table.py
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package and tests, whatever is installed
RECORD = ROOT / "docs" / "bench" / "equivalence_table.json"

HEADER = "| config | signals compared | result | time |\n|---|---|---|---|"


def _result(found: object) -> str:
    if found.findings:
        return "differs: " + "; ".join(f"{f.signal}: {f.effect}" for f in found.findings)
    if found.undetermined:
        if "thd_get_partitioned_indices" in found.undetermined[0]:  # ran, with a stand-in: said, not undetermined
            what = "stood in here: TE's thd_get_partitioned_indices"
            return f"same per-token signal on every rank; {what} (CUDA only; its kernel transliterated)"
        return f"same per-token signal on every rank; {found.undetermined[0]}"
    return "same per-token signal"


def rows() -> list[tuple[str, str, str, str]]:
    """(config, signals compared, result, time) for each passing config, run uncached."""
    from mbridge_seqpack.equivalence.compare import verdict
    from tests.support.equivalence_configs import PASSING, compared, make_setup

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verdict(make_setup())  # the first verdict's lazy imports are not the check's time
        out = []
        for name, changes in PASSING:
            found = verdict(make_setup(**changes))
            out.append((f"`{name}`", ", ".join(compared(found)), _result(found), f"{found.seconds * 1000:.0f} ms"))
    return out


def markdown(table: list[tuple[str, str, str, str]]) -> str:
    return "\n".join([HEADER, *("| " + " | ".join(row) + " |" for row in table)])


def section() -> str:
    """The generated part of docs/equivalence.md, from the recorded rows: the table and its count."""
    from tests.support.equivalence_configs import PASSING

    table = [tuple(row) for row in json.loads(RECORD.read_text())["rows"]]
    if [row[0] for row in table] != [f"`{name}`" for name, _ in PASSING]:
        return f"The recorded table is stale (the configs changed): run `.venv/bin/python {Path(__file__).name}`."
    same = sum(1 for row in table if row[2].startswith("same"))
    return (
        f"{same} of {len(table)} configs train the same per-token signal packed and unpacked "
        f"(`scripts/equivalence_table.py`):\n\n{markdown(table)}"
    )


def main() -> int:
    table = rows()
    print(markdown(table))
    staged = RECORD.with_suffix(".json.tmp")
    staged.write_text(json.dumps({"rows": table}, indent=1) + "\n")
    staged.replace(RECORD)  # atomic: a killed run leaves the old record
    return 0


if __name__ == "__main__":
    sys.exit(main())
