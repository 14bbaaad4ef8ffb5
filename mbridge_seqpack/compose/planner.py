"""Pack length vs global batch at equal token slots per optimizer step, checked by the real rules.

For each candidate pack length L the planner rebuilds the recipe, sets the sequence length to L,
re-derives the dependent fields (as the mixins do), sets ``global_batch_size = slots / L`` and runs
the full rule catalog at the given world size. Lengths above the model's context window (a packaged
recipe's ``context_window``, or ``--context-window``) are marked: nothing crashes there, but the model
has never seen such positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["PlanRow", "plan", "default_lengths"]


@dataclass(frozen=True)
class PlanRow:
    """One candidate: its batch, DP and the rules it breaks (empty: valid)."""

    pack_length: int
    global_batch_size: int | None
    dp: int | None
    broken: tuple[str, ...] = ()
    reasons: tuple[str, ...] = field(default=())
    context_window: int | None = None

    @property
    def within_context(self) -> bool | None:
        """False above the model's context window; None when the window is unknown."""
        return None if self.context_window is None else self.pack_length <= self.context_window

    @property
    def ok(self) -> bool:
        return not self.broken and self.within_context is not False

    def verdict(self) -> str:
        parts = [f"{rid}: {why}" for rid, why in zip(self.broken, self.reasons)]
        if self.within_context is False:
            parts.insert(0, f"above the model's {self.context_window:,}-token context window")
        return "; ".join(parts) if parts else "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "pack_length": self.pack_length,
            "global_batch_size": self.global_batch_size,
            "dp": self.dp,
            "ok": self.ok,
            "context_window": self.context_window,
            "within_context": self.within_context,
            "violations": [{"rule_id": r, "rule": w} for r, w in zip(self.broken, self.reasons)],
        }


def default_lengths(slots: int) -> list[int]:
    """Powers of two from 1024 up to ``slots``."""
    out, length = [], 1024
    while length <= slots:
        out.append(length)
        length *= 2
    return out


def plan(
    target: str,
    *,
    slots: int,
    world_size: int | None = None,
    lengths: Sequence[int] | None = None,
    overrides: Sequence[str] = (),
    context_window: int | None = None,
) -> list[PlanRow]:
    """Evaluate each pack length at ``slots`` token slots per step (``context_window`` defaults to the
    packaged recipe's)."""
    from mbridge_seqpack.compose.derive import derive
    from mbridge_seqpack.recipes.targets import build_target, resolve_world
    from mbridge_seqpack.rules import check
    from mbridge_seqpack.rules.context import RuleContext

    rows = []
    for length in lengths or default_lengths(slots):
        cfg, info = build_target(target, overrides)
        world = resolve_world(world_size, info)
        window = context_window if context_window is not None else getattr(info, "context_window", None)
        cfg.model.seq_length = length
        derive(cfg)
        dp = RuleContext(cfg=cfg, world_size=world).topology.data_parallel
        if slots % length:
            rows.append(
                PlanRow(
                    length,
                    None,
                    dp,
                    ("plan.slots_divisible",),
                    (f"{slots} token slots are not a whole number of {length}-token rows",),
                    window,
                )
            )
            continue
        cfg.train.global_batch_size = slots // length
        found = check(cfg, world_size=world)
        rows.append(
            PlanRow(length, slots // length, dp, tuple(v.rule_id for v in found), tuple(v.rule for v in found), window)
        )
    return rows
