"""Where a config records that the plugin's static-shape THD path is on (no Megatron import).

The marker lives on the dataset config because that is what produces the batches: a fixed width
(``pad_to_max_length``) plus a fixed ``cu_seqlens`` capacity make in-batch packing capturable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["StaticTHDSpec", "STATIC_THD_ATTR", "static_thd_spec", "static_in_batch_enabled", "check_static_shape"]

STATIC_THD_ATTR = "mbridge_seqpack_static_thd"


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


def static_thd_spec(cfg: Any) -> StaticTHDSpec | None:
    """The static-THD spec recorded on ``cfg.dataset``, if any."""
    return getattr(cfg.dataset, STATIC_THD_ATTR, None)


def static_in_batch_enabled(cfg: Any) -> bool:
    """In-batch packing may be graphed only with a fixed width and a fixed cu_seqlens capacity."""
    return static_thd_spec(cfg) is not None and getattr(cfg.dataset, "pad_to_max_length", False) is True
