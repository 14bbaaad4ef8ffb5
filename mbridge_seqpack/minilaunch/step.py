"""One training step of the config's own step function, packed and truly unpacked, through the constructed model.

The model is the config's provider at CPU widths (``shrink.py``), built by ``provide_distributed_model`` and wrapped
in Megatron-Core's DDP as ``build.py`` builds it, with what only a GPU runs stood in, each said in the verdict:

- Megatron-Core's local layer modules in place of Transformer Engine's (TE's GEMMs and norms are CUDA kernels), the
  provider's own choice of the rest of the spec kept; core attention by ``attention.ReferenceCoreAttention``, which
  reads the ``PackedSeqParams`` the step hands the layer as TE's API reads them;
- float32 parameters, no dropout (the same values must meet the same weights packed and unpacked), and TE's fused
  kernels off (RoPE fusion, the fused cross entropy, gradient-accumulation fusion, grouped GEMM, permute fusion).

The data are the check's sequences through Megatron-Bridge's own prep and collate, packed as the config packs and one
per row unpacked (``equivalence.batches``); each micro batch runs through Megatron-Bridge's ``gpt_step.forward_step``
(``get_batch``, ``get_packed_seq_params``, the model's embedding, position ids, RoPE, attention, MLP or MoE, output
layer and cross entropy). Compared per trained token: the loss the model returns. A step that raises in one run and
not the other is a difference too; one that cannot run here (a TE-only module, CP > 1, a VLM step) is not run.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterator, Literal

import torch

from mbridge_seqpack.capture.cpu_world import keeps_environment
from mbridge_seqpack.minilaunch.attention import NotReproduced
from mbridge_seqpack.minilaunch.build import classify, device_stand_ins, launch_arguments

__all__ = ["StepOutcome", "packed_step", "forget_steps", "TOLERANCE", "INIT_STD"]

#: the largest per-token loss difference taken as float32 rounding (the losses are about ln(vocab) ~ 5.5)
TOLERANCE = 1e-4
#: weights drawn wide enough that attention depends on which tokens and positions it sees
INIT_STD = 0.5
_CACHE_SIZE = 256
_cache: OrderedDict[str, StepOutcome] = OrderedDict()

#: what the step's copy changes, each because only a GPU (or the comparison) needs it otherwise
STOOD_IN: dict[str, Any] = {
    "params_dtype": torch.float32,
    "bf16": False,
    "fp16": False,
    "fp8": None,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "apply_rope_fusion": False,
    "cross_entropy_loss_fusion": False,
    "gradient_accumulation_fusion": False,
    "masked_softmax_fusion": False,
    "moe_grouped_gemm": False,
    "moe_permute_fusion": False,
    "moe_router_fusion": False,
    "init_method_std": INIT_STD,
    "sequence_parallel": False,  # a one-rank world has no sequence to split (the torch norm refuses the flag)
    "tp_comm_overlap": False,
}
STOOD_IN_WORDS = (
    "Megatron-Core's local layer modules for TE's, core attention by a reference reading PackedSeqParams as TE does "
    f"(minilaunch/attention.py); float32, no dropout, TE's fused kernels off, weights drawn at std {INIT_STD}"
)


@dataclass(frozen=True)
class StepOutcome:
    """``compared`` (``differences`` in words, empty where every trained token's loss agrees; ``compared`` tokens)
    or ``not_run`` (``why``)."""

    state: Literal["compared", "not_run"]
    differences: tuple[str, ...] = ()
    compared: int = 0
    why: str = ""


def forget_steps() -> None:
    """Empty the cache (tests that change Megatron's functions between checks)."""
    _cache.clear()


def _not_run(why: str) -> StepOutcome:
    return StepOutcome("not_run", why=why)


def out_of_scope(cfg: Any) -> str | None:
    """Why the step does not cover ``cfg`` (see ``minilaunch.STEP_SCOPE``), or None."""
    from megatron.bridge.models import gpt_provider

    model = cfg.model
    own = type(model).provide is not gpt_provider.GPTModelProvider.provide
    if not isinstance(model, gpt_provider.GPTModelProvider) or own:
        return f"{type(model).__name__} builds its own model class"
    specs = (
        gpt_provider.default_layer_spec,
        gpt_provider.transformer_engine_layer_spec,
        gpt_provider.local_layer_spec,
    )
    checks = {
        "a layer spec of its own": getattr(model, "transformer_layer_spec", None) not in specs,
        "the full TE layer spec": getattr(model, "use_transformer_engine_full_layer_spec", False),
        "context parallelism": (getattr(model, "context_parallel_size", 1) or 1) > 1,
        "virtual pipeline stages": bool(getattr(model, "virtual_pipeline_model_parallel_size", None)),
        "MTP": bool(getattr(model, "mtp_num_layers", None)),
        "the flex dispatcher": getattr(model, "moe_token_dispatcher_type", "") == "flex",
        "multi-latent attention": bool(getattr(model, "multi_latent_attention", False)),
    }
    named = [name for name, hit in checks.items() if hit]
    return ", ".join(named) if named else None


def _step_provider(cfg: Any) -> Any:
    """The step's copy of the provider: CPU widths, Megatron-Core's local layer spec, the stand-ins."""
    from megatron.bridge.models import gpt_provider

    from mbridge_seqpack.minilaunch.shrink import shrunk_provider

    provider = shrunk_provider(cfg.model).provider
    provider.transformer_layer_spec = gpt_provider.local_layer_spec
    for name, value in STOOD_IN.items():
        if hasattr(provider, name):
            setattr(provider, name, value)
    if getattr(cfg.rng, "te_rng_tracker", False):
        provider.use_te_rng_tracker = True
    return provider


@contextlib.contextmanager
def _torch_paths() -> Iterator[None]:
    """Megatron-Core's own torch paths where it has one beside TE's CUDA-only kernel: the transformer block's final
    norm as ``WrappedTorchNorm`` (``transformer_block.LayerNormImpl``, what a layer spec's block gets) and the MoE
    router's gating GEMM as ``torch.mm`` (``moe_utils.te_general_gemm`` absent)."""
    from megatron.core.transformer import transformer_block
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    saved = transformer_block.LayerNormImpl, moe_utils.te_general_gemm
    transformer_block.LayerNormImpl, moe_utils.te_general_gemm = WrappedTorchNorm, None
    try:
        yield
    finally:
        transformer_block.LayerNormImpl, moe_utils.te_general_gemm = saved


def _reference_attention(model: Any) -> None:
    """Every layer's core attention replaced by the reference (scale and window as the layer's own module has them)."""
    from megatron.core.transformer.attention import Attention
    from megatron.core.transformer.utils import is_layer_window_attention

    from mbridge_seqpack.minilaunch.attention import ReferenceCoreAttention

    for module in model.modules():
        if not isinstance(module, Attention):
            continue
        core, config = module.core_attention, module.config
        scale = getattr(core, "softmax_scale", None)
        if scale is not None and config.apply_query_key_layer_scaling:
            scale *= core.layer_number
        reference = ReferenceCoreAttention(config, scale, config.kv_channels)
        if not is_layer_window_attention(config.window_size, config.window_attn_skip_freq, module.layer_number):
            reference.window = None
        module.core_attention = reference


def _forward(state: Any, model: Any, batches: list[dict[str, Any]]) -> list[torch.Tensor] | BaseException:
    """Megatron-Bridge's forward step on each micro batch: the per-token losses the model returns, or the raise."""
    from megatron.bridge.training import gpt_step

    outputs = []
    try:
        for batch in batches:
            with torch.no_grad():
                output, _ = gpt_step.forward_step(state, iter([copy.copy(batch)]), model)
            outputs.append(output.float())
    except Exception as exc:  # noqa: BLE001 - the caller classifies it
        return exc
    return outputs


def _compare(
    setup: Any, packed: Any, unpacked: Any, out_p: list[torch.Tensor], out_u: list[torch.Tensor]
) -> StepOutcome:
    bad: list[tuple[int, int, float, float]] = []
    total = 0
    for index, (p, u) in enumerate(zip(packed.placed, unpacked.placed)):
        mask_p = packed.batches[p.micro]["loss_mask"][p.row]
        mask_u = unpacked.batches[u.micro]["loss_mask"][u.row]
        for j in range(min(p.inputs, u.inputs)):
            if not (mask_p[p.start + j] and mask_u[u.start + j]):
                continue  # which tokens train is equivalence.labels' comparison
            total += 1
            lp = float(out_p[p.micro][p.row, p.start + j])
            lu = float(out_u[u.micro][u.row, u.start + j])
            if abs(lp - lu) > TOLERANCE * max(1.0, abs(lu)):
                bad.append((index, j, lp, lu))
    if not bad:
        return StepOutcome("compared", compared=total)
    index, j, lp, lu = bad[0]
    worst = max(abs(a - b) for _, _, a, b in bad)
    return StepOutcome(
        "compared",
        (
            f"{len(bad)} of {total} trained tokens' losses differ packed vs unpacked (largest difference {worst:.3g}; "
            f"e.g. sample {index + 1}, input position {j}: {lp:.4f} packed, {lu:.4f} unpacked)",
        ),
        compared=total,
    )


def _key(provider: Any, cfg: Any, setup: Any) -> str:
    text = repr((type(provider).__qualname__, provider, cfg.ddp, setup))
    return hashlib.sha256(text.encode()).hexdigest()


def packed_step(cfg: Any) -> StepOutcome | None:
    """The step's comparison for ``cfg`` (cached per distinct setting), or None where the config packs nothing or is
    outside ``minilaunch.STEP_SCOPE``."""
    import torch.distributed as dist

    from mbridge_seqpack.equivalence.setup import setup_of

    setup = setup_of(cfg)
    if setup is None or out_of_scope(cfg) is not None:
        return None
    if dist.is_available() and dist.is_initialized():
        return _not_run("torch.distributed is already initialized in this process (the step needs a world of its own)")
    provider = _step_provider(cfg)
    key = _key(provider, cfg, setup)
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    found = _run(cfg, provider, setup)
    _cache[key] = found
    while len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return found


@keeps_environment
def _run(cfg: Any, provider: Any, setup: Any) -> StepOutcome:
    from megatron.bridge.training.state import GlobalState
    from megatron.core.process_groups_config import ProcessGroupCollection

    from mbridge_seqpack.capture.cpu_world import cpu_world
    from mbridge_seqpack.equivalence.batches import packed_run, unpacked_run

    try:
        provider.finalize()
    except Exception as exc:  # noqa: BLE001
        return _not_run(f"the step's copy is refused by finalize() ({exc})")
    packed, unpacked = packed_run(setup), unpacked_run(setup)
    step_cfg = copy.copy(cfg)
    step_cfg.model = provider
    state = GlobalState()
    state.cfg = step_cfg
    provider.timers = state.timers
    outcome: StepOutcome
    with cpu_world(), device_stand_ins(), _torch_paths():
        try:
            (model,) = provider.provide_distributed_model(
                pg_collection=ProcessGroupCollection.use_mpu_process_groups(), **launch_arguments(cfg)
            )
            _reference_attention(model)
            model.eval()
            out_p, out_u = _forward(state, model, packed.batches), _forward(state, model, unpacked.batches)
            del model
        except Exception as exc:  # noqa: BLE001 - a construction failure is launch.model_build's verdict
            outcome = _not_run(f"the step's model could not be built here: {classify(exc).text}")
            exc.__traceback__ = None
        else:
            outcome = _outcome(setup, packed, unpacked, out_p, out_u)
            del out_p, out_u
    return outcome


def _outcome(setup: Any, packed: Any, unpacked: Any, out_p: Any, out_u: Any) -> StepOutcome:
    """The comparison, or what stopped a run: a raise of Megatron's in one run only is a difference; a request the
    reference attention does not reproduce, or a raise this machine causes, leaves the step not run."""
    for out in (out_p, out_u):
        if isinstance(out, NotReproduced):
            return _not_run(f"{out} (TE's attention is not reproduced for it)")
    raised = {
        name: classify(out) for name, out in (("packed", out_p), ("unpacked", out_u)) if isinstance(out, BaseException)
    }
    if not raised:
        return _compare(setup, packed, unpacked, out_p, out_u)
    if len(raised) == 2 or any(r.state != "refused" for r in raised.values()):
        return _not_run("; ".join(f"the {name} step stopped: {r.text} ({r.site})" for name, r in raised.items()))
    ((name, r),) = raised.items()
    return StepOutcome("compared", (f"the {name} step raises {r.text} ({r.site}); the other runs",))
