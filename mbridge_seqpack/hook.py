"""The config-finalize hook: our rules run inside ``ConfigContainer.validate()``.

Megatron-Bridge 0.6.2 has no validator registry, and ``runtime_config_update()`` (inside
``pretrain()``/``finetune()``) calls ``cfg.validate()``. So the hook is a thin wrapper installed on
``ConfigContainer.validate``: it runs the plugin's rules first, then the original method. Before ``validate()``,
``runtime_config_update()`` computes the data-parallel size (``set_data_parallel_size``), which fails with a bare
``AssertionError`` or ``ZeroDivisionError`` on a world size or CP size the rules report; that method is wrapped
too, so the plugin's report comes first (the result is reused by ``validate()`` while the config is unchanged).
Installing is idempotent, and ``uninstall()`` puts back the exact original function objects.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import logging
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from mbridge_seqpack.errors import ERROR, PackingConfigError, UsageError, Violation
from mbridge_seqpack.modes import ENV_MODES, MODE_ENV, MODES, STRICT_ENV, Mode, env_mode
from mbridge_seqpack.ranks import is_rank_zero

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "install",
    "uninstall",
    "suspended",
    "is_installed",
    "current_mode",
    "MODES",
    "MODE_ENV",
    "PackingConfigWarning",
]

_WRAPPER_FLAG = "__mbridge_seqpack_hook__"


@dataclass
class _HookState:
    """What install() set: the wrapped ConfigContainer methods by name (None when not installed), the mode, the
    world size the rules assume and whether advisories raise too."""

    original: dict[str, Any] | None = None
    mode: Mode | None = None
    world_size: int | None = None
    strict: bool = False
    corrections: tuple[str, ...] = ()

    def settings(self) -> tuple[Mode, int | None, bool, tuple[str, ...]] | None:
        """(mode, world_size, strict, corrections) when installed, else None: what a context manager restores."""
        return (self.mode, self.world_size, self.strict, self.corrections) if self.original is not None else None


_state = _HookState()


class PackingConfigWarning(UserWarning):
    """Emitted per violation in ``"warn"`` mode."""


def _check_mode(mode: str, source: str, allowed: tuple[str, ...] = MODES) -> str:
    if mode not in allowed:
        raise UsageError(f"{source} must be one of {', '.join(allowed)}; got {mode!r}. Fix: {source}='error'")
    return mode


def current_mode() -> str | None:
    """Effective mode: ``MBRIDGE_SEQPACK_MODE`` overrides the installed one (its ``strict`` form is ``error``,
    strictly); None when not installed."""
    if _state.original is None:
        return None
    env = env_mode()
    if env:
        return "error" if _check_mode(env, MODE_ENV, ENV_MODES) == STRICT_ENV else env
    return _state.mode


def is_strict() -> bool:
    """Whether advisories and undetermined verdicts raise too: ``install(strict=True)`` or the variable's
    ``strict`` form."""
    return _state.strict or env_mode() == STRICT_ENV


def _config_container() -> type:
    from megatron.bridge.training.config import ConfigContainer

    return ConfigContainer


def is_installed() -> bool:
    """Whether ``ConfigContainer.validate`` is currently our wrapper."""
    return getattr(_config_container().__dict__.get("validate"), _WRAPPER_FLAG, False)


#: the ConfigContainer methods the hook wraps, in the order runtime_config_update() calls them:
#: set_data_parallel_size() raises Megatron's bare AssertionError / ZeroDivisionError on a world size or CP the
#: rules report, so the rules run there first (errors only); validate() then warns (from the same result).
#: to_yaml() is where a dry run ends: Megatron-Bridge's run_recipe.py --dry-run builds the config and writes it
#: (save_config) without runtime_config_update(); the rules run there for a config not validated in this process
#: (a validated one, e.g. at checkpoint saves, is not checked again)
_WRAPPED = ("set_data_parallel_size", "validate", "to_yaml")
_INHERITED = object()  # marks a wrapped method that ConfigContainer itself does not define
#: the last verdict kept for the validate() that follows: its config's key, and the stamps of every file and folder
#: the verdict read (digests.note_read), so a pack fixed on disk is judged again, never refused from memory
_checked: dict[str, Any] = {"key": None, "report": None, "reads": (), "stamps": None}
_validated: "weakref.WeakSet[Any]" = weakref.WeakSet()
#: the undetermined verdicts this process has logged as accepted: (rule id, what was not run), each said once
_accepted_undetermined: set[tuple[str, str]] = set()
#: the reports this process has logged, by their text: each said once
_logged_reports: set[str] = set()
LOGGER = logging.getLogger("mbridge_seqpack")


def dry_run_world_size(cfg: ConfigContainer) -> int | None:
    """The world a dry run checks against: the installed or launched one (``WORLD_SIZE``, a process group) when
    there is one, else the smallest world the config's layout fits (a login node has no ``WORLD_SIZE``)."""
    import os

    if _state.world_size is not None or os.environ.get("WORLD_SIZE"):
        return _state.world_size
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return None
        from mbridge_seqpack.rules.context import RuleContext

        return RuleContext(cfg=cfg, world_size=1).topology.smallest_world
    except Exception:  # noqa: BLE001  (a mistyped layout: config.types reports it at the resolved world)
        return None


