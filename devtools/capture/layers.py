"""TE per-layer CUDA graphs over packed rows, run on CPU: does each layer kind's replay get tensor-only inputs, and
does the part a scope captures read the host?

``cuda_graph_impl="transformer_engine"`` graphs each layer Megatron-Core's ``_layer_is_graphable`` selects for the
scope (``cuda_graph_modules``). On replay, ``GraphableMegatronModule.__call__`` sends the layer through its
``_te_cuda_graph_replay``, which asserts tensor-only inputs before it calls TE's graphed callable, and runs the rest
of the layer eagerly. Here a layer of each kind is built from Megatron-Core's classes, called by its real container
with Megatron-Bridge's packed ``PackedSeqParams``, and, where it is graphable, given a :class:`GraphStandIn` in place
of TE's graphed callable: it accepts what TE's ``Graphed.forward`` accepts (tensors; ``is_first_microbatch``) and
runs the layer's ``_te_cuda_graph_capture`` (the function TE captured) under the recorder. The outcome per
(scope module, layer kind) is *not graphed*, *asserts* (with Megatron's message and site) or *replays* (with the
host reads inside the graph).

Kinds and containers: ``dense`` and ``moe`` (``TransformerLayer`` with a dense MLP / a MoE layer) inside a
``GPTModel``'s ``TransformerBlock`` through Megatron-Bridge's whole ``gpt_step`` (iteration.py); ``mlp_layer``,
``mamba``, ``attention`` (``MLPLayer``, ``MambaLayer``, an attention-only ``TransformerLayer``) inside a
``HybridStack``, called as ``HybridModel.forward`` calls it. The Mamba mixer is Megatron's ``IdentityOp`` (its
``causal_conv1d`` / SSD kernels have no CPU path); the replay asserts before reaching it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from devtools.capture.recorder import HostReadRecorder
from mbridge_seqpack.capture.cpu_world import keeps_environment
from mbridge_seqpack.capture.verdicts import HostRead
from mbridge_seqpack.frames import site_of, traceback_site

__all__ = ["GraphStandIn", "ScopeRun", "run_gpt_scope", "run_hybrid_scope", "MODULES", "GPT_KINDS", "HYBRID_KINDS"]

#: Megatron-Core's CudaGraphModule names (``moe_preprocess`` only with ``moe_router``)
MODULES = ("attn", "mlp", "moe", "moe_router", "mamba")
GPT_KINDS = ("dense", "moe")
HYBRID_KINDS = {"attention": "*", "mlp_layer": "-", "mamba": "M", "moe_layer": "E"}


@dataclass
class ScopeRun:
    """One (scope, layer kind): whether the layer is graphed, what its replay did, the host reads in the graph."""

    graphed: bool
    #: "not graphed" | "asserts" | "replays" | "refused" (Megatron-Core refuses the scope for the model) | "not run"
    #: (the CPU world could not build or finish it: undetermined, with what stopped it)
    outcome: str
    message: str = ""
    site: str = ""
    reads: list[HostRead] = field(default_factory=list)
    non_tensor_inputs: list[str] = field(default_factory=list)


class GraphStandIn:
    """Stands for the callable TE's ``make_graphed_callables`` returns for one layer: takes tensors (and TE's
    ``is_first_microbatch`` flag), as ``Graphed.forward`` copies each input into its static buffer, and runs the
    layer's captured function (``_te_cuda_graph_capture``) with the recorder capturing and Megatron-Core's capture
    flag set, as ``TECudaGraphHelper`` sets it around the capture (``_set_capture_start``: the MoE layer then stops
    where the scope ends)."""

    def __init__(self, layer: Any, recorder: HostReadRecorder) -> None:
        self.layer, self.recorder = layer, recorder
        self.calls = 0
        self.non_tensor: list[str] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        named = {**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs}
        self.non_tensor += [
            f"{k}: {type(v).__name__}"
            for k, v in named.items()
            if v is not None and not isinstance(v, torch.Tensor) and k != "is_first_microbatch"
        ]
        from megatron.core.transformer.cuda_graphs import _set_capture_end, _set_capture_start

        kwargs = {k: v for k, v in kwargs.items() if k != "is_first_microbatch"}
        _set_capture_start()
        try:
            with self.recorder.capturing(True):
                return self.layer._te_cuda_graph_capture(*args, **kwargs)
        finally:
            _set_capture_end()


def _install_stand_ins(layers: Any, config: Any, recorder: HostReadRecorder) -> list[GraphStandIn]:
    from megatron.core.transformer.cuda_graphs import _layer_is_graphable

    stand_ins = []
    for layer in layers:
        if _layer_is_graphable(layer, config):
            stand_in = GraphStandIn(layer, recorder)
            layer.cuda_graphs = [stand_in]
            stand_ins.append(stand_in)
    return stand_ins


def _outcome(stand_ins: list[GraphStandIn], error: BaseException | None, recorder: HostReadRecorder) -> ScopeRun:
    from devtools.capture.iteration import unique_reads

    if not stand_ins:
        return ScopeRun(False, "not graphed")
    if error is not None:
        return ScopeRun(True, "asserts", str(error).split("\n")[0], traceback_site(error) or site_of([])[0])
    non_tensor = sorted({item for s in stand_ins for item in s.non_tensor})
    outcome = "asserts" if non_tensor else "replays"
    return ScopeRun(True, outcome, reads=unique_reads(recorder.reads), non_tensor_inputs=non_tensor)


def _scope_settings(modules: list[str]) -> dict[str, Any]:
    return {"model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_modules": list(modules)}


@keeps_environment
def run_gpt_scope(modules: list[str], kind: str) -> ScopeRun:
    """A ``GPTModel`` of ``kind`` layers through Megatron-Bridge's step, TE graphs on the ``modules`` scope:
    ``dense``; ``moe`` (alltoall, drop-and-pad when the scope holds ``moe``, as Megatron-Core requires: the matrix's
    MoE); ``moe:<dispatcher>:<mode>`` (that dispatcher and capacity mode, as a config sets them). A model the one-rank
    CPU world cannot build, or a TE kernel without a stand-in, gives ``not run`` with what stopped it."""
    from devtools.capture.iteration import first_line, packed_batches, probe_config
    from devtools.capture.kernels import kernel_stand_ins
    from devtools.capture.recorder import recording_world
    from mbridge_seqpack.capture.conditions import moe_variant_settings

    settings = _scope_settings(modules)
    if kind == "moe":
        settings.update(MOE_SETTINGS)
        if "moe" in modules:
            settings.update(DROP_AND_PAD)
    elif kind.startswith("moe:"):
        _, dispatcher, mode = kind.split(":")
        settings.update(moe_variant_settings(dispatcher, mode))
    try:
        cfg = probe_config(settings)
        cfg.model.finalize()
    except (AssertionError, ValueError) as exc:
        return ScopeRun(False, "refused", first_line(exc), traceback_site(exc) or "")
    batches = packed_batches(1)
    stood_in: list[str] = []
    with recording_world() as recorder, kernel_stand_ins(recorder, stood_in):
        return _gpt_scope_in_world(cfg, batches, recorder)


def _gpt_scope_in_world(cfg: Any, batches: list[Any], recorder: HostReadRecorder) -> ScopeRun:
    """The build and step of :func:`run_gpt_scope`, inside its world: what they make (the model, a raise's frames)
    is this frame's, gone when it returns, so the world's collection frees it with its process groups."""
    from devtools.capture.iteration import build_step, first_line, forward_backward, kernel_boundary

    try:
        parts = build_step(cfg, recorder)
    except (AssertionError, ImportError) as exc:  # the one-rank CPU world lacks it (flex: TP x EP > 1, HybridEP)
        return ScopeRun(False, "not run", first_line(exc), traceback_site(exc) or "")
    stand_ins = _install_stand_ins(parts.model.module.decoder.layers, cfg.model, recorder)
    error = None
    if stand_ins:
        try:
            forward_backward(parts, iter(batches), len(batches))
        except AssertionError as exc:
            error = exc
        except Exception as exc:
            site = kernel_boundary(exc)
            if site is None:
                raise
            return ScopeRun(True, "not run", first_line(exc), site)
    return _outcome(stand_ins, error, recorder)


MOE_SETTINGS: dict[str, Any] = {
    "model.num_moe_experts": 4,
    "model.moe_ffn_hidden_size": 32,
    "model.moe_router_topk": 2,
    "model.moe_token_dispatcher_type": "alltoall",
    # Megatron-Core's RouterGatingLinearFunction: fp64 takes its torch.matmul branch, the other dtypes TE's GEMM
    # (a kernel with no CPU path); neither reads the host
    "model.moe_router_dtype": "fp64",
}
DROP_AND_PAD: dict[str, Any] = {
    "model.moe_expert_capacity_factor": 1.0,
    "model.moe_pad_expert_input_to_capacity": True,
}


def _hybrid_submodules() -> Any:
    """``HybridStackSubmodules`` of Megatron-Core's own (non-TE) modules: the layer classes of ``hybrid_stack_spec``
    with local linears and norms; the Mamba mixer and the core attention left out (``IdentityOp``)."""
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_mlp_module_spec
    from megatron.core.models.hybrid.hybrid_block import HybridStackSubmodules
    from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
    from megatron.core.ssm.mlp_layer import MLPLayer
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_layer import TransformerLayerSubmodules

    attention = get_gpt_layer_local_spec()
    attention.submodules.self_attention.submodules.core_attention = IdentityOp
    attention.submodules.mlp = IdentityOp
    attention.submodules.pre_mlp_layernorm = IdentityOp
    return HybridStackSubmodules(
        mamba_layer=ModuleSpec(
            module=MambaLayer,
            submodules=MambaLayerSubmodules(norm=WrappedTorchNorm, mixer=IdentityOp, mamba_bda=get_bias_dropout_add),
        ),
        attention_layer=attention,
        mlp_layer=ModuleSpec(
            module=MLPLayer,
            submodules=TransformerLayerSubmodules(
                pre_mlp_layernorm=WrappedTorchNorm,
                mlp=get_mlp_module_spec(use_te=False),
                mlp_bda=get_bias_dropout_add,
            ),
        ),
    )


@keeps_environment
def run_hybrid_scope(modules: list[str], kind: str) -> ScopeRun:
    """A ``HybridStack`` of one ``kind`` layer, called as ``HybridModel.forward`` calls its decoder with
    Megatron-Bridge's packed params (``get_packed_seq_params`` with ``total_tokens``, as its step sets for hybrid
    models), TE graphs on the ``modules`` scope."""
    from devtools.capture.iteration import packed_batches, probe_config
    from devtools.capture.recorder import recording_world

    settings = {**_scope_settings(modules), "model.is_hybrid_model": True}
    try:
        cfg = probe_config(settings)
        cfg.model.finalize()
    except (AssertionError, ValueError) as exc:
        return ScopeRun(False, "refused", str(exc).split("\n")[0])
    batch = packed_batches(1)[0]
    with recording_world() as recorder:
        return _hybrid_scope_in_world(cfg, kind, batch, recorder)


def _hybrid_scope_in_world(cfg: Any, kind: str, batch: dict[str, Any], recorder: HostReadRecorder) -> ScopeRun:
    """The stack and its call of :func:`run_hybrid_scope`, inside its world (what they make is freed with this
    frame, before the world's collection)."""
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params
    from megatron.core.models.hybrid.hybrid_block import HybridStack
    from megatron.core.process_groups_config import ProcessGroupCollection

    from devtools.capture.iteration import WIDTH

    stack = HybridStack(
        cfg.model,
        _hybrid_submodules(),
        layer_type_list=[HYBRID_KINDS[kind]],
        post_process=False,
        pg_collection=ProcessGroupCollection.use_mpu_process_groups(),
    )
    for tensor in [*stack.parameters(), *stack.buffers()]:
        recorder.on_device(tensor)
    stand_ins = _install_stand_ins(stack.layers, cfg.model, recorder)
    error = None
    if stand_ins:
        metadata = {
            k: (v.cuda() if isinstance(v, torch.Tensor) and k.startswith("cu_seqlens") else v)
            for k, v in batch.items()
            if k.startswith(("cu_seqlens", "max_seqlen"))
        }
        metadata["total_tokens"] = WIDTH
        params = get_packed_seq_params(metadata)
        hidden = recorder.on_device(torch.randn(WIDTH, 1, cfg.model.hidden_size, requires_grad=True))
        try:
            stack(
                hidden_states=hidden,
                attention_mask=None,
                inference_context=None,
                rotary_pos_emb=None,
                packed_seq_params=params,
                padding_mask=None,
            )
        except AssertionError as exc:
            error = exc
    return _outcome(stand_ins, error, recorder)
