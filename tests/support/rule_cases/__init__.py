"""The rule cases: for each rule, a config change that breaks it, the violation's fields and fix, and the repair.

A rule ``<family>.<name>`` has its cases in ``tests/support/rule_cases/<family>.py`` (``CASES``), run by
``tests/rules/test_<family>.py`` through :func:`breaks_and_fix_repairs`, the one runner. This module holds what the
families share: the ``Case`` record, the config edits most cases are made of, and the runner. The evidence and gap
tests reuse the edits and, through :func:`all_cases`, the validate-backed cases."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from mbridge_seqpack import check
from mbridge_seqpack.config_paths import set_path
from tests.support.field_reads import undeclared_reads, untyped_fields

SPECS = "dataset.offline_packing_specs"
KW = "dataset.dataset_kwargs.pad_to_max_length"


@dataclass
class Case:
    rule_id: str
    base: str
    world: int
    breaks: Callable[[Any, Any], None]
    fields: dict[str, Any] | Callable[[Any, Any], dict[str, Any]]  # or computed from the broken config, tmp_path
    assignments: dict[str, Any] | None = None
    fix: str | None = None
    repair: Callable[[Any, Any], Any] | None = None  # default: apply assignments
    also: tuple[str, ...] = ()
    repaired_world: int | None = None
    base_world: int | None = None  # where the unbroken base config is valid, when not the checked world
    patch: Callable[[pytest.MonkeyPatch], None] | None = None  # what the environment differs in (undone after)


def set_fields(**values: Any) -> Callable[[Any, Any], None]:
    """Set each field (``model__seq_length`` for ``model.seq_length``)."""

    def mutate(cfg: Any, tmp_path: Any) -> None:
        for path, value in values.items():
            set_path(cfg, path.replace("__", "."), value)

    return mutate


def seq_lengths(n: int, *, packed: bool = False) -> dict[str, int]:
    """The model's and the dataset's sequence length (and the pack's row length) at ``n``, for :func:`set_fields`."""
    out = {"model__seq_length": n, "dataset__seq_length": n}
    if packed:
        out["dataset__offline_packing_specs__packed_sequence_size"] = n
    return out


def in_turn(*fns: Callable[..., None]) -> Callable[[Any, Any], None]:
    """Several edits, in order; an edit may take ``(cfg, tmp_path)`` or ``(cfg)``."""

    def mutate(cfg: Any, tmp_path: Any) -> None:
        for fn in fns:
            try:
                fn(cfg, tmp_path)
            except TypeError:
                fn(cfg)

    return mutate


CP2_LOSS = {
    "model__context_parallel_size": 2,
    "model__calculate_per_token_loss": True,
    "ddp__average_in_collective": False,
}
TP2_SP = {"model__tensor_model_parallel_size": 2, "model__sequence_parallel": True}


def _apply_fix(cfg: Any, assignments: dict[str, Any]) -> None:
    for path, value in assignments.items():
        set_path(cfg, path, value)


def breaks_and_fix_repairs(case: Case, request: pytest.FixtureRequest) -> None:
    """A real ConfigContainer breaking only ``case``'s rule gives exactly that violation (fields and fix asserted),
    and the same config with the fix applied gives none."""
    tmp_path = request.getfixturevalue("tmp_path")
    cfg = request.getfixturevalue(case.base)
    base_world = case.base_world or case.repaired_world or case.world
    assert check(cfg, world_size=base_world) == [], "the base config must be valid"
    assert undeclared_reads(cfg, base_world) == {}
    if case.patch is not None:
        case.patch(request.getfixturevalue("monkeypatch"))
    case.breaks(cfg, tmp_path)

    found = check(cfg, world_size=case.world)
    assert sorted(v.rule_id for v in found) == sorted((case.rule_id, *case.also))
    assert undeclared_reads(cfg, case.world) == {}  # every field each rule reads here is in its @rule(reads=...)
    assert untyped_fields(found) == []
    violation = next(v for v in found if v.rule_id == case.rule_id)
    assert violation.fields == (case.fields(cfg, tmp_path) if callable(case.fields) else case.fields)
    if case.assignments is not None:
        assert violation.assignments == case.assignments
    if case.fix is not None:
        assert violation.fix == case.fix
    assert violation.rule  # the rule in words

    if case.repair is not None:
        case.repair(cfg, tmp_path)
    else:
        _apply_fix(cfg, violation.assignments)
        for other in found:
            if other is not violation:
                _apply_fix(cfg, other.assignments)
    assert check(cfg, world_size=case.repaired_world or case.world) == []


def all_cases() -> list[Case]:
    """Every family's cases, families by name."""
    modules = sorted(m.name for m in pkgutil.iter_modules(__path__))
    return [case for name in modules for case in importlib.import_module(f"{__name__}.{name}").CASES]
