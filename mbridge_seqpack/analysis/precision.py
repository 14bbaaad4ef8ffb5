"""Where a run's precision fields come from: the one reading of ``mixed_precision`` that the rules
(``RuleContext.precision_source``) and Transformer Engine's attention verdict (``attention_backend``) share."""

from __future__ import annotations

from typing import Any

__all__ = ["precision_source"]


def precision_source(cfg: Any) -> tuple[str, Any] | None:
    """(path prefix, object) holding the run's precision fields: a ``mixed_precision`` config, or a recipe name
    resolved to Megatron-Bridge's preset, overwrites every precision field of the model in runtime_config_update
    (mixed_precision.py update_config_with_precision_overrides); else the model's own fields. None for a recipe name
    Megatron-Bridge does not know (its get_mixed_precision_config raises ValueError; it reports that itself)."""
    mixed = getattr(cfg, "mixed_precision", None)
    if isinstance(mixed, str):
        from megatron.bridge.training.mixed_precision import get_mixed_precision_config

        try:
            return "mixed_precision", get_mixed_precision_config(mixed)
        except ValueError:
            return None
    return ("mixed_precision", mixed) if mixed is not None else ("model", cfg.model)
