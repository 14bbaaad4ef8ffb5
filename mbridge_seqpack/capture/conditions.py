"""The features of a config that put host reads into a CUDA graph over packed rows, each a probe the capture-safety
run turns on alone over a baseline with none: how the probe sets it, how a user's config shows it, and what removes it.

A feature becomes a *condition* only where its run adds host reads to the baseline's (computed, :mod:`verdicts`); a
feature whose run adds none is certified capture-safe (fused RoPE, fixed-width alignment padding, per-token loss,
overlapped grad reduction, drop-and-pad MoE). The probe's own settings are the fields it turns on; the fix either
turns the feature off (a field the user can change without changing the model) or, where the feature is the model
itself (a hybrid model's ``seq_idx``, MTP, dropless MoE), leaves full-iteration graphs for TE per-layer graphs of a
scope the TE run certifies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from mbridge_seqpack.moe_layers import MLP_SYMBOL, MOE_SYMBOL, hybrid_pattern, moe_layers, routed_experts

__all__ = [
    "Probe",
    "FULL_ITERATION_PROBES",
    "BASELINE",
    "NO_INJECTION",
    "MOE_DISPATCHERS",
    "MOE_MODES",
    "probe_named",
    "model_layer_kinds",
    "moe_kind",
    "moe_variant_settings",
]

BASELINE = "baseline"
NO_INJECTION = "no_injection"
LEAVE = None  # a fix of None: the feature is the model; leave full-iteration graphs


def _m(cfg: Any, name: str, default: Any = None) -> Any:
    return getattr(cfg.model, name, default)


def _rope(cfg: Any) -> bool:
    return _m(cfg, "position_embedding_type") in ("rope", "yarn", "mrope")


def _timing(cfg: Any) -> int:
    return int(getattr(getattr(cfg, "logger", None), "timing_log_level", 0) or 0)


@dataclass(frozen=True)
class Probe:
    """One feature: the run that turns it on (``settings``, dotted paths on the probe config, as
    :func:`iteration.probe_config` applies them), whether a user's ``cfg`` has it, its fields there, and the fix that
    turns it off (``None``: leave full-iteration graphs)."""

    name: str
    title: str
    settings: dict[str, Any]
    present: Callable[[Any], bool]
    fields: Callable[[Any], dict[str, Any]]
    fix: Callable[[Any], dict[str, Any]] | None = LEAVE
    why_leave: str = ""
    fix_text: str = ""  # the fix in words, for the docs


def _moe_settings(dispatcher: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The probe model's small MoE (4 experts, top-2, fp64 router) on ``dispatcher``, plus ``extra``."""
    return {
        "model.num_moe_experts": 4,
        "model.moe_ffn_hidden_size": 32,
        "model.moe_router_topk": 2,
        "model.moe_router_dtype": "fp64",
        "model.moe_token_dispatcher_type": dispatcher,
        **(extra or {}),
    }


def _check_switch(name: str, title: str, path: str) -> Probe:
    """A check the captured step runs while the boolean field ``path`` is on (on in the probe run); the fix turns it
    off."""
    section, field = path.split(".")
    return Probe(
        name,
        f"{title} ({path}=True)",
        {path: True},
        lambda cfg: bool(getattr(getattr(cfg, section, None), field, False)),
        lambda cfg: {path: True},
        lambda cfg: {path: False},
        fix_text=f"`{path}=false`",
    )


#: the token dispatchers a MoE config may name (``flex`` split by its backend: DeepEP, Megatron-Core's default, and
#: HybridEP), and the capacity modes: dropless (no capacity factor), capacity (a factor, tokens dropped, no padding)
#: and drop-and-pad (a factor, every expert's input padded to capacity)
MOE_DISPATCHERS = ("alltoall", "allgather", "flex", "flex_hybridep")
MOE_MODES = ("dropless", "capacity", "drop_and_pad")
_MODE_SETTINGS: dict[str, dict[str, Any]] = {
    "dropless": {},
    "capacity": {"model.moe_expert_capacity_factor": 1.0},
    "drop_and_pad": {"model.moe_expert_capacity_factor": 1.0, "model.moe_pad_expert_input_to_capacity": True},
}
_MODE_TITLE = {
    "dropless": "dropless MoE",
    "capacity": "capacity-limited MoE (a capacity factor, no padding to capacity)",
    "drop_and_pad": "drop-and-pad MoE (capacity factor, padded to capacity)",
}
_MODE_LEAVE = {
    "dropless": "dropless routing sizes the dispatch from token counts read on the host (drop-and-pad capacity "
    "routing does not, but changes which tokens train)",
    "capacity": "capacity routing without padding still sizes the dispatch from token counts read on the host "
    "(padding to capacity, moe_pad_expert_input_to_capacity=True, does not, but changes what the experts see)",
    "drop_and_pad": "the dispatcher reads token counts on the host even with drop-and-pad",
}


