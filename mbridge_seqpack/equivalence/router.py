"""The MoE router over the packed micro batches: Megatron-Core's own ``TopKRouter`` (transformer/moe/router.py),
built from the config's router settings on CPU in the project's one-rank gloo world (capture/cpu_world.py).

Each token's router input is a fixed vector of its token id, so a sample's real tokens give the router the same
inputs packed and unpacked. The router runs twice per micro batch, as Megatron-Bridge 0.6.2 calls it (no
``padding_mask``: training/gpt_step.py never passes one, so ``MoELayer`` hands the router none) and on the real
tokens alone (what the unpacked samples give it without their own padding; the same as passing
``padding_mask``). Compared: the share of routed tokens that are padding, tokens per expert (the expert-bias counts
and the aux loss's load), the load-balancing loss and the z-loss the metrics tracker records, and real tokens the
capacity drops.

With the opt-in correction ``router_padding_mask`` in effect (corrections/router_padding.py, Megatron-Bridge PR 5470
backported), the first pass is the corrected step's: each micro batch goes through the wrapped
``gpt_step.get_batch_from_iterator`` and ``_packed_metadata_for_forward`` (the functions the correction installs, in
the CPU world), and the mask they hand on reaches the router as ``MoELayer.forward`` passes it (transposed to
``[s, b]``), with the correction's expert-bias patch on ``TopKRouter``. Counted then are the tokens the router's
terms count (the routing map outside the mask); the capacity still sees every token (Megatron-Core 0.19.2's
``apply_router_token_dropping`` takes no mask).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mbridge_seqpack.equivalence.batches import Run
from mbridge_seqpack.equivalence.sequences import VOCAB
from mbridge_seqpack.equivalence.setup import Router

__all__ = ["RouterEffect", "router_effect", "step_padding_mask"]

HIDDEN = 16


@dataclass(frozen=True)
class RouterEffect:
    """What padding does to the router over the check's packed rows."""

    routed: int  # tokens routed (rows of the routing map with an expert)
    routed_padding: int  # of those, padding
    load_shift: float  # sum |tokens per expert (as run) - (real tokens only)| / real routed assignments
    aux_loss: tuple[float, float] | None  # (as run, real tokens only), per unit coefficient
    z_loss: tuple[float, float] | None
    real_dropped: tuple[int, int] | None  # real tokens dropped by capacity (as run, real tokens only)
    corrected: bool = False  # the router got the padding mask of the correction router_padding_mask
    real_uncounted: int = 0  # real tokens the mask leaves out of the counts (none when the mask is right)

    @property
    def padding_share(self) -> float:
        return self.routed_padding / self.routed if self.routed else 0.0


def _config(router: Router) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    balancing, coeff = router.load_balancing_type, router.aux_loss_coeff
    return TransformerConfig(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=1,
        num_moe_experts=router.experts,
        moe_router_topk=router.topk,
        moe_router_score_function=router.score_function,
        moe_router_load_balancing_type=list(balancing) if isinstance(balancing, tuple) else balancing,
        moe_aux_loss_coeff=list(coeff) if isinstance(coeff, tuple) else coeff,
        moe_z_loss_coeff=router.z_loss_coeff,
        moe_router_enable_expert_bias=router.expert_bias,
        moe_expert_capacity_factor=router.capacity_factor,
        moe_token_drop_policy=router.drop_policy,
        moe_pad_expert_input_to_capacity=router.pad_to_capacity,
        moe_router_num_groups=router.num_groups,
        moe_router_group_topk=router.group_topk,
        moe_router_pre_softmax=router.pre_softmax,
        moe_router_topk_scaling_factor=router.topk_scaling_factor,
        calculate_per_token_loss=router.per_token_loss,
        moe_router_dtype="fp64",  # fp32/bf16 gating is TE's general_gemm (CUDA only); fp64 is a torch matmul
        add_bias_linear=False,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
    )


