"""The census's verdicts as data: what each failure point means for a config, written by reading the code.

Classes (a site gets exactly one):

``guarded``
    a config that reaches it is rejected at ``validate()`` by the plugin's rule(s) named.
``megatron_validates``
    Megatron-Bridge's own config-time check (``ConfigContainer.validate()`` / ``finalize()``, a config class's
    ``__post_init__``) rejects every config that would reach it; the check is named.
``unreachable``
    no config reaches it, for the reason given (an internal invariant the caller establishes, another code path,
    a feature Megatron-Bridge does not expose, inference only...).
``harmless``
    reached, but does not fail a correct run (a host read outside any captured graph, a check that only a corrupt
    file or a bug below can trip, a warning path...).
``gap``
    reachable from a config, fails on the GPU (or trains wrong), and no rule catches it yet: the fields that
    reach it are named. The most useful answer; the doc lists every gap.

Mappings are written per function (a default verdict for the function's sites) with per-site overrides matched
by a piece of the site's normalized text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "CLASSES",
    "CensusVerdict",
    "Override",
    "Group",
    "guarded",
    "validated",
    "unreachable",
    "harmless",
    "gap",
    "site",
    "groups",
]

VerdictClass = Literal["guarded", "megatron_validates", "unreachable", "harmless", "gap"]
CLASSES: tuple[VerdictClass, ...] = ("guarded", "megatron_validates", "unreachable", "harmless", "gap")


@dataclass(frozen=True)
class CensusVerdict:
    """A class, the reason in words, and (by class) the rule ids, the Megatron check, the fields that reach it."""

    cls: VerdictClass
    reason: str
    rules: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    validator: str = ""
    #: a gap that is on the path but not specific to packed, variable-length or CP data (listed apart)
    general: bool = False

    def __post_init__(self) -> None:
        if self.cls not in CLASSES:
            raise RuntimeError(f"unknown verdict class {self.cls!r}")
        if not self.reason.strip():
            raise RuntimeError("every verdict states its reason")
        if (self.cls == "guarded") != bool(self.rules):
            raise RuntimeError(f"a {self.cls} verdict {'needs' if self.cls == 'guarded' else 'names no'} rule ids")
        if self.cls == "megatron_validates" and not self.validator:
            raise RuntimeError("a megatron_validates verdict names Megatron-Bridge's check")
        if self.cls == "gap" and not self.fields:
            raise RuntimeError("a gap names the config fields that reach it")
        if self.general and self.cls != "gap":
            raise RuntimeError("only a gap is marked general")


def guarded(rules: str | tuple[str, ...], reason: str, fields: tuple[str, ...] = ()) -> CensusVerdict:
    return CensusVerdict("guarded", reason, (rules,) if isinstance(rules, str) else tuple(rules), tuple(fields))


def validated(validator: str, reason: str, fields: tuple[str, ...] = ()) -> CensusVerdict:
    return CensusVerdict("megatron_validates", reason, (), tuple(fields), validator)


def unreachable(reason: str) -> CensusVerdict:
    return CensusVerdict("unreachable", reason)


def harmless(reason: str, fields: tuple[str, ...] = ()) -> CensusVerdict:
    return CensusVerdict("harmless", reason, (), tuple(fields))


def gap(fields: tuple[str, ...], reason: str, *, general: bool = False) -> CensusVerdict:
    """``general``: reachable and failing, but not specific to packed / variable-length / CP data."""
    return CensusVerdict("gap", reason, (), tuple(fields), general=general)


@dataclass(frozen=True)
class Override:
    """One site (or a few alike) inside a function whose verdict differs from the function's: ``match`` is a piece
    of the site's normalized text (``ast.unparse``), ``kind`` narrows it to one site kind."""

    match: str
    verdict: CensusVerdict
    kind: str | None = None

    def matches(self, kind: str, text: str) -> bool:
        return self.match in text and (self.kind is None or self.kind == kind)


def site(match: str, verdict: CensusVerdict, kind: str | None = None) -> Override:
    return Override(match, verdict, kind)


@dataclass(frozen=True)
class Group:
    """The sites of one function (``qualname``; ``Class.*`` for every method of a class, ``*`` for the whole
    file) in one file: the default verdict and the overrides."""

    file: str
    qualname: str
    verdict: CensusVerdict
    overrides: tuple[Override, ...] = field(default=())

    def covers(self, qualname: str) -> bool:
        if self.qualname == "*":
            return True
        if self.qualname.endswith(".*"):
            return qualname.startswith(self.qualname[:-1])
        return qualname == self.qualname or qualname.startswith(self.qualname + ".")

    @property
    def specificity(self) -> tuple[int, int]:
        """Exact names beat patterns; a longer name beats a shorter one."""
        exact = not self.qualname.endswith("*")
        return (int(exact), len(self.qualname))


Entry = CensusVerdict | tuple[CensusVerdict, tuple[Override, ...]] | tuple[CensusVerdict, Override]


def groups(file: str, table: dict[str, Entry]) -> tuple[Group, ...]:
    """A file's mapping, written as ``{qualname: verdict}`` or ``{qualname: (verdict, site(...), site(...))}``."""
    out = []
    for qualname, entry in table.items():
        if isinstance(entry, CensusVerdict):
            out.append(Group(file, qualname, entry))
        else:
            verdict, *overrides = entry
            flat: list[Override] = []
            for o in overrides:
                flat.extend(o if isinstance(o, tuple) else (o,))
            out.append(Group(file, qualname, verdict, tuple(flat)))
    return tuple(out)
