"""The comparisons, each a small function over the packed and unpacked signals, and the cached per-config verdict.

A comparison returns a :class:`Finding` (a difference, measured) or None. ``COMPARISONS`` is the list the verdict
runs; a test runs the verdict with one comparison removed to show each one alone catches its case.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from mbridge_seqpack.equivalence.setup import Setup
from mbridge_seqpack.equivalence.signals import Token

__all__ = [
    "COMPARISONS",
    "Finding",
    "Signals",
    "SignalComparison",
    "forget_verdicts",
    "is_remembered",
    "verdict",
    "verdict_of",
]


@dataclass(frozen=True)
class Finding:
    """One training signal that differs packed vs unpacked: which, how many of how many, and in words."""

    signal: str  # "labels" | "loss_mask" | "attention" | "mtp" | "router" | "loss" | "cp"
    count: int
    total: int
    effect: str
    example: str = ""


@dataclass(frozen=True)
class Signals:
    """What the comparisons read: per-sample tokens packed and unpacked, and the router's effect (or None)."""

    setup: Setup
    packed: list[list[Token]]
    unpacked: list[list[Token]]
    router: object | None = None
    loss: tuple[object, object] | None = None  # (packed, unpacked) LossSignal
    cp: object | None = None  # CpSignals: each CP rank's part, packed and unpacked (CP > 1)


def _pairs(s: Signals):
    for index, (packed, unpacked) in enumerate(zip(s.packed, s.unpacked)):
        for j, (p, u) in enumerate(zip(packed, unpacked)):
            yield index, j, p, u


def _example(index: int, j: int, what: str) -> str:
    return f"sample {index + 1}, input position {j}: {what}"


def labels(s: Signals) -> Finding | None:
    """Trained labels equal per token."""
    bad = [(i, j, p, u) for i, j, p, u in _pairs(s) if (p.trained or u.trained) and p.label != u.label]
    total = sum(1 for _, _, p, u in _pairs(s) if p.trained or u.trained)
    if not bad:
        return None
    i, j, p, u = bad[0]
    return Finding(
        "labels",
        len(bad),
        total,
        f"{len(bad)} of {total} trained labels differ from the unpacked run's",
        _example(i, j, f"label {p.label} packed, {u.label} unpacked"),
    )


def loss_mask(s: Signals) -> Finding | None:
    """The same tokens are trained."""
    extra = [(i, j) for i, j, p, u in _pairs(s) if p.trained and not u.trained]
    dropped = [(i, j) for i, j, p, u in _pairs(s) if u.trained and not p.trained]
    total = sum(1 for _, _, p, u in _pairs(s) if p.trained or u.trained)
    if not extra and not dropped:
        return None
    parts = []
    if dropped:
        parts.append(f"{len(dropped)} of {total} tokens the unpacked run trains get no loss packed")
    if extra:
        parts.append(f"{len(extra)} tokens the unpacked run does not train get loss packed")
    i, j = (dropped or extra)[0]
    return Finding(
        "loss_mask",
        len(extra) + len(dropped),
        total,
        "; ".join(parts),
        _example(i, j, "loss mask " + ("0 packed, 1 unpacked" if dropped else "1 packed, 0 unpacked")),
    )


def attention(s: Signals) -> Finding | None:
    """Each token attends within its own sequence, from its first token (TE's reading of the packed params)."""
    pairs = list(_pairs(s))
    bad = [(i, j, p) for i, j, p, u in pairs if p.offset != u.offset]
    if not bad:
        return None
    i, j, p = bad[0]
    where = (
        "is counted as padding or as another sequence's token" if p.offset is None else f"sits at offset {p.offset}"
    )
    return Finding(
        "attention",
        len(bad),
        len(pairs),
        f"{len(bad)} of {len(pairs)} tokens attend outside their own sequence or are counted as padding "
        "(TE's reading of the packed cu_seqlens; the kernel itself does not run on CPU)",
        _example(i, j, where),
    )