def _config_key(cfg: ConfigContainer) -> tuple[int, str, int | None] | None:
    """Identity and content digest of ``cfg``: the rules' result is reused only for the same, unchanged config."""
    try:
        digest = hashlib.sha256(repr(cfg).encode()).hexdigest()
    except Exception:  # noqa: BLE001  (an odd repr only disables the reuse)
        return None
    return id(cfg), digest, _state.world_size


def _report(cfg: ConfigContainer, *, keep: bool, world_size: int | None = None) -> Any:
    """The check's report on ``cfg``; ``keep`` leaves it for the next call on the same unchanged config (once:
    set_data_parallel_size() keeps it for the validate() that follows inside runtime_config_update()), as long as
    no file or folder it read has changed since (size, mtime_ns, inode: a verdict whose files were just written is
    not kept)."""
    from mbridge_seqpack.digests import read_stamps, recording_reads
    from mbridge_seqpack.report import check

    key = _config_key(cfg)
    stamps = _checked["stamps"]
    if key is not None and _checked["key"] == key and stamps is not None and read_stamps(_checked["reads"]) == stamps:
        report, reads = _checked["report"], _checked["reads"]
    else:
        with recording_reads() as recorded:
            report = check(cfg, world_size=world_size if world_size is not None else _state.world_size)
        reads = tuple(sorted(recorded))
        stamps = read_stamps(reads)
    kept = keep and key is not None and stamps is not None
    _checked.update(
        key=key if kept else None,
        report=report if kept else None,
        reads=reads if kept else (),
        stamps=stamps if kept else None,
    )
    return report


def _forget_verdict() -> None:
    """A verdict that raised is not kept: the launch stops, and a retry in this process judges again."""
    _checked.update(key=None, report=None, reads=(), stamps=None)


def run_hook_rules(
    cfg: ConfigContainer, *, announce: bool = True, world_size: int | None = None, megatron: bool = False
) -> None:
    """Apply the current mode to ``cfg``: raise errors (and advisories when strict), warn the rest (``announce``).
    ``megatron`` (runtime_config_update's set_data_parallel_size() and validate(), error mode): Megatron-Bridge's own
    checks join the one error, each of them (:func:`megatron_violations`), where the plugin raises or they are more
    than one."""
    mode = current_mode()
    if mode in (None, "off"):
        return
    report = _report(cfg, keep=not announce, world_size=world_size)
    violations = report.violations
    if announce and is_rank_zero():
        _log_report(report)
    if mode == "error":
        raised = [v for v in violations if v.severity == ERROR or is_strict()]
        # inside validate() (announce) always; at set_data_parallel_size(), Megatron-Bridge's step before it, only
        # where the plugin raises there (validate() is then never reached)
        world = world_size if world_size is not None else _state.world_size
        theirs = megatron_violations(cfg, raised, world) if megatron and (raised or announce) else []
        if raised or len(theirs) > 1:  # one failure of Megatron-Bridge's own alone: its validate() raises it
            _forget_verdict()
            raise PackingConfigError(raised + theirs)
    if not violations:
        return
    if announce and is_rank_zero():
        for v in violations:
            warnings.warn(f"mbridge_seqpack: {v.describe()}", PackingConfigWarning, stacklevel=3)
        _log_accepted_undetermined(violations)


#: the id the one error gives a failure of Megatron-Bridge's own validate() (not a rule of the plugin's catalog)
MEGATRON_VALIDATE_ID = "megatron-bridge.validate"


