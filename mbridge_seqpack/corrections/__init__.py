"""Opt-in corrections of Megatron-Bridge behaviour that trains wrong and that no setting avoids.

Small upstream fixes, backported for the exact versions they were written for and switched on by name
(``install(corrections=...)`` or ``MBRIDGE_SEQPACK_CORRECTIONS``). Each is proven by the equivalence check (packed
equals unpacked with it on).

Nothing here is on by default: Megatron-Bridge's own code runs unless a correction is named.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Literal

from mbridge_seqpack.errors import UsageError

__all__ = ["CORRECTIONS_ENV", "KNOWN", "CorrectionState", "env_corrections", "check_names"]

CORRECTIONS_ENV = "MBRIDGE_SEQPACK_CORRECTIONS"
#: every correction by name: Megatron-Bridge PR 5470 (the step passes the packed rows' padding mask to the router)
KNOWN = ("router_padding_mask",)

State = Literal["installed", "launch", "not_installable", "not_launched", "off"]


def _split(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.strip().lower() for p in text.replace(" ", ",").split(",") if p.strip()))


def check_names(names: Iterable[str], source: str) -> tuple[str, ...]:
    """``names`` (each a known correction), or :class:`UsageError` naming the source and the known ones."""
    out = tuple(dict.fromkeys(names))
    unknown = [n for n in out if n not in KNOWN]
    if unknown:
        raise UsageError(
            f"{source}: unknown correction {', '.join(map(repr, unknown))}; known: {', '.join(KNOWN)}. "
            f"Fix: {source}={KNOWN[0]}"
        )
    return out


def env_corrections() -> tuple[str, ...]:
    """The corrections ``MBRIDGE_SEQPACK_CORRECTIONS`` names (comma separated); () when unset."""
    return check_names(_split(os.environ.get(CORRECTIONS_ENV, "")), CORRECTIONS_ENV)


@dataclass(frozen=True)
class CorrectionState:
    """Where one correction stands for the process that trains, in the words ``check`` prints."""

    name: str
    state: State
    why: str = ""

    @property
    def in_effect(self) -> bool:
        """Installed here, or the launched process installs it."""
        return self.state in ("installed", "launch")

    def describe(self) -> str:
        words = {
            "installed": "installed in this process",
            "launch": f"requested ({CORRECTIONS_ENV}); the launched process installs it",
            "not_installable": "requested but not installable",
            "not_launched": "requested but not installed at launch",
            "off": "off",
        }[self.state]
        return f"correction {self.name}: {words}" + (f" ({self.why})" if self.why else "")