def _one_pass(
    config: Any, hidden: torch.Tensor, weight: torch.Tensor, padding_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """One router forward as ``MoELayer.route`` calls it (``padding_mask`` [s, b], True at padding, as
    ``MoELayer.forward`` hands it on); (routing map, tracked losses per unit coefficient)."""
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe import moe_logging
    from megatron.core.transformer.moe.router import TopKRouter

    router = TopKRouter(config, pg_collection=ProcessGroupCollection.use_mpu_process_groups())
    with torch.no_grad():
        router.weight.copy_(weight)
    router.set_layer_number(1)
    previous = moe_logging._MOE_METRICS_TRACKER
    tracker = moe_logging.MoEMetricsTracker()
    moe_logging.set_moe_metrics_tracker(tracker)
    try:
        _, routing_map = router(hidden.requires_grad_(), padding_mask)
    finally:
        moe_logging.set_moe_metrics_tracker(previous)
    losses = {name: float(entry.values[0]) for name, entry in tracker.metrics.items()}
    # the aux, sequence-aux and global-aux losses each record under their own *load_balancing_loss name
    losses["load_balancing_loss"] = sum(v for k, v in losses.items() if k.endswith("load_balancing_loss"))
    if router.local_tokens_per_expert is not None:
        losses["expert_bias_counts"] = float(router.local_tokens_per_expert.sum())
    return routing_map, losses


def step_padding_mask(batch: dict[str, Any]) -> torch.Tensor | None:
    """The padding mask the corrected step hands the model for this raw micro batch ([rows, tokens], True at
    padding): the batch through ``gpt_step.get_batch_from_iterator`` and ``_packed_metadata_for_forward`` as the
    correction wraps them (installed for the call where it is not; inside the CPU world, whose ``.cuda()`` stands in
    for the device). GPTModel asserts the mask has the tokens' shape (gpt_model.py ``_preprocess``)."""
    from megatron.bridge.training import gpt_step

    from mbridge_seqpack.corrections import router_padding

    with router_padding.installed(True):
        got = gpt_step.get_batch_from_iterator(iter([batch]), is_first_pp_stage=True, is_last_pp_stage=True)
        metadata = gpt_step._packed_metadata_for_forward(got)
    mask = None if metadata is None else metadata.get("padding_mask")
    if mask is not None and tuple(mask.shape) != tuple(batch["tokens"].shape):
        raise RuntimeError(f"padding_mask {tuple(mask.shape)} for tokens {tuple(batch['tokens'].shape)}")  # a bug
    return mask


def router_effect(router: Router, run: Run) -> RouterEffect:
    """Route every packed micro batch with and without its padding; the differences, summed over micro batches."""
    import contextlib

    from mbridge_seqpack.capture.cpu_world import cpu_world
    from mbridge_seqpack.corrections import router_padding

    generator = torch.Generator().manual_seed(7)
    table = torch.randn((VOCAB + 64, HIDDEN), generator=generator)
    weight = torch.randn((router.experts, HIDDEN), generator=generator) * 0.5
    config = _config(router)
    routed = routed_padding = 0
    shift = real_assignments = 0.0
    dropped = [0, 0]
    aux = [0.0, 0.0]
    z = [0.0, 0.0]
    uncounted = 0
    corrected = router_padding.installed(True) if router.padding_mask else contextlib.nullcontext()
    with cpu_world(), corrected:
        for micro, batch in enumerate(run.batches):
            tokens = batch["tokens"].clamp(min=0, max=table.shape[0] - 1)
            real = run.real(micro)
            mask = step_padding_mask(batch) if router.padding_mask else None
            hidden = table[tokens].transpose(0, 1).contiguous()  # [s, b, h]
            as_run, losses_run = _one_pass(
                config, hidden.clone(), weight, None if mask is None else mask.transpose(0, 1).bool()
            )
            only = hidden.transpose(0, 1)[real].unsqueeze(1).contiguous()  # [n_real, 1, h]
            ideal, losses_ideal = _one_pass(config, only, weight)
            flat_real = real.transpose(0, 1).reshape(-1)  # routing map rows are [s, b] flattened
            # the rows the router's terms count: all of them, or those outside the mask the step handed on
            counted = torch.ones_like(flat_real) if mask is None else ~mask.transpose(0, 1).reshape(-1)
            any_expert = as_run.any(dim=1)
            routed += int(any_expert.sum())
            routed_padding += int((any_expert & ~flat_real & counted).sum())
            uncounted += int((flat_real & ~counted).sum())
            counted_map = as_run & counted.unsqueeze(1)
            shift += float((counted_map.sum(0).float() - ideal.sum(0).float()).abs().sum())
            real_assignments += float(ideal.sum())
            if router.capacity_factor is not None:
                dropped[0] += int((~any_expert & flat_real).sum())
                dropped[1] += int((~ideal.any(dim=1)).sum())
            aux[0] += losses_run.get("load_balancing_loss", 0.0)
            aux[1] += losses_ideal.get("load_balancing_loss", 0.0)
            z[0] += losses_run.get("z_loss", 0.0)
            z[1] += losses_ideal.get("z_loss", 0.0)
    coeffs = router.aux_loss_coeff if isinstance(router.aux_loss_coeff, tuple) else (router.aux_loss_coeff,)
    return RouterEffect(
        routed=routed,
        routed_padding=routed_padding,
        load_shift=shift / real_assignments if real_assignments else 0.0,
        aux_loss=(aux[0], aux[1]) if any(c > 0 for c in coeffs) and any(aux) else None,
        z_loss=(z[0], z[1]) if router.z_loss_coeff else None,
        real_dropped=(dropped[0], dropped[1]) if router.capacity_factor is not None else None,
        corrected=router.padding_mask,
        real_uncounted=uncounted,
    )