def mtp(s: Signals) -> Finding | None:
    """MTP targets: every trained target is the unpacked run's target at that depth, inside the sample."""
    if not s.setup.mtp_layers or s.setup.cp > 1:
        return None
    bad, total, first = 0, 0, ""
    for i, j, p, u in _pairs(s):
        n = len(s.unpacked[i])
        for d, ((pl, pt), (ul, ut)) in enumerate(zip(p.mtp, u.mtp), start=1):
            inside = j + d < n
            if pt or (inside and ut):
                total += 1
            wrong = (pt and (not inside or pl != ul)) or (inside and ut and not pt)
            if wrong:
                bad += 1
                first = first or _example(
                    i, j, f"MTP depth {d} target {pl if pt else 'none'} packed, {ul if inside else 'none'} unpacked"
                )
    if not bad:
        return None
    return Finding(
        "mtp",
        bad,
        total,
        f"{bad} of {total} MTP labels cross a sequence boundary or differ from the unpacked run's",
        first,
    )


def router(s: Signals) -> Finding | None:
    """Padding contributes nothing to the router's counts and losses."""
    effect = s.router
    if effect is None:
        return None
    if effect.corrected:
        return _corrected_router(effect)
    if not effect.routed_padding:
        return None
    parts = [f"{effect.padding_share:.1%} of routed tokens are padding ({effect.routed_padding} of {effect.routed})"]
    parts.append(f"tokens per expert move by {effect.load_shift:.1%} of the real load")
    if effect.aux_loss is not None:
        parts.append(f"load-balancing loss {effect.aux_loss[0]:.4g} vs {effect.aux_loss[1]:.4g} on real tokens only")
    if effect.z_loss is not None:
        parts.append(f"z-loss {effect.z_loss[0]:.4g} vs {effect.z_loss[1]:.4g}")
    if effect.real_dropped is not None and effect.real_dropped[0] != effect.real_dropped[1]:
        parts.append(f"capacity drops {effect.real_dropped[0]} real tokens vs {effect.real_dropped[1]}")
    return Finding("router", effect.routed_padding, effect.routed, "; ".join(parts))


def _corrected_router(effect: object) -> Finding | None:
    """With the padding mask of the correction router_padding_mask: what still differs from the real tokens alone."""
    parts = []
    if effect.routed_padding:
        parts.append(f"{effect.routed_padding} padding tokens are still counted")
    if effect.real_uncounted:
        parts.append(f"{effect.real_uncounted} real tokens are left out of the counts")
    if effect.load_shift > 1e-9:
        parts.append(f"tokens per expert move by {effect.load_shift:.1%} of the real load")
    if effect.aux_loss is not None and not _close(*effect.aux_loss):
        parts.append(f"load-balancing loss {effect.aux_loss[0]:.4g} vs {effect.aux_loss[1]:.4g} on real tokens only")
    if effect.z_loss is not None and not _close(*effect.z_loss):
        parts.append(f"z-loss {effect.z_loss[0]:.4g} vs {effect.z_loss[1]:.4g}")
    drops = effect.real_dropped
    if drops is not None and drops[0] != drops[1]:
        parts.append(f"capacity drops {drops[0]} real tokens vs {drops[1]}")
    if not parts:
        return None
    if drops is not None:
        parts.append(
            "the expert capacity still counts every token (Megatron-Core 0.19.2's apply_router_token_dropping takes "
            "no padding mask; the correction does not reach it)"
        )
    count = effect.routed_padding + effect.real_uncounted + (abs(drops[0] - drops[1]) if drops else 0)
    return Finding("router", count, effect.routed, "with the correction router_padding_mask on: " + "; ".join(parts))


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def loss(s: Signals) -> Finding | None:
    """Per sample the loss sum and token count masked_next_token_loss gives, the step's reported loss, and (where
    packed and unpacked micro batches hold the same sequences, or the loss is per token) the loss backward runs on."""
    if s.loss is None:
        return None
    packed, unpacked = s.loss
    pairs = list(zip(packed.per_sample, unpacked.per_sample))
    bad = [i for i, ((ps, pc), (us, uc)) in enumerate(pairs) if pc != uc or not _close(ps, us)]
    parts, example = [], ""
    if bad:
        i = bad[0]
        (ps, pc), (us, uc) = pairs[i]
        parts.append(f"{len(bad)} of {len(pairs)} sequences get another loss sum or token count")
        example = f"sample {i + 1}: loss sum {ps:.4g} over {pc} tokens packed, {us:.4g} over {uc} unpacked"
    if not _close(packed.reported, unpacked.reported):
        parts.append(f"the step reports lm loss {packed.reported:.4g} vs {unpacked.reported:.4g}")
    same_groups = s.setup.per_token_loss or s.setup.mode == "in_batch"
    if same_groups and not _close(packed.backward, unpacked.backward):
        parts.append(f"the loss backward runs on is {packed.backward:.4g} vs {unpacked.backward:.4g}")
    if not parts:
        return None
    return Finding("loss", len(bad), len(pairs), "; ".join(parts), example)


