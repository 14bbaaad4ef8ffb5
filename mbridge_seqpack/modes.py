"""The plugin's modes and the environment variable that selects one.

Shared by the hook, the zero-code loader and the static-THD injection, which must agree on when the plugin is on."""

from __future__ import annotations

import os
from typing import Literal

__all__ = ["Mode", "MODES", "MODE_ENV", "ACTIVE_MODES", "ENV_MODES", "STRICT_ENV", "env_mode"]

Mode = Literal["error", "warn", "off"]

MODES = ("error", "warn", "off")
#: the variable's strict form: error mode, and advisories and undetermined verdicts raise too (install(strict=True))
STRICT_ENV = "strict"
ENV_MODES = (*MODES, STRICT_ENV)
ACTIVE_MODES = ("error", "warn", STRICT_ENV)
MODE_ENV = "MBRIDGE_SEQPACK_MODE"


def env_mode() -> str:
    """``MBRIDGE_SEQPACK_MODE`` as written (stripped, lower case); "" when unset."""
    return os.environ.get(MODE_ENV, "").strip().lower()