def megatron_violations(cfg: ConfigContainer, found: list[Any], world_size: int | None = None) -> list[Any]:
    """Every check of Megatron-Bridge's own ``validate()`` (an assert or ValueError of it or of what it calls, e.g.
    Megatron-Core's TransformerConfig) that fails on ``cfg`` once the plugin's own fixes
    (``found``'s assignments) are applied (``analysis/megatron_validate.py``: its failures collected, not stopping at
    the first), less those a finding in ``found`` already quotes; as violations for the one error. ``world_size``:
    the one the plugin's own checks took (``install(world_size=...)``), else the process's. Empty where that run
    cannot be made (it never stops the launch: ``validate()`` itself runs next)."""
    from mbridge_seqpack.analysis.megatron_validate import collected_validation
    from mbridge_seqpack.config_paths import set_path

    try:
        fixing = [v.assignments for v in found if v.assignments]
        fixed = copy.deepcopy(cfg) if fixing else cfg  # collected_validation runs on copies of its own
        for assignments in fixing:
            for path, value in assignments.items():
                set_path(fixed, path, value)
        original = _state.original["validate"] if _state.original else None
        failures = collected_validation(fixed, original, world_size).failures
    except Exception:  # noqa: BLE001  (a config this run cannot copy or fix: validate() runs as written next)
        LOGGER.debug("mbridge_seqpack: Megatron-Bridge's checks were not collected", exc_info=True)
        return []
    said = " ".join(f"{v.rule} {v.fix}" for v in found)
    return [
        Violation(
            {"raised": f.kind, "at": f.site},
            f"Megatron-Bridge's own validate() refuses the config: {f.message}",
            fix="change the setting the message names (Megatron-Bridge's check, at validate(), before the GPUs are "
            "allocated)",
            rule_id=MEGATRON_VALIDATE_ID,
        )
        for f in failures
        if f.check and (not f.message or f.message[:80] not in said)  # a crash, not a check: validate() raises it
    ]


def _log_report(report: Any) -> None:
    """The check's report (``check()``'s, as the command line prints it), once per process for each report that
    differs, on the ``mbridge_seqpack`` logger at INFO: each verdict, what stood in and what was assumed."""
    text = report.to_text()
    if text in _logged_reports:
        return
    _logged_reports.add(text)
    LOGGER.info("mbridge_seqpack checked the config inside validate():\n%s", text)


def _log_accepted_undetermined(violations: list[Any]) -> None:
    """Say once per process, on the ``mbridge_seqpack`` logger, each verdict the launch goes on without: what could
    not be determined here and why (a warning filter may hide the warnings; the log line stays)."""
    from mbridge_seqpack.errors import UNDETERMINED

    undetermined = [v for v in violations if v.severity == UNDETERMINED]
    new = [v for v in undetermined if (v.rule_id, v.not_run) not in _accepted_undetermined]
    if not new:
        return
    _accepted_undetermined.update((v.rule_id, v.not_run) for v in new)
    lines = [f"  {v.rule_id}: {v.not_run}" for v in new]
    LOGGER.warning(
        "mbridge_seqpack accepted %d verdict%s not determined here (MBRIDGE_SEQPACK_MODE=strict refuses them):\n%s",
        len(new),
        "" if len(new) == 1 else "s",
        "\n".join(lines),
    )


def _was_validated(cfg: ConfigContainer) -> bool:
    try:
        return cfg in _validated
    except TypeError:  # not weak-referenceable: check it
        return False


def _make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    name = original.__name__

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if name == "to_yaml":
            if not _was_validated(self):
                run_hook_rules(self, announce=True, world_size=dry_run_world_size(self))
            return original(self, *args, **kwargs)
        run_hook_rules(self, announce=name == "validate", megatron=True)
        result = original(self, *args, **kwargs)
        if name == "validate":
            with contextlib.suppress(TypeError):
                _validated.add(self)
            _arm_content_check(self)
        return result

    setattr(wrapper, _WRAPPER_FLAG, True)
    return wrapper


def _arm_content_check(cfg: ConfigContainer) -> None:
    """After ``validate()`` passed on a config that trains on offline packs: the launch reads every byte of them
    (and of their inputs) before the first optimizer step (artifact/launch_guard.py). Never breaks validation."""
    specs = getattr(getattr(cfg, "dataset", None), "offline_packing_specs", None)
    if current_mode() in (None, "off") or specs is None:
        return
    from mbridge_seqpack.artifact import launch_guard
    from mbridge_seqpack.artifact.content_check import ContentPlan
    from mbridge_seqpack.artifact.pack_files import content_plan

    try:
        plan = content_plan(cfg) if is_rank_zero() else ContentPlan()  # the other ranks only meet the gate
    except Exception as exc:  # noqa: BLE001  (a config the rules accepted: say so, and train without the check)
        if is_rank_zero():
            warnings.warn(f"mbridge_seqpack: the pack content check could not be planned ({exc})", stacklevel=3)
        plan = ContentPlan()  # still armed: every rank meets the same gate, whatever one rank could plan
    launch_guard.arm(plan)


