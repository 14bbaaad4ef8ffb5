"""Correction ``router_padding_mask``: Megatron-Bridge PR 5470 (commit 23743e2f7), backported to Megatron-Bridge 0.6.2
with Megatron-Core 0.19.2 and installed only there.

Megatron-Bridge 0.6.2's ``gpt_step._forward_step_common`` never passes ``padding_mask`` to ``GPTModel.forward``, so
Megatron-Core's ``TopKRouter.routing`` (transformer/moe/router.py:741-830) counts the alignment padding and the row
tail of packed rows in the aux loss, the z-loss and the expert-bias counts. Megatron-Core's mask is True at padding
(router.py:738 ``routing_map & ~padding_mask``, moe_utils.py:166 and :951 "True (padding) -> 0"; the docstrings say
the opposite). PR 5470 builds it in the collate; here it is built in the step from the same batch, with the PR's
rule:

- rows with physical offsets (``cu_seqlens_q_padded``: ``pad_seq_to_mult > 1``, in-batch CP/SP multiples): sequence
  ``k`` is real for its first ``cu_seqlens_q[k+1] - cu_seqlens_q[k]`` tokens from ``cu_seqlens_q_padded[k]``, the
  rest of its segment is padding;
- rows without them: the first ``token_count`` tokens are real (the collate's count of the row's sequences' tokens;
  ``cu_seqlens_q`` counts the row tail as one more sequence), else everything up to ``cu_seqlens_q[-1]``.

The loss mask is not the padding: prompt tokens are masked and real. What is wrapped, in ``gpt_step``, each a thin
wrapper of the original function object (``uninstall`` puts the originals back):

- ``get_batch_from_iterator``: the mask of the raw batch, moved to the device as the function moves device keys (so
  ``get_batch``'s CP split partitions it with the other [rows, tokens] tensors, as PR 5470's key is);
- ``_packed_metadata_for_forward``: keeps ``padding_mask`` in the metadata (PR 5470's change);
- ``_forward_step_common``: takes the mask out of the metadata before ``get_packed_seq_params`` and hands it to the
  model's forward (a forward pre-hook for the step's one ``model(**forward_args)`` call), scattered for sequence
  parallelism on stages that do not embed (PR 5470's ``_prepare_packed_padding_mask``);
- ``TopKRouter._apply_expert_bias``: flattens the mask to ``[tokens, 1]`` (PR 5470's patch for Megatron-LM issue
  6111: Megatron-Core 0.19.2 ands a ``[tokens]`` mask with the ``[tokens, experts]`` map).

Not covered (the equivalence rule says so; the step refuses them): full-iteration CUDA graphs (the mask is built from
the host batch), router-scoped Transformer Engine graphs (PR 5470 refuses them too), the schedule plan of
``overlap_moe_expert_parallel_comm`` (the PR's schedule-plan patch is not backported), quantile balancing
(Megatron-Core refuses a mask). Capacity is not corrected by the PR either: Megatron-Core 0.19.2's
``apply_router_token_dropping`` takes no mask.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import torch

from mbridge_seqpack.corrections import CORRECTIONS_ENV, CorrectionState, env_corrections
from mbridge_seqpack.errors import SeqpackError
from mbridge_seqpack.moe_layers import routed_experts
from mbridge_seqpack.switched import switched

__all__ = [
    "NAME",
    "WRITTEN_FOR",
    "CorrectionNotApplicableError",
    "padding_mask_of",
    "not_installable",
    "uncovered",
    "install",
    "uninstall",
    "installed",
    "is_wrapped",
    "request",
    "requested",
    "state",
]

NAME = "router_padding_mask"
#: the exact versions the backport was written for (Megatron-Bridge 0.6.2's gpt_step, Megatron-Core 0.19.2's router)
WRITTEN_FOR = {"megatron-bridge": "0.6.2", "megatron-core": "0.19.2"}
_FLAG = "__mbridge_seqpack_router_padding_mask__"
_WRAPPED = ("get_batch_from_iterator", "_packed_metadata_for_forward", "_forward_step_common")
_originals: dict[str, Any] | None = None
_requested: set[str] = set()


class CorrectionNotApplicableError(SeqpackError):
    """The step meets a configuration the correction does not cover (it would train uncorrected)."""


def _versions() -> dict[str, str]:
    from megatron.bridge import package_info as bridge
    from megatron.core import package_info as core

    return {"megatron-bridge": bridge.__version__, "megatron-core": core.__version__}


def not_installable() -> str | None:
    """Why the correction cannot be installed with the Megatron versions here; None where it can."""
    from packaging.version import Version

    found = _versions()
    if all(Version(found[k]).public == v for k, v in WRITTEN_FOR.items()):
        return None
    have = ", ".join(f"{k} {v}" for k, v in found.items())
    return f"{have} here; it is written for megatron-bridge 0.6.2 with megatron-core 0.19.2 only"


def _graph_modules(model: Any) -> set[str]:
    from megatron.bridge.utils.cuda_graph import cuda_graph_module_names

    return set(cuda_graph_module_names(model))


def uncovered(model: Any) -> str | None:
    """Why the correction does not hold for this model config (it would train uncorrected or fail); None: covered."""
    impl = str(getattr(model, "cuda_graph_impl", "none") or "none")
    if impl == "local":
        return "full-iteration CUDA graphs (cuda_graph_impl='local'): the mask is built from the host batch"
    if impl == "transformer_engine" and routed_experts(model) is not None:
        modules = _graph_modules(model)
        if not modules or modules & {"moe", "moe_router", "moe_preprocess"}:
            return (
                "Transformer Engine CUDA graphs that capture the router (cuda_graph_modules "
                f"{sorted(modules) or 'all'}): Megatron-Bridge PR 5470 refuses them too; capture attention only"
            )
    if getattr(model, "overlap_moe_expert_parallel_comm", False):
        return "overlap_moe_expert_parallel_comm: the step builds a schedule plan, which the backport does not reach"
    if getattr(model, "moe_router_load_balancing_type", None) == "quantile_balancing":
        return "moe_router_load_balancing_type='quantile_balancing': Megatron-Core refuses a padding mask there"
    return None


def _rows(values: torch.Tensor, rows: int) -> list[list[int]]:
    return [[int(v) for v in row] for row in values.reshape(rows, -1).tolist()]


def padding_mask_of(batch: Any) -> torch.Tensor | None:
    """``[rows, tokens]`` bool, True at padding, for a packed batch as the collate gives it (host tensors); None for
    a batch without ``cu_seqlens_q`` (unpacked, or the legacy ``cu_seqlens`` layout no 0.6.2 collate emits)."""
    if not isinstance(batch, dict) or batch.get("cu_seqlens_q") is None:
        return None
    tokens = next(
        (batch[k] for k in ("tokens", "input_ids", "labels") if isinstance(batch.get(k), torch.Tensor)), None
    )
    if tokens is None or tokens.dim() != 2:
        return None
    rows, width = tokens.shape
    logical = _rows(batch["cu_seqlens_q"], rows)
    padded_t = batch.get("cu_seqlens_q_padded")
    mask = torch.ones((rows, width), dtype=torch.bool)
    if padded_t is not None:
        for r, physical in enumerate(_rows(padded_t, rows)):
            for k in range(len(physical) - 1):
                start, end = physical[k], physical[k + 1]
                real = logical[r][k + 1] - logical[r][k]
                if real > end - start:
                    raise CorrectionNotApplicableError(
                        f"{NAME}: sequence {k} of row {r} has {real} tokens in a {end - start}-token segment "
                        f"(cu_seqlens_q {logical[r]}, cu_seqlens_q_padded {physical})"
                    )
                mask[r, start : start + real] = False
        return mask
    counts = batch.get("token_count")
    for r in range(rows):
        count = int(counts[r]) if isinstance(counts, (list, tuple, torch.Tensor)) else max(logical[r])
        mask[r, : min(count, width)] = False
    return mask


class _Peek:
    """The data iterator as ``get_batch_from_iterator`` reads it (``next``), keeping the raw batch."""

    def __init__(self, iterator: Any, seen: list[Any]) -> None:
        self._iterator, self._seen = iterator, seen

    def __iter__(self) -> "_Peek":
        return self

    def __next__(self) -> Any:
        batch = next(self._iterator)
        self._seen.append(batch)
        return batch


def _get_batch_from_iterator(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_batch_from_iterator(data_iterator: Any, *args: Any, **kwargs: Any) -> Any:
        seen: list[Any] = []
        batch = original(_Peek(data_iterator, seen), *args, **kwargs)
        mask = padding_mask_of(seen[0]) if seen else None
        if mask is not None:
            batch["padding_mask"] = mask.cuda(non_blocking=True)  # as the original moves its device keys
        return batch

    return get_batch_from_iterator


def _packed_metadata_for_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def packed_metadata_for_forward(batch: Any) -> Any:
        metadata = original(batch)
        if metadata is not None and batch.get("cu_seqlens_q") is not None and batch.get("padding_mask") is not None:
            metadata["padding_mask"] = batch["padding_mask"]
        return metadata

    return packed_metadata_for_forward


def model_padding_mask(mask: torch.Tensor, model: Any) -> torch.Tensor:
    """The mask as this model stage's forward takes it: scattered for sequence parallelism where the stage does not
    embed (or the model is hybrid), as PR 5470's ``_prepare_packed_padding_mask`` does; the embedding stage of a GPT
    model scatters it itself (gpt_model.py ``_preprocess``)."""
    from megatron.core import tensor_parallel
    from megatron.core.utils import get_model_config, unwrap_model

    config = get_model_config(model)
    uncovered_by = uncovered(config)
    if uncovered_by is not None:
        raise CorrectionNotApplicableError(f"{NAME} does not cover {uncovered_by}; unset {CORRECTIONS_ENV}")
    if getattr(config, "sequence_parallel", False) and (
        not getattr(unwrap_model(model), "pre_process", True) or getattr(config, "is_hybrid_model", False)
    ):
        from megatron.bridge.training.utils.pg_utils import get_pg_collection

        group = get_pg_collection(model).tp
        mask = (
            tensor_parallel.scatter_to_sequence_parallel_region(mask.transpose(0, 1).contiguous(), group=group)
            .transpose(0, 1)
            .contiguous()
        )
    return mask


def _forward_step_common(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward_step_common(
        state: Any, data_iterator: Any, model: Any, return_schedule_plan: bool = False, *, _get_batch_fn: Any = None
    ) -> Any:
        from megatron.bridge.training import gpt_step

        taken: list[torch.Tensor] = []
        get = _get_batch_fn or gpt_step.get_batch

        def get_batch(*args: Any, **kwargs: Any) -> Any:
            out = get(*args, **kwargs)
            metadata = out[5]
            if isinstance(metadata, dict) and "padding_mask" in metadata:
                if return_schedule_plan:
                    raise CorrectionNotApplicableError(
                        f"{NAME} does not reach the schedule plan of overlap_moe_expert_parallel_comm; unset "
                        f"{CORRECTIONS_ENV}"
                    )
                metadata = {k: v for k, v in metadata.items() if k != "padding_mask"}
                taken.append(out[5]["padding_mask"])
                out = (*out[:5], metadata)
            return out

        def hand_to_model(module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
            if not taken or kwargs.get("packed_seq_params") is None or kwargs.get("padding_mask") is not None:
                return None
            from megatron.core.utils import get_model_config

            if routed_experts(get_model_config(model)) is None:
                return None  # only the router reads it
            return args, {**kwargs, "padding_mask": model_padding_mask(taken[-1], model)}

        handle = model.register_forward_pre_hook(hand_to_model, with_kwargs=True)
        try:
            return original(state, data_iterator, model, return_schedule_plan, _get_batch_fn=get_batch)
        finally:
            handle.remove()

    return forward_step_common


def _apply_expert_bias(original: Callable[..., Any]) -> Callable[..., Any]:
    def apply_expert_bias(self: Any, routing_map: torch.Tensor, padding_mask: torch.Tensor | None = None) -> None:
        if padding_mask is not None:
            flat = padding_mask.reshape(-1)
            if flat.shape[0] != routing_map.shape[0]:
                raise CorrectionNotApplicableError(
                    f"{NAME}: padding_mask of {flat.shape[0]} tokens for a routing map of {routing_map.shape[0]}"
                )
            padding_mask = flat.unsqueeze(-1)
        original(self, routing_map, padding_mask=padding_mask)

    apply_expert_bias.__wrapped__ = original  # type: ignore[attr-defined]
    return apply_expert_bias


_MAKERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "get_batch_from_iterator": _get_batch_from_iterator,
    "_packed_metadata_for_forward": _packed_metadata_for_forward,
    "_forward_step_common": _forward_step_common,
}


def _targets() -> list[tuple[Any, str, Callable[..., Any]]]:
    from megatron.bridge.training import gpt_step
    from megatron.core.transformer.moe.router import TopKRouter

    return [(gpt_step, name, maker) for name, maker in _MAKERS.items()] + [
        (TopKRouter, "_apply_expert_bias", _apply_expert_bias)
    ]


def is_wrapped() -> bool:
    """Whether every wrapped function is this correction's wrapper right now."""
    return all(getattr(getattr(owner, name), _FLAG, False) for owner, name, _ in _targets())


