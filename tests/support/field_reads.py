"""Which config fields a rule reads when it runs, recorded rather than declared: every read of a field of the
``ConfigContainer``, of one of its sub-configs (``model``, ``dataset``, ``ddp``, ...) or of
``dataset.offline_packing_specs``, by the rule or the ``RuleContext`` facts it asks (the plugin's own code), as the
dotted path ``FIELD_TYPES`` spells (``model.seq_length``). A read of a sub-config itself is not a field read."""

from __future__ import annotations

import dataclasses
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

#: reads made by the plugin's own code count (the rule and the facts it asks); Megatron's own reads inside a function
#: the rule calls are Megatron's consumption of the config, which the field audit (devtools/field_uses.py) follows
PLUGIN = str(Path(__file__).resolve().parents[2] / "mbridge_seqpack")
#: the configs below a sub-config whose fields are fields too (the rest are values: a layer spec, a tokenizer path)
NESTED = {"dataset.offline_packing_specs"}


def _containers(cfg: Any) -> dict[int, tuple[Any, str]]:
    """id -> (config object, its dotted path; "" for the container itself)."""
    found: dict[int, tuple[Any, str]] = {id(cfg): (cfg, "")}
    for field in dataclasses.fields(cfg):
        section = getattr(cfg, field.name, None)
        if dataclasses.is_dataclass(section) and not isinstance(section, type):
            found.setdefault(id(section), (section, field.name))
    for path in NESTED:
        head, _, name = path.partition(".")
        nested = getattr(getattr(cfg, head, None), name, None)
        if dataclasses.is_dataclass(nested) and not isinstance(nested, type):
            found.setdefault(id(nested), (nested, path))
    return found


def _field_names(obj: Any) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(obj))


@contextmanager
def recording(cfg: Any) -> Iterator[set[str]]:
    """Within the block, the set it yields fills with the dotted path of every field of ``cfg`` read."""
    containers = _containers(cfg)
    names = {key: _field_names(obj) for key, (obj, _) in containers.items()}
    reads: set[str] = set()
    patched: dict[type, Any] = {}
    for obj, _ in containers.values():
        cls = type(obj)
        if cls in patched:
            continue
        patched[cls] = cls.__dict__.get("__getattribute__")
        inherited = cls.__getattribute__

        def traced(self: Any, name: str, _inherited: Any = inherited) -> Any:
            value = _inherited(self, name)
            key = id(self)
            if (
                key in containers
                and name in names[key]
                and id(value) not in containers
                and PLUGIN in sys._getframe(1).f_code.co_filename
            ):
                prefix = containers[key][1]
                reads.add(f"{prefix}.{name}" if prefix else name)
            return value

        cls.__getattribute__ = traced  # type: ignore[method-assign]
    try:
        yield reads
    finally:
        for cls, own in patched.items():
            if own is None:
                del cls.__getattribute__
            else:
                cls.__getattribute__ = own  # type: ignore[method-assign]


def rule_reads(cfg: Any, world_size: int) -> dict[str, set[str]]:
    """Rule id -> the fields of ``cfg`` it reads at ``world_size``, each rule on a fresh ``RuleContext`` (no fact
    cached by another rule); a rule that raises on this config (``config.types`` gates it) reads nothing here."""
    from mbridge_seqpack.rules import RuleContext, all_rules
    from mbridge_seqpack.rules.registry import run_rule

    found: dict[str, set[str]] = {}
    for entry in all_rules():
        ctx = RuleContext(cfg=cfg, world_size=world_size)
        with recording(cfg) as reads:
            try:
                run_rule(entry, ctx)
            except Exception:  # noqa: BLE001  a mistyped field the type rule reports first
                reads.clear()
        found[entry.rule_id] = set(reads)
    return found


#: the sub-configs a violation's fields can name (the rest of its fields are figures: "measured", "layers", ...)
SECTIONS = frozenset(
    {"model", "dataset", "train", "ddp", "dist", "validation", "checkpoint", "env_vars", "rerun_state_machine"}
    | {"logger", "comm_overlap", "mixed_precision", "tokenizer", "rng", "optimizer", "scheduler"}
)


def undeclared_reads(cfg: Any, world_size: int) -> dict[str, list[str]]:
    """Rule id -> the fields it reads on ``cfg`` that its ``@rule(reads=...)`` does not declare (``config.types``
    reads what the others declare)."""
    from mbridge_seqpack.rules import all_rules

    declared = {r.rule_id: set(r.reads) for r in all_rules()}
    found = rule_reads(cfg, world_size)
    return {
        rule_id: sorted(reads - declared[rule_id] - NESTED)
        for rule_id, reads in found.items()
        if rule_id != "config.types" and reads - declared[rule_id] - NESTED
    }


def _as_declared(path: str) -> str:
    """A violation's spelling of a field (``dataset.dataset_kwargs.key``, ``env_vars.NAME``) as ``reads`` has it."""
    head = "dataset.dataset_kwargs."
    if path.startswith(head):
        return f"dataset.dataset_kwargs['{path[len(head) :]}']"
    return "env_vars" if path.startswith("env_vars.") else path


#: rules whose violations name a field that is not the config's: the dataset_kwargs keys no dataset accepts
NAMES_UNKNOWN_FIELDS = {"gpt_sft.dataset_kwargs_accepted"}


def untyped_fields(violations: list[Any]) -> list[str]:
    """The config fields the violations name (fields and assignments) that have no type in ``FIELD_TYPES``."""
    from mbridge_seqpack.rules.catalog import FIELD_TYPES

    named = {
        _as_declared(path)
        for v in violations
        if v.rule_id not in NAMES_UNKNOWN_FIELDS
        for path in (*v.fields, *v.assignments)
        if path.partition(".")[0] in SECTIONS and "." in path
    }
    return sorted(named - set(FIELD_TYPES) - NESTED)
