"""Benchmark: the equivalence check's time inside ``validate()`` over the packaged recipe catalog
(``mbridge-seqpack recipes``), after the Megatron import. Each round clears the check's verdict cache and runs
``check()`` on every recipe at its world size (each distinct config then pays once: the cache key is the fields
that decide the verdict, ``equivalence/setup.py``), then runs them all again (cache hits). The check's own seconds
are ``rules/equivalence.py``'s ``timings`` (the cache's misses); the whole ``check()`` time is given beside them.

Writes the medians to ``docs/bench/bench_check.json`` (``--out``); the README's figure is rendered from that file by
``scripts/generate.py`` (never typed by hand).

    .venv/bin/python scripts/bench_check.py [--rounds 3] [--out docs/bench/bench_check.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package, whatever is installed
OUT = ROOT / "docs" / "bench" / "bench_check.json"


def _round(configs: list[tuple[str, object, int]]) -> dict[str, float]:
    from mbridge_seqpack import check
    from mbridge_seqpack.equivalence.compare import verdict_of
    from mbridge_seqpack.rules import equivalence

    verdict_of.cache_clear()
    equivalence.timings.clear()
    started = time.perf_counter()
    for _, cfg, world in configs:
        check(cfg, world_size=world)
    cold = time.perf_counter() - started
    computed, check_s = len(equivalence.timings), sum(equivalence.timings)
    started = time.perf_counter()
    for _, cfg, world in configs:
        check(cfg, world_size=world)
    warm = time.perf_counter() - started
    return {
        "equivalence_s": check_s,
        "verdicts": computed,
        "check_cold_s": cold,
        "check_warm_s": warm,
        "equivalence_warm_s": sum(equivalence.timings) - check_s,
    }


def measure(rounds: int) -> dict[str, object]:
    """Medians over ``rounds`` of the catalog's check time, cold and warm."""
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.bridge.training.config  # noqa: F401 - the import every check needs first
    import_s = time.perf_counter() - started

    from mbridge_seqpack.recipes import build_recipe, list_recipes, recipe_info

    configs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in list_recipes():
            configs.append((name, build_recipe(name), recipe_info(name).world_size))
        runs = [_round(configs) for _ in range(rounds)]
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    return {
        "recipes": len(configs),
        "verdicts": int(median["verdicts"]),
        "equivalence_s": round(median["equivalence_s"], 2),
        "equivalence_warm_s": round(median["equivalence_warm_s"], 3),
        "check_cold_s": round(median["check_cold_s"], 2),
        "check_warm_s": round(median["check_warm_s"], 2),
        "megatron_import_s": round(import_s, 1),
        "rounds": rounds,
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    result = measure(args.rounds)
    print(
        f"equivalence check inside validate(), {result['recipes']} recipes ({result['verdicts']} verdicts computed): "
        f"{result['equivalence_s']} s with the cache empty, {result['equivalence_warm_s']} s cached; whole check() "
        f"{result['check_cold_s']} s / {result['check_warm_s']} s; Megatron import {result['megatron_import_s']} s "
        f"(median of {result['rounds']}, {result['cpus']} CPUs)"
    )
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