def _snapshot() -> tuple[str, int | None, bool, tuple[str, ...]] | None:
    """(mode, world_size, strict, corrections) when installed, else None."""
    return _state.settings()


def _restore(previous: tuple[str, int | None, bool, tuple[str, ...]] | None) -> None:
    """Return to a :func:`_snapshot`: uninstalled, or installed with that mode, world size, strictness and
    corrections."""
    uninstall()
    if previous is not None:
        install(mode=previous[0], world_size=previous[1], strict=previous[2], corrections=previous[3])


class InstalledHook:
    """Returned by :func:`install`; as a context manager it restores the previous hook state on exit."""

    def __init__(self, previous: tuple[Any, ...] | None):
        self._previous = previous

    def __enter__(self) -> "InstalledHook":
        return self

    def __exit__(self, *exc: object) -> None:
        _restore(self._previous)


def install(
    mode: str = "error", *, world_size: int | None = None, strict: bool = False, corrections: Sequence[str] = ()
) -> InstalledHook:
    """Register the rules inside ``ConfigContainer.validate()``.

    ``mode``: ``"error"`` raises :class:`PackingConfigError` listing every error-level violation and warns the
    advisories, ``"warn"`` emits one :class:`PackingConfigWarning` each (rank 0 only) and continues, ``"off"``
    does nothing. ``MBRIDGE_SEQPACK_MODE`` overrides it (``strict`` there: error mode, strictly). ``strict=True``
    raises advisories and undetermined verdicts (what could not be computed here) too.
    ``world_size`` fixes the DP arithmetic (default: torch.distributed / ``WORLD_SIZE``).
    ``corrections``: opt-in backports of upstream fixes, by name (``"router_padding_mask"``: Megatron-Bridge PR
    5470, the MoE router excludes packed padding), added to those ``MBRIDGE_SEQPACK_CORRECTIONS`` names; each is
    installed only on the Megatron versions it was written for (``check`` says where it is not).
    Installing again only updates mode, world size, strictness and corrections.
    """
    if not isinstance(strict, bool):
        raise UsageError(f"strict must be True or False, got {strict!r}")
    _check_mode(mode, "mode")
    from mbridge_seqpack.corrections import check_names, env_corrections

    if isinstance(corrections, str):
        corrections = (corrections,)
    asked = check_names(corrections, "corrections")
    wanted = tuple(dict.fromkeys((*asked, *env_corrections())))
    cls = _config_container()
    previous = _snapshot()
    if _state.original is None:
        originals = {}
        for name in _WRAPPED:
            current = cls.__dict__.get(name, _INHERITED)  # to_yaml is Megatron-Core's container's
            if getattr(current, _WRAPPER_FLAG, False):  # a reloaded module left a wrapper behind
                current = current.__wrapped__
            originals[name] = current
            setattr(cls, name, _make_wrapper(getattr(cls, name) if current is _INHERITED else current))
        _state.original = originals
    from mbridge_seqpack.artifact import launch_guard
    from mbridge_seqpack.thd import inject

    inject.install()  # full-iteration graphs over packed batches get host-side max_seqlen
    launch_guard.install(current_mode)  # packed rows parsed only from bytes that match their seal
    _install_corrections(wanted)
    _state.mode, _state.world_size, _state.strict, _state.corrections = mode, world_size, strict, asked
    return InstalledHook(previous)


def _install_corrections(names: tuple[str, ...]) -> None:
    """The named corrections on, the others off; one not installable on these versions stays off (requested:
    ``check`` says why)."""
    from mbridge_seqpack.corrections import router_padding

    router_padding.request(names)
    if router_padding.NAME in names and router_padding.not_installable() is None:
        router_padding.install()
    else:
        router_padding.uninstall()


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Run Megatron-Bridge's validation alone (as the CLI does after its own report), then restore."""
    previous = _snapshot()
    uninstall()
    try:
        yield
    finally:
        _restore(previous)


def uninstall() -> None:
    """Restore the original ``ConfigContainer`` methods exactly; a no-op when not installed."""
    if _state.original is None:
        return
    from mbridge_seqpack.artifact import launch_guard
    from mbridge_seqpack.corrections import router_padding
    from mbridge_seqpack.thd import inject

    inject.uninstall()
    launch_guard.uninstall()
    router_padding.uninstall()
    router_padding.request(())
    cls = _config_container()
    for name, original in _state.original.items():
        if original is _INHERITED:
            delattr(cls, name)  # back to the inherited method, as before install()
        else:
            setattr(cls, name, original)
    _checked.update(key=None, violations=None)
    _state.original, _state.mode, _state.world_size, _state.strict = None, None, None, False
    _state.corrections = ()
