"""The ``determinism.*`` rule cases (run by ``tests/rules/test_determinism.py``)."""

from __future__ import annotations

import os
from typing import Any

from tests.support.rule_cases import Case


def _deterministic(cfg: Any, tmp_path: Any) -> None:
    os.environ.pop("NVTE_ALLOW_NONDETERMINISTIC_ALGO", None)  # the environment is restored after each test
    cfg.model.deterministic_mode = True
    cfg.model.cross_entropy_loss_fusion = False


CASES = [
    Case(
        "determinism.te_attention_env",
        "packed_cfg",
        8,
        _deterministic,
        {"model.deterministic_mode": True, "env NVTE_ALLOW_NONDETERMINISTIC_ALGO": None},
        {"env_vars.NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"},
    ),
]
