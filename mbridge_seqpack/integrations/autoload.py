"""Zero-code activation: ``MBRIDGE_SEQPACK_MODE=error|warn`` installs the hook in any Python process that
imports Megatron-Bridge's config module.

The wheel ships ``mbridge_seqpack_autoload.pth`` (one ``import`` line) into site-packages, so this module runs at
interpreter start-up. With the variable unset it returns at once (no further import). With it set, it adds a
meta-path finder that waits for ``megatron.bridge.training.config`` to finish importing and then calls
``mbridge_seqpack.install(mode)``; ``pretrain()``/``finetune()``/``runtime_config_update()`` then run the rules.
Nothing here may break interpreter start-up: every failure becomes one warning on stderr.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any, Sequence

from mbridge_seqpack.modes import ACTIVE_MODES, ENV_MODES, MODE_ENV, STRICT_ENV, env_mode

__all__ = ["activate", "TARGET"]

TARGET = "megatron.bridge.training.config"


def _install(mode: str) -> None:
    try:
        import mbridge_seqpack

        strict = mode == STRICT_ENV
        mbridge_seqpack.install(mode="error" if strict else mode, strict=strict)
    except Exception as exc:  # noqa: BLE001  (never break the user's import)
        print(f"mbridge_seqpack: {MODE_ENV}={mode!r} could not install the hook: {exc}", file=sys.stderr)


class _InstallAfterLoad(importlib.abc.Loader):
    """Runs the real loader, then installs the hook (the module is complete by then)."""

    def __init__(self, loader: Any, mode: str) -> None:
        self._loader = loader
        self._mode = mode

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _install(self._mode)

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, is_package, ...
        return getattr(self._loader, name)


class _WaitForConfig(importlib.abc.MetaPathFinder):
    def __init__(self, mode: str) -> None:
        self._mode = mode

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _InstallAfterLoad(spec.loader, self._mode)
        return spec


def activate() -> None:
    """Called by the ``.pth`` line at start-up; cheap and silent when the variable is unset."""
    mode = env_mode()
    if not mode or mode == "off":
        return
    if mode not in ACTIVE_MODES:
        choices = f"{', '.join(ENV_MODES[:-1])} or {ENV_MODES[-1]}"
        print(f"mbridge_seqpack: {MODE_ENV} must be {choices}; got {mode!r} - not activated", file=sys.stderr)
        return
    if TARGET in sys.modules:
        _install(mode)
    elif not any(isinstance(f, _WaitForConfig) for f in sys.meta_path):
        sys.meta_path.insert(0, _WaitForConfig(mode))


try:
    activate()
except Exception as exc:  # noqa: BLE001
    print(f"mbridge_seqpack: startup hook skipped ({exc})", file=sys.stderr)