def moe_dispatcher(cfg: Any) -> str:
    """The config's dispatcher as :data:`MOE_DISPATCHERS` names it."""
    dispatcher = _m(cfg, "moe_token_dispatcher_type", "allgather")
    if dispatcher == "flex" and _m(cfg, "moe_flex_dispatcher_backend", "deepep") == "hybridep":
        return "flex_hybridep"
    return str(dispatcher)


def moe_mode(cfg: Any) -> str:
    """The config's capacity mode (Megatron-Core reads a negative capacity factor as none)."""
    factor = _m(cfg, "moe_expert_capacity_factor")
    if factor is None or factor < 0:
        return "dropless"
    return "drop_and_pad" if _m(cfg, "moe_pad_expert_input_to_capacity", False) else "capacity"


def moe_kind(cfg: Any) -> str:
    """The MoE layer kind of a config as the TE-scope runs key it: ``moe:<dispatcher>:<mode>``."""
    return f"moe:{moe_dispatcher(cfg)}:{moe_mode(cfg)}"


def moe_variant_settings(dispatcher: str, mode: str) -> dict[str, Any]:
    """The probe model's small MoE on ``dispatcher`` in ``mode``."""
    extra = dict(_MODE_SETTINGS[mode])
    if dispatcher == "flex_hybridep":
        extra["model.moe_flex_dispatcher_backend"] = "hybridep"
    return _moe_settings("flex" if dispatcher.startswith("flex") else dispatcher, extra)


def _moe_fix(dispatcher: str, mode: str) -> Callable[[Any], dict[str, Any]] | None:
    """Drop-and-pad on another dispatcher than alltoall: switch to alltoall (the same routing, another
    communication pattern; its drop-and-pad run is computed capture-safe, else the rule never proposes it)."""
    if mode != "drop_and_pad" or dispatcher == "alltoall":
        return LEAVE
    return lambda cfg: {"model.moe_token_dispatcher_type": "alltoall"}


def _moe_probe(dispatcher: str, mode: str) -> Probe:
    shown = "flex (HybridEP)" if dispatcher == "flex_hybridep" else dispatcher
    return Probe(
        f"moe_{dispatcher}_{mode}",
        f"{_MODE_TITLE[mode]} with the {shown} dispatcher",
        moe_variant_settings(dispatcher, mode),
        lambda cfg: routed_experts(cfg.model) is not None and moe_kind(cfg) == f"moe:{dispatcher}:{mode}",
        lambda cfg: {
            "model.moe_token_dispatcher_type": _m(cfg, "moe_token_dispatcher_type"),
            "model.moe_expert_capacity_factor": _m(cfg, "moe_expert_capacity_factor"),
            "model.moe_pad_expert_input_to_capacity": bool(_m(cfg, "moe_pad_expert_input_to_capacity", False)),
        },
        _moe_fix(dispatcher, mode),
        why_leave=_MODE_LEAVE[mode],
        fix_text="`model.moe_token_dispatcher_type=alltoall`" if _moe_fix(dispatcher, mode) else "",
    )


#: one probe per (dispatcher, capacity mode): the features a MoE config is made of, derived from its fields
_MOE_PROBES = tuple(_moe_probe(d, m) for d in MOE_DISPATCHERS for m in MOE_MODES)


