"""The training side of static THD: a data-iterator wrapper and a forward-step wrapper that give every batch
static shapes, and the layout a ``ConfigContainer`` asks for (offline ``pad_cu_seqlens``).

The zero-code path (``thd.inject``, installed with the hook) is what full-iteration graphs need; these wrappers
are the manual API for custom forward steps."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Iterator

from mbridge_seqpack.errors import UsageError
from mbridge_seqpack.thd.layout import StaticTHDLayout, static_thd_batch

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["StaticTHDBatches", "static_thd_forward_step", "layout_from_config", "static_forward_step"]


class StaticTHDBatches:
    """Wraps a data iterator so every THD batch it yields has static shapes."""

    def __init__(self, iterator: Iterator[dict[str, Any]], layout: StaticTHDLayout):
        self._iterator = iterator
        self.layout = layout

    def __iter__(self) -> "StaticTHDBatches":
        return self

    def __next__(self) -> dict[str, Any]:
        return static_thd_batch(next(self._iterator), self.layout)


def _wrap(data_iterator: Any, layout: StaticTHDLayout) -> Any:
    if data_iterator is None or isinstance(data_iterator, StaticTHDBatches):
        return data_iterator
    if isinstance(data_iterator, list):  # virtual pipeline: one iterator per model chunk
        return [_wrap(it, layout) for it in data_iterator]
    return StaticTHDBatches(data_iterator, layout)


def _takes_state(forward_step: Callable[..., Any]) -> bool:
    """Whether Megatron-Bridge will inject its GlobalState as the first argument (its own signature test)."""
    from megatron.bridge.training.utils.train_utils import needs_global_state_injection

    return bool(needs_global_state_injection(forward_step))


def static_thd_forward_step(forward_step: Callable[..., Any], layout: StaticTHDLayout) -> Callable[..., Any]:
    """A forward step (e.g. Megatron-Bridge's ``gpt_step.forward_step`` or ``vlm_step.forward_step``) whose
    batches carry static THD shapes. Pass the result to ``finetune()``/``pretrain()`` instead.

    The wrapper keeps the wrapped step's calling convention: Megatron-Bridge's ``prepare_forward_step_func``
    inspects the signature (``__wrapped__``) and injects its state only into steps that take one.
    """

    if _takes_state(forward_step):

        def forward_step_with_static_thd(state: Any, data_iterator: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
            return forward_step(state, _wrap(data_iterator, layout), model, *args, **kwargs)
    else:

        def forward_step_with_static_thd(data_iterator: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
            return forward_step(_wrap(data_iterator, layout), model, *args, **kwargs)

    functools.update_wrapper(forward_step_with_static_thd, forward_step)
    forward_step_with_static_thd.static_thd_layout = layout  # type: ignore[attr-defined]
    return forward_step_with_static_thd


def layout_from_config(cfg: ConfigContainer) -> StaticTHDLayout:
    """The static layout a ConfigContainer asks for: offline packing with ``pad_cu_seqlens``, sized from the pack
    metadata (``packed_metadata_path``) and the pack size, as Megatron-Bridge's own collate pads."""
    specs = getattr(cfg.dataset, "offline_packing_specs", None)
    if specs is None or not getattr(specs, "pad_cu_seqlens", False):
        raise UsageError(
            "the config asks for no static THD shapes: set dataset.offline_packing_specs.pad_cu_seqlens=True "
            "(offline packing, fixed width); in-batch packing cannot be CUDA-graphed in Megatron-Bridge 0.6.2"
        )
    if specs.packed_metadata_path is None:
        raise UsageError(
            "cfg.dataset.offline_packing_specs.packed_metadata_path is None; static cu_seqlens are "
            "sized from the pack metadata - set it to the <N>_metadata.jsonl written with the pack"
        )
    return StaticTHDLayout.from_pack_metadata(specs.packed_metadata_path, specs.packed_sequence_size)


def static_forward_step(cfg: ConfigContainer, forward_step: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """The forward step to pass to ``finetune()``/``pretrain()`` for ``cfg`` with static THD shapes.

    ``forward_step`` defaults to Megatron-Bridge's GPT step; the layout comes from :func:`layout_from_config`.
    """
    layout = layout_from_config(cfg)
    if forward_step is None:
        from megatron.bridge.training.gpt_step import forward_step
    return static_thd_forward_step(forward_step, layout)
