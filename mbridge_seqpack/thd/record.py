"""Where a config records that the plugin's static-shape THD path is on (no Megatron import).

A fixed width (``dataset.pad_to_max_length``) plus a fixed ``cu_seqlens`` capacity make in-batch packing
capturable. The capacity is recorded in ``cfg.env_vars['MBRIDGE_SEQPACK_STATIC_THD']`` (``"capacity=5"`` or
``"capacity=5,max_seqlen=2048"``): ``env_vars`` is a real ``ConfigContainer`` field, so the record survives
Megatron-Bridge's ``to_yaml``/``from_yaml`` and Hydra overrides, and ``runtime_config_update`` exports it to the
training process's environment, where it is harmless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "StaticTHDSpec",
    "STATIC_THD_ENV",
    "STATIC_THD_PATH",
    "static_thd_spec",
    "static_in_batch_enabled",
    "check_static_shape",
    "parse_static_thd",
]

STATIC_THD_ENV = "MBRIDGE_SEQPACK_STATIC_THD"
STATIC_THD_PATH = f"env_vars.{STATIC_THD_ENV}"  # dotted path, as the mixins' facts and overrides name it


def check_static_shape(owner: str, capacity: object, max_seqlen: object, *, max_seqlen_optional: bool) -> None:
    """Shared validation of a static cu_seqlens capacity and max_seqlen; messages name ``owner``."""
    if not isinstance(capacity, int) or capacity < 2:
        raise ValueError(f"{owner}.capacity must be an int >= 2 (0 plus one boundary), got {capacity!r}")
    if max_seqlen is None and max_seqlen_optional:
        return
    if not isinstance(max_seqlen, int) or max_seqlen < 1:
        raise ValueError(f"{owner}.max_seqlen must be a positive int, got {max_seqlen!r}")


@dataclass(frozen=True)
class StaticTHDSpec:
    """Fixed ``cu_seqlens`` capacity (entries, including the leading 0) and fixed ``max_seqlen``.

    ``max_seqlen=None`` means the row width, which is always safe: no segment is longer than its row.
    """

    capacity: int
    max_seqlen: int | None = None

    def __post_init__(self) -> None:
        check_static_shape("StaticTHDSpec", self.capacity, self.max_seqlen, max_seqlen_optional=True)

    def encode(self) -> str:
        """The record as stored in ``cfg.env_vars`` (a string, as environment variables are)."""
        text = f"capacity={self.capacity}"
        return text if self.max_seqlen is None else f"{text},max_seqlen={self.max_seqlen}"


def parse_static_thd(text: object) -> StaticTHDSpec:
    """``"capacity=N[,max_seqlen=M]"`` -> spec; ValueError naming the expected form otherwise."""
    form = f"{STATIC_THD_ENV} must read 'capacity=N' or 'capacity=N,max_seqlen=M' (N >= 2, M >= 1)"
    if not isinstance(text, str):
        raise ValueError(f"{form}; got {text!r} of type {type(text).__name__}")
    values: dict[str, int] = {}
    for part in text.split(","):
        key, sep, number = part.strip().partition("=")
        if not sep or key not in ("capacity", "max_seqlen") or key in values or not number.strip().isdigit():
            raise ValueError(f"{form}; got {text!r}")
        values[key] = int(number)
    if "capacity" not in values:
        raise ValueError(f"{form}; got {text!r}")
    try:
        return StaticTHDSpec(values["capacity"], values.get("max_seqlen"))
    except ValueError:
        raise ValueError(f"{form}; got {text!r}") from None


def static_thd_spec(cfg: Any) -> StaticTHDSpec | None:
    """The static-THD spec recorded in ``cfg.env_vars``, if any (ValueError if the record is malformed)."""
    env_vars = getattr(cfg, "env_vars", None)
    text = env_vars.get(STATIC_THD_ENV) if isinstance(env_vars, dict) else None
    return None if text is None else parse_static_thd(text)


def static_in_batch_enabled(cfg: Any) -> bool:
    """In-batch packing may be graphed only with a fixed width and a fixed cu_seqlens capacity."""
    try:
        spec = static_thd_spec(cfg)
    except ValueError:
        return False  # config.types reports the malformed record
    return spec is not None and getattr(cfg.dataset, "pad_to_max_length", False) is True
