"""The census: the scanned sites of the installed files joined with the reviewed inventory and the verdicts.

A site is *mapped* when its identity is in the inventory (``inventory.json``: every site someone has reviewed)
and a verdict resolves for it (the most specific function group of its file, then an override matching its
text). Anything else is reported: a scanned site missing from the inventory or without a verdict
(``unmapped``, e.g. a new ``assert`` after an upgrade), an inventory entry no longer found (``stale``), a group
or override that matches no site, an override matched twice in one function.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from devtools.census.files import PATH_FILES, PathFile, site_packages
from devtools.census.scanner import Site, scan_file
from devtools.census.verdicts import CensusVerdict, Group, Override

__all__ = ["INVENTORY", "Mapped", "Unmapped", "Census", "scan_path", "load_inventory", "inventory_of", "build"]

INVENTORY = Path(__file__).with_name("inventory.json")

Key = tuple[str, str, str, str, int]


@dataclass(frozen=True)
class Mapped:
    site: Site
    verdict: CensusVerdict
    group: Group
    override: Override | None


@dataclass(frozen=True)
class Unmapped:
    site: Site
    why: str

    def __str__(self) -> str:
        s = self.site
        return f"{s.file}:{s.line} {s.qualname} [{s.kind}] {s.excerpt} ({self.why})"


@dataclass
class Census:
    mapped: list[Mapped] = field(default_factory=list)
    unmapped: list[Unmapped] = field(default_factory=list)
    stale_inventory: list[Key] = field(default_factory=list)
    stale_groups: list[Group] = field(default_factory=list)
    stale_overrides: list[tuple[Group, Override]] = field(default_factory=list)
    ambiguous: list[tuple[Site, tuple[Override, ...]]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (
            self.unmapped or self.stale_inventory or self.stale_groups or self.stale_overrides or self.ambiguous
        )

    def problems(self) -> list[str]:
        """Every drift, one line each (what the drift test prints)."""
        out = [f"unmapped: {u}" for u in self.unmapped]
        out += [f"stale inventory entry (site gone): {k[0]} {k[1]} [{k[2]}] #{k[3]}" for k in self.stale_inventory]
        out += [f"stale group (matches no site): {g.file} {g.qualname}" for g in self.stale_groups]
        out += [
            f"stale override (matches no site): {g.file} {g.qualname} ~ {o.match!r}" for g, o in self.stale_overrides
        ]
        out += [
            f"ambiguous: {s.file}:{s.line} {s.qualname} matched by {[o.match for o in os]}" for s, os in self.ambiguous
        ]
        return out


def scan_path(root: Path | None = None, files: Sequence[PathFile] = PATH_FILES) -> list[Site]:
    """Every site of the path's files under ``root`` (default: the installed site-packages)."""
    base = root if root is not None else site_packages()
    sites: list[Site] = []
    for f in files:
        sites.extend(scan_file(base / f.path, f.path, f.only))
    return sites


def load_inventory(path: Path = INVENTORY) -> set[Key]:
    data = json.loads(path.read_text())
    return {(file, q, kind, dig, occ) for file, rows in data["sites"].items() for q, kind, dig, occ, _ in rows}


def inventory_of(sites: Iterable[Site]) -> str:
    """The inventory file's text for ``sites`` (sorted, one site a line, an excerpt for the reader of a diff)."""
    by_file: dict[str, list[list]] = {}
    for s in sorted(sites, key=lambda s: (s.file, s.qualname, s.kind, s.key[3], s.occurrence)):
        by_file.setdefault(s.file, []).append([s.qualname, s.kind, s.key[3], s.occurrence, s.excerpt])
    lines = ['{"version": 1, "sites": {']
    files = sorted(by_file)
    for i, file in enumerate(files):
        lines.append(f"  {json.dumps(file)}: [")
        rows = by_file[file]
        for j, row in enumerate(rows):
            lines.append(f"    {json.dumps(row)}{',' if j < len(rows) - 1 else ''}")
        lines.append(f"  ]{',' if i < len(files) - 1 else ''}")
    lines.append("}}")
    return "\n".join(lines) + "\n"


def _resolve(
    site: Site, candidates: list[Group]
) -> tuple[Group, CensusVerdict, Override | None, tuple[Override, ...]]:
    group = max(candidates, key=lambda g: g.specificity)
    hits = tuple(o for o in group.overrides if o.matches(site.kind, site.text))
    if hits:
        return group, hits[0].verdict, hits[0], hits
    return group, group.verdict, None, ()


def build(
    sites: Sequence[Site] | None = None,
    inventory: set[Key] | None = None,
    mapping: Sequence[Group] | None = None,
) -> Census:
    """Join the scan, the inventory and the verdicts; defaults: the installed files, ``inventory.json``, the
    census's own mapping."""
    if mapping is None:
        from devtools.census.mapping import MAPPING

        mapping = MAPPING
    sites = list(sites) if sites is not None else scan_path()
    inventory = inventory if inventory is not None else load_inventory()
    by_file: dict[str, list[Group]] = {}
    for g in mapping:
        by_file.setdefault(g.file, []).append(g)
    census = Census()
    used_groups: set[int] = set()
    used_overrides: set[tuple[int, int]] = set()
    scanned: set[Key] = set()
    for s in sites:
        scanned.add(s.key)
        candidates = [g for g in by_file.get(s.file, []) if g.covers(s.qualname)]
        if s.key not in inventory:
            census.unmapped.append(Unmapped(s, "not in the census inventory"))
            continue
        if not candidates:
            census.unmapped.append(Unmapped(s, "no verdict for its function"))
            continue
        group, verdict, override, hits = _resolve(s, candidates)
        used_groups.add(id(group))
        if len({o.verdict for o in hits}) > 1:  # overrides that agree may overlap
            census.ambiguous.append((s, hits))
        for o in hits:
            used_overrides.add((id(group), id(o)))
        census.mapped.append(Mapped(s, verdict, group, override))
    census.stale_inventory = sorted(inventory - scanned)
    for g in mapping:
        if id(g) not in used_groups:
            census.stale_groups.append(g)
            continue
        census.stale_overrides += [(g, o) for o in g.overrides if (id(g), id(o)) not in used_overrides]
    return census
