"""``python -m devtools.census``: print ``docs/failure-points.md``.

``--check`` prints every drift (unmapped site, stale entry) and exits 1 if there is any; ``--write-inventory``
records the current scan as reviewed (run it only after mapping every new site, then re-render the page).
"""

from __future__ import annotations

import argparse
import sys

from devtools.census.census import INVENTORY, build, inventory_of, scan_path
from devtools.census.render import render_markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.census", description=__doc__)
    parser.add_argument("--check", action="store_true", help="print drift and exit 1 if the census is not clean")
    parser.add_argument("--write-inventory", action="store_true", help="record the current scan as reviewed")
    args = parser.parse_args(argv)
    sites = scan_path()
    if args.write_inventory:
        INVENTORY.write_text(inventory_of(sites))
        print(f"wrote {INVENTORY} ({len(sites)} sites)", file=sys.stderr)
        return 0
    census = build(sites)
    if args.check:
        for line in census.problems():
            print(line)
        print(f"{len(census.mapped)} sites mapped, {len(census.problems())} problems", file=sys.stderr)
        return 0 if census.clean else 1
    if not census.clean:
        print("\n".join(census.problems()), file=sys.stderr)
        return 1
    print(render_markdown(census), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