def _cp_tokens(side: object) -> list[tuple[int, int, tuple]]:
    return [(i, j, held) for i, sample in enumerate(side.tokens) for j, held in enumerate(sample)]


def context_parallel(s: Signals) -> Finding | None:
    """CP > 1, per rank as the step splits the micro batches: every token held by exactly one rank, at the position
    TE's CP attention reads it; per token the label, loss mask and loss contribution of the unpacked run's; the
    reported loss and (with calculate_per_token_loss, which validate requires for SFT at CP > 1) the loss backward
    runs on, after the reductions over the CP group."""
    if s.cp is None:
        return None
    packed, unpacked = s.cp.packed, s.cp.unpacked
    pairs = list(zip(_cp_tokens(packed), _cp_tokens(unpacked)))
    total = len(pairs)
    cp = s.setup.cp
    parts, example = [], ""
    unheld = [(i, j) for (i, j, held), _ in pairs if not held]
    doubled = [(i, j, len(held)) for (i, j, held), _ in pairs if len(held) > 1]
    if unheld:
        parts.append(f"{len(unheld)} of {total} tokens are held by no CP rank")
        example = example or _example(*unheld[0], "on no CP rank")
    if doubled:
        parts.append(f"{len(doubled)} of {total} tokens are held by more than one of the {cp} CP ranks")
        i, j, n = doubled[0]
        example = example or _example(i, j, f"on {n} CP ranks")
    misplaced = [
        (i, j, wrong[0]) for (i, j, held), _ in pairs if (wrong := [t for t in held if t.position != t.layout])
    ]
    if misplaced:
        i, j, t = misplaced[0]
        parts.append(f"{len(misplaced)} of {total} tokens sit where TE's CP attention does not read them")
        example = example or _example(
            i, j, f"CP rank {t.rank} holds position {t.position}, TE reads position {t.layout} there"
        )
    bad = []
    for (i, j, held), (_, _, other) in pairs:
        if len(held) == 1 and len(other) == 1:
            p, u = held[0], other[0]
            if (p.trained or u.trained) and (
                (p.label, p.trained) != (u.label, u.trained) or not _close(p.loss, u.loss)
            ):
                bad.append((i, j, p, u))
    if bad:
        i, j, p, u = bad[0]
        parts.append(f"{len(bad)} of {total} tokens train another label, loss mask or loss on their CP rank")
        example = example or _example(
            i,
            j,
            f"label {p.label} trained={p.trained} loss {p.loss:.4g} on CP rank {p.rank} packed, "
            f"{u.label} trained={u.trained} loss {u.loss:.4g} unpacked",
        )
    if not _close(packed.reported, unpacked.reported):
        parts.append(
            f"after the CP reduction the step reports lm loss {packed.reported:.4g} vs {unpacked.reported:.4g}"
        )
    if s.setup.per_token_loss and not _close(packed.backward, unpacked.backward):
        parts.append(
            f"the loss backward runs on is {packed.backward:.4g} vs {unpacked.backward:.4g} after the CP reduction"
        )
    if not parts:
        return None
    count = len(unheld) + len(doubled) + len(misplaced) + len(bad)
    return Finding("cp", count, total, f"CP={cp}: " + "; ".join(parts), example)


COMPARISONS: tuple[Callable[[Signals], Finding | None], ...] = (
    labels,
    loss_mask,
    attention,
    mtp,
    router,
    loss,
    context_parallel,
)


@dataclass(frozen=True)
class SignalComparison:
    """The check's outcome for one setup: findings, what could not run here, and the seconds it took."""

    setup: Setup
    findings: tuple[Finding, ...]
    not_run: tuple[str, ...] = ()
    seconds: float = 0.0
    router: object | None = field(default=None, compare=False)
    #: the notes of ``not_run`` that leave a part of this verdict undetermined (never shown as OK)
    undetermined: tuple[str, ...] = ()
    cp: object | None = field(default=None, compare=False)
    #: the CP comparison did not run at all: no CPU world of the CP size could be made here
    cp_not_run: bool = False

    def of(self, *signals: str) -> list[Finding]:
        return [f for f in self.findings if f.signal in signals]


