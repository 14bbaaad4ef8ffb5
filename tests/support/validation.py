"""Megatron-Bridge's own validation of a config, with the plugin's hook suspended (the evidence tests' oracle)."""

from __future__ import annotations

import os
from typing import Any


def mb_validate(cfg: Any, world_size: int) -> Exception | None:
    """Megatron-Bridge's own ``runtime_config_update`` (hook suspended): the exception it raises, if any."""
    import copy

    from megatron.bridge.training.config import runtime_config_update

    from mbridge_seqpack.hook import suspended
    from tests.zoo.harness import restored_environ

    with restored_environ():
        os.environ["WORLD_SIZE"] = str(world_size)
        try:
            with suspended():
                runtime_config_update(copy.deepcopy(cfg))
        except Exception as exc:  # noqa: BLE001
            return exc
    return None
