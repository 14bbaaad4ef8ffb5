"""The config-finalize hook: our rules run inside ``ConfigContainer.validate()``.

Megatron-Bridge 0.6.2 has no validator registry, and ``runtime_config_update()`` (inside
``pretrain()``/``finetune()``) calls ``cfg.validate()``. So the hook is a thin wrapper installed on
``ConfigContainer.validate``: it runs the plugin's rules first, then the original method. It is
idempotent, and ``uninstall()`` puts back the exact original function object.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from typing import Any, Callable, Iterator

from mbridge_seqpack.errors import ERROR, PackingConfigError
from mbridge_seqpack.ranks import is_rank_zero

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

MODES = ("error", "warn", "off")
MODE_ENV = "MBRIDGE_SEQPACK_MODE"
_WRAPPER_FLAG = "__mbridge_seqpack_hook__"

_state: dict[str, Any] = {"original": None, "mode": None, "world_size": None, "strict": False}


class PackingConfigWarning(UserWarning):
    """Emitted per violation in ``"warn"`` mode."""


def _check_mode(mode: str, source: str) -> str:
    if mode not in MODES:
        raise ValueError(f"{source} must be one of {', '.join(MODES)}; got {mode!r}. Fix: {source}='error'")
    return mode


def current_mode() -> str | None:
    """Effective mode: ``MBRIDGE_SEQPACK_MODE`` overrides the installed one; None when not installed."""
    if _state["original"] is None:
        return None
    env = os.environ.get(MODE_ENV)
    if env:
        return _check_mode(env.strip().lower(), MODE_ENV)
    return _state["mode"]


def _config_container() -> type:
    from megatron.bridge.training.config import ConfigContainer

    return ConfigContainer


def is_installed() -> bool:
    """Whether ``ConfigContainer.validate`` is currently our wrapper."""
    return getattr(_config_container().__dict__.get("validate"), _WRAPPER_FLAG, False)


def run_hook_rules(cfg: Any) -> None:
    """Apply the current mode to ``cfg``: raise errors (and advisories when strict), warn the rest."""
    mode = current_mode()
    if mode in (None, "off"):
        return
    from mbridge_seqpack.rules import check

    violations = check(cfg, world_size=_state["world_size"])
    if not violations:
        return
    if mode == "error":
        raised = [v for v in violations if _state["strict"] or v.severity == ERROR]
        if raised:
            raise PackingConfigError(raised)
    if is_rank_zero():
        for v in violations:
            warnings.warn(f"mbridge_seqpack: {v.describe()}", PackingConfigWarning, stacklevel=3)


def _make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def validate(self: Any, *args: Any, **kwargs: Any) -> Any:
        run_hook_rules(self)
        return original(self, *args, **kwargs)

    setattr(validate, _WRAPPER_FLAG, True)
    return validate


def _snapshot() -> tuple[str, int | None, bool] | None:
    """(mode, world_size, strict) when installed, else None."""
    return (_state["mode"], _state["world_size"], _state["strict"]) if _state["original"] is not None else None


def _restore(previous: tuple[str, int | None, bool] | None) -> None:
    """Return to a :func:`_snapshot`: uninstalled, or installed with that mode, world size and strictness."""
    uninstall()
    if previous is not None:
        install(mode=previous[0], world_size=previous[1], strict=previous[2])


class InstalledHook:
    """Returned by :func:`install`; as a context manager it restores the previous hook state on exit."""

    def __init__(self, previous: tuple[Any, ...] | None):
        self._previous = previous

    def __enter__(self) -> "InstalledHook":
        return self

    def __exit__(self, *exc: object) -> None:
        _restore(self._previous)


def install(mode: str = "error", *, world_size: int | None = None, strict: bool = False) -> InstalledHook:
    """Register the rules inside ``ConfigContainer.validate()``.

    ``mode``: ``"error"`` raises :class:`PackingConfigError` listing every error-level violation and warns the
    advisories, ``"warn"`` emits one :class:`PackingConfigWarning` each (rank 0 only) and continues, ``"off"``
    does nothing. ``MBRIDGE_SEQPACK_MODE`` overrides it. ``strict=True`` raises advisories too.
    ``world_size`` fixes the DP arithmetic (default: torch.distributed / ``WORLD_SIZE``).
    Installing again only updates mode, world size and strictness.
    """
    if not isinstance(strict, bool):
        raise ValueError(f"strict must be True or False, got {strict!r}")
    _check_mode(mode, "mode")
    cls = _config_container()
    previous = _snapshot()
    if _state["original"] is None:
        current = cls.__dict__["validate"]
        if getattr(current, _WRAPPER_FLAG, False):  # a reloaded module left a wrapper behind
            current = current.__wrapped__
        _state["original"] = current
        cls.validate = _make_wrapper(current)
    _state.update(mode=mode, world_size=world_size, strict=strict)
    return InstalledHook(previous)


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
    """Restore the original ``ConfigContainer.validate`` exactly; a no-op when not installed."""
    if _state["original"] is None:
        return
    _config_container().validate = _state["original"]
    _state.update(original=None, mode=None, world_size=None, strict=False)