def install() -> None:
    """Wrap the step's functions and the router's expert-bias update; idempotent. Raises
    :class:`CorrectionNotApplicableError` on other Megatron versions (``not_installable`` says why)."""
    global _originals
    if _originals is not None:
        return
    why = not_installable()
    if why is not None:
        raise CorrectionNotApplicableError(f"{NAME} cannot be installed: {why}")
    originals = {}
    for owner, name, maker in _targets():
        current = owner.__dict__[name]
        while getattr(current, _FLAG, False):  # a reloaded module left a wrapper behind
            current = current.__wrapped__
        originals[(owner, name)] = current
        wrapper = maker(current)
        setattr(wrapper, _FLAG, True)
        setattr(owner, name, wrapper)
    _originals = originals


def uninstall() -> None:
    """Put back the exact original functions; a no-op when not installed."""
    global _originals
    if _originals is None:
        return
    for (owner, name), original in _originals.items():
        setattr(owner, name, original)
    _originals = None


def installed(on: bool) -> contextlib.AbstractContextManager[None]:
    """The correction on (``on``) or off for the duration; the previous state after."""
    return switched(on, lambda: _originals is not None, install, uninstall)


def request(names: tuple[str, ...]) -> None:
    """What ``mbridge_seqpack.install(corrections=...)`` asked for (kept so ``check`` can say what became of it)."""
    _requested.clear()
    _requested.update(names)


def requested() -> bool:
    """Named by ``install(corrections=...)`` or by ``MBRIDGE_SEQPACK_CORRECTIONS``."""
    return NAME in _requested or NAME in env_corrections()


def state() -> CorrectionState:
    """Installed here; requested and installed by the launched process; requested but not installable on these
    versions, or not installed at launch (the plugin is not turned on there); or off."""
    if _originals is not None and is_wrapped():
        return CorrectionState(NAME, "installed")
    if not requested():
        return CorrectionState(NAME, "off")
    why = not_installable()
    if why is not None:
        return CorrectionState(NAME, "not_installable", why)
    if _originals is not None:
        return CorrectionState(NAME, "not_launched", "installed, then replaced (gpt_step reloaded or reassigned)")
    from mbridge_seqpack.modes import ACTIVE_MODES, MODE_ENV, env_mode
    from mbridge_seqpack.thd.inject import AUTOLOAD_PTH, autoload_present

    if env_mode() not in ACTIVE_MODES:
        return CorrectionState(NAME, "not_launched", f"the plugin installs it: set {MODE_ENV}=error too")
    if not autoload_present():
        return CorrectionState(NAME, "not_launched", f"this environment has no {AUTOLOAD_PTH}")
    return CorrectionState(NAME, "launch")