def _not_run(setup: Setup) -> tuple[str, ...]:
    notes = [
        "Transformer Engine's attention kernel (CUDA only): the check compares TE's reading of the packed "
        "cu_seqlens per sequence instead"
    ]
    if setup.cp > 1 and setup.mtp_layers:
        notes.append(
            f"the CP={setup.cp} branch of the MTP roll (it exchanges boundary tokens between CP ranks): MTP labels "
            "are not compared at CP > 1 (mtp.packed_context_parallel's)"
        )
    return tuple(notes)


def _cp(setup: Setup, packed: object, unpacked: object) -> tuple[object | None, tuple[str, ...], bool]:
    """Each CP rank's part in a CP-rank CPU world, what of it could not run here (never an OK), and whether no such
    world could be made at all."""
    from mbridge_seqpack.capture.cpu_world import RanksUnavailable
    from mbridge_seqpack.equivalence.cp import cp_signals

    try:
        found = cp_signals(setup, packed, unpacked)
    except RanksUnavailable as exc:
        return (
            None,
            (f"not determined here: no CPU world: the CP={setup.cp} split and its loss reductions ({exc})",),
            True,
        )
    except RuntimeError as exc:  # a rank failed: Megatron-Bridge/Core refuse these rows (other rules name why)
        last = [line for line in str(exc).splitlines() if line.strip()][-1]
        return None, (f"not determined here: the CP={setup.cp} split of these rows fails ({last.strip()})",), False
    return found, found.not_run, False


def verdict(
    setup: Setup, comparisons: tuple[Callable[[Signals], Finding | None], ...] = COMPARISONS
) -> SignalComparison:
    """Build, run and compare (uncached)."""
    from mbridge_seqpack.equivalence.batches import packed_run, unpacked_run
    from mbridge_seqpack.equivalence.loss import loss_signal
    from mbridge_seqpack.equivalence.signals import token_signals

    started = time.perf_counter()
    packed, unpacked = packed_run(setup), unpacked_run(setup)
    signals = Signals(
        setup,
        token_signals(setup, packed, pass_loss_mask=setup.vlm_step),
        token_signals(setup, unpacked, pass_loss_mask=setup.vlm_step),
        loss=(loss_signal(setup, packed), loss_signal(setup, unpacked)),
    )
    effect, refused = None, ""
    if setup.router is not None and setup.router.counting_terms:
        from mbridge_seqpack.equivalence.router import router_effect

        try:
            effect = router_effect(setup.router, packed)
        except (AssertionError, ValueError) as exc:  # Megatron-Core refuses the settings: other rules name them
            refused = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        signals = dataclasses.replace(signals, router=effect)
    undetermined: tuple[str, ...] = ()
    cp_not_run = False
    if setup.cp > 1:
        found_cp, undetermined, cp_not_run = _cp(setup, packed, unpacked)
        signals = dataclasses.replace(signals, cp=found_cp)
    findings = tuple(f for f in (c(signals) for c in comparisons) if f is not None)
    notes = _not_run(setup) + undetermined
    if refused:
        notes += (f"the router: Megatron-Core refuses these router settings ({refused})",)
    seconds = time.perf_counter() - started
    return SignalComparison(setup, findings, notes, seconds, effect, undetermined, signals.cp, cp_not_run)


_VERDICTS: dict[Setup, SignalComparison] = {}
_KEPT = 256


def verdict_of(setup: Setup) -> SignalComparison:
    """The verdict for ``setup``, computed once per process (the setup is the cache key). A verdict whose CP part
    found no CPU world (``RanksUnavailable``: a torch.distributed world already up, ranks that could not be forked)
    is not kept: that is this process's state at the time, so the same config checked later gets its CP part
    computed, not the earlier "not determined"."""
    found = _VERDICTS.get(setup)
    if found is None:
        found = verdict(setup)
        if not found.cp_not_run:
            if len(_VERDICTS) >= _KEPT:
                del _VERDICTS[next(iter(_VERDICTS))]
            _VERDICTS[setup] = found
    return found


def is_remembered(setup: Setup) -> bool:
    """Whether ``setup``'s verdict is already computed in this process (a check of it costs nothing)."""
    return setup in _VERDICTS


def forget_verdicts() -> None:
    """Drop every remembered verdict (tests that change what the verdict depends on outside the setup)."""
    _VERDICTS.clear()