FULL_ITERATION_PROBES: tuple[Probe, ...] = (
    Probe(
        "rope_unfused",
        "non-fused THD RoPE (model.apply_rope_fusion=False)",
        {"model.position_embedding_type": "rope", "model.apply_rope_fusion": False},
        lambda cfg: _rope(cfg) and not _m(cfg, "apply_rope_fusion", False),
        lambda cfg: {
            "model.position_embedding_type": _m(cfg, "position_embedding_type"),
            "model.apply_rope_fusion": _m(cfg, "apply_rope_fusion", False),
        },
        # fused THD RoPE takes no mscale (yarn) and MLA has its own fused kernels: only plain RoPE is switched
        lambda cfg: (
            {"model.apply_rope_fusion": True}
            if _m(cfg, "position_embedding_type") == "rope" and not _m(cfg, "multi_latent_attention", False)
            else None
        ),
        fix_text="`model.apply_rope_fusion=true` (plain RoPE; yarn and MLA leave full-iteration graphs)",
    ),
    Probe(
        "rope_fused",
        "fused THD RoPE (model.apply_rope_fusion=True)",
        {"model.position_embedding_type": "rope", "model.apply_rope_fusion": True},
        lambda cfg: _rope(cfg) and bool(_m(cfg, "apply_rope_fusion", False)),
        lambda cfg: {"model.apply_rope_fusion": True},
    ),
    Probe(
        "aligned",
        "sequences aligned to pad_seq_to_mult > 1 (cu_seqlens_padded)",
        {"dataset.offline_packing_specs.pad_seq_to_mult": 8},
        lambda cfg: int(getattr(getattr(cfg.dataset, "offline_packing_specs", None), "pad_seq_to_mult", 1) or 1) > 1,
        lambda cfg: {
            "dataset.offline_packing_specs.pad_seq_to_mult": cfg.dataset.offline_packing_specs.pad_seq_to_mult
        },
    ),
    _check_switch("nan_grad_check", "DDP NaN/Inf check of each grad bucket", "ddp.check_for_nan_in_grad"),
    _check_switch("large_grad_check", "DDP large-gradient check", "ddp.check_for_large_grads"),
    _check_switch(
        "spiky_loss_check", "spiky-loss check in the loss function", "rerun_state_machine.check_for_spiky_loss"
    ),
    Probe(
        "timers_level_1",
        "Megatron timers at logger.timing_log_level=1",
        {"logger.timing_log_level": 1},
        lambda cfg: _timing(cfg) == 1,
        lambda cfg: {"logger.timing_log_level": _timing(cfg)},
        lambda cfg: {"logger.timing_log_level": 0},
        fix_text="`logger.timing_log_level=0`",
    ),
    Probe(
        "timers_level_2",
        "Megatron timers at logger.timing_log_level=2",
        {"logger.timing_log_level": 2},
        lambda cfg: _timing(cfg) >= 2,
        lambda cfg: {"logger.timing_log_level": _timing(cfg)},
        lambda cfg: {"logger.timing_log_level": 0},
        fix_text="`logger.timing_log_level=0`",
    ),
    Probe(
        "hybrid_seq_idx",
        "a hybrid (Mamba) model: Megatron-Bridge's step sets total_tokens, so PackedSeqParams computes seq_idx",
        {"model.is_hybrid_model": True},
        lambda cfg: bool(_m(cfg, "is_hybrid_model", False)),
        lambda cfg: {"model.is_hybrid_model": True},
        why_leave="the model is hybrid; nothing in the config removes the seq_idx computation from the step",
    ),
    Probe(
        "mtp_packed_roll",
        "multi-token prediction over packed rows (model.mtp_num_layers > 0)",
        {"model.mtp_num_layers": 1},
        lambda cfg: int(_m(cfg, "mtp_num_layers", 0) or 0) > 0,
        lambda cfg: {"model.mtp_num_layers": _m(cfg, "mtp_num_layers")},
        why_leave="MTP is part of the model; its packed roll reads sequence boundaries on the host",
    ),
    *_MOE_PROBES,
    Probe(
        "per_token_loss",
        "per-token loss (model.calculate_per_token_loss=True: token counts all-reduced in finalize_model_grads)",
        {"model.calculate_per_token_loss": True},
        lambda cfg: bool(_m(cfg, "calculate_per_token_loss", False)),
        lambda cfg: {"model.calculate_per_token_loss": True},
    ),
    Probe(
        "overlap_grad_reduce",
        "overlapped grad reduction (ddp.overlap_grad_reduce=True: bucket syncs from backward hooks)",
        {"ddp.overlap_grad_reduce": True},
        lambda cfg: bool(getattr(cfg.ddp, "overlap_grad_reduce", False)),
        lambda cfg: {"ddp.overlap_grad_reduce": True},
    ),
)


def probe_named(name: str) -> Probe:
    return next(p for p in FULL_ITERATION_PROBES if p.name == name)


#: hybrid layer symbols (Megatron-Core's LayerSymbols) -> the layer kinds the TE-scope run builds
_HYBRID_SYMBOLS = {"M": "mamba", "*": "attention", MLP_SYMBOL: "mlp_layer", MOE_SYMBOL: "moe"}


def model_layer_kinds(cfg: Any) -> set[str]:
    """The layer kinds a config's model is made of, as the TE-scope run names them: ``dense`` / MoE
    ``TransformerLayer`` for GPT models; ``mamba`` / ``attention`` / ``mlp_layer`` / MoE for hybrid patterns (other
    symbols as themselves: kinds the run does not build). A MoE layer is keyed by the config's dispatcher and capacity
    mode (:func:`moe_kind`), each run on its own; which GPT layers are MoE is ``mbridge_seqpack/moe_layers.py``'s."""
    pattern = hybrid_pattern(cfg.model)
    if pattern:
        kinds = {_HYBRID_SYMBOLS.get(ch, ch) for ch in pattern if ch not in "|/ "}
        return {moe_kind(cfg) if kind == "moe" else kind for kind in kinds}
    layers = moe_layers(cfg.model)
    return ({moe_kind(cfg)} if layers.experts is not None else set()) | ({"dense"} if layers.dense_mlp else set())
