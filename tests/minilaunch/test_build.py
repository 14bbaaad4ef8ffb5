"""The model built as the launch builds it (launch.model_build): Megatron's own asserts at provide() and in DDP fire
as named violations with a fix that builds, the project's mixins produce configs that build, a raise the shrink
causes or a package this machine lacks is never an error, and nothing is left behind in the process."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from mbridge_seqpack import check
from mbridge_seqpack.minilaunch.build import construct, forget_constructions
from tests.support.threads import gloo_threads, needs_proc

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _launch_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The miniature launch is opt-in (MBRIDGE_SEQPACK_LAUNCH=1); these tests turn it on."""
    monkeypatch.setenv("MBRIDGE_SEQPACK_LAUNCH", "1")


RNG = (
    "AssertionError: Transformer engine's RNG tracker is required for cudagraphs, it can be enabled with "
    "use_te_rng_tracker=True'."
)


def _launch(cfg: Any, world_size: int = 8) -> list[Any]:
    return [v for v in check(cfg, world_size=world_size) if v.rule_id == "launch.model_build"]


def _te_graphs(cfg: Any) -> None:
    from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules

    cfg.model.cuda_graph_impl = "transformer_engine"
    set_cuda_graph_modules(cfg.model, ["mlp"])


@pytest.mark.evidence("launch.model_build")
def test_cuda_graphs_without_the_te_rng_tracker_fail_at_provide(packed_cfg: Any) -> None:
    """Megatron-Bridge's SFT defaults leave rng.te_rng_tracker off; provide() asserts it for every graph config."""
    _te_graphs(packed_cfg)
    with pytest.raises(AssertionError, match="RNG tracker is required for cudagraphs"):
        packed_cfg.model.provide()  # the real provider, unshrunk: it asserts before building anything
    (found,) = _launch(packed_cfg)
    assert found.fields == {
        "model": "GPTModelProvider",
        "raised": RNG,
        "at": "megatron/bridge/models/gpt_provider.py:234 provide",
        "rng.te_rng_tracker": False,
    }
    assert found.assignments == {"rng.te_rng_tracker": True}
    assert found.overrides == ["rng.te_rng_tracker=true"]
    assert found.rule == (
        f"the launch fails building the model, after the GPUs are allocated: {RNG} (megatron/bridge/models/"
        "gpt_provider.py:234 provide; built on CPU at shrunk widths with device allocations on the host "
        "(use_cpu_initialization), CUDA reported available to Transformer Engine's module constructors, the CUDA "
        "RNG tracker on the host generator, gradient_accumulation_fusion off (APEX's CUDA extension))"
    )
    packed_cfg.rng.te_rng_tracker = True
    assert _launch(packed_cfg) == []


@pytest.mark.evidence("launch.model_build")
def test_per_token_loss_with_averaging_in_the_collective_fails_at_ddp(packed_cfg: Any) -> None:
    """Megatron-Core's DDP asserts it whatever the CP size (MB's own check covers CP > 1 only)."""
    packed_cfg.model.calculate_per_token_loss = True
    packed_cfg.ddp.average_in_collective = True
    (found,) = _launch(packed_cfg)
    assert found.fields["raised"] == "AssertionError: Cannot average in collective when calculating per-token loss!"
    assert found.fields["at"] == "megatron/core/distributed/distributed_data_parallel.py:180 __init__"
    assert found.assignments == {"ddp.average_in_collective": False}
    packed_cfg.ddp.average_in_collective = False  # the near miss: per-token loss alone builds
    assert _launch(packed_cfg) == []


def test_packed_cuda_graphs_mixin_configs_construct(megatron_bridge: Any) -> None:
    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import OfflinePacking, PackedCudaGraphs
    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

    cfg = apply(
        sft_base(small_gpt_provider(2048), seq_length=2048, global_batch_size=16), OfflinePacking(), PackedCudaGraphs()
    )
    assert cfg.rng.te_rng_tracker is True
    assert construct(cfg).state == "built"


def test_a_planted_provider_assert_is_caught_and_its_absence_is_not(
    packed_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    real = GPTModelProvider.provide

    def provide(self: Any, *args: Any, **kwargs: Any) -> Any:
        assert self.normalization != "RMSNorm", "planted: no RMSNorm"
        return real(self, *args, **kwargs)

    forget_constructions()
    monkeypatch.setattr(GPTModelProvider, "provide", provide)
    found = construct(packed_cfg)
    assert (found.state, found.error, found.site) == (
        "refused",
        "AssertionError: planted: no RMSNorm",
        "megatron/bridge/models/model_provider.py:747 _create_model",
    )
    monkeypatch.setattr(GPTModelProvider, "provide", real)
    forget_constructions()
    assert construct(packed_cfg).state == "built"


def test_a_raise_only_at_the_shrunk_width_is_not_an_error(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A raise that depends on the copy's width (here planted in Megatron-Core's MLP) is the shrink's, not the
    config's: it does not recur at twice the widths, so the verdict is not determined, never an error."""
    from megatron.core.transformer import mlp

    real = mlp.MLP.__init__

    def init(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        assert config.hidden_size != 64, "planted: width 64"
        real(self, config, *args, **kwargs)

    forget_constructions()
    monkeypatch.setattr(mlp.MLP, "__init__", init)
    found = construct(packed_cfg)
    assert found.state == "not_run"
    assert found.why.startswith("the copy at CPU sizes raised AssertionError: planted: width 64")
    assert found.why.endswith(
        "and not so at twice those sizes: a raise of the shrink, not known for the config's own sizes"
    )
    forget_constructions()


def test_a_package_this_machine_lacks_is_not_determined(hybrid_cfg: Any) -> None:
    (found,) = _launch(hybrid_cfg)
    assert found.severity == "undetermined"
    assert found.not_run.startswith("a package the model needs is not installed here (ImportError: MambaSSM is not")
    assert found.fix == "build it once where it can run (one step of the launch on a GPU node) before the full launch"


def test_a_config_finalize_refuses_is_left_to_validate(packed_cfg: Any) -> None:
    packed_cfg.model.tensor_model_parallel_size = 5  # 12 heads: Megatron-Core's finalize() refuses it
    found = construct(packed_cfg)
    assert found.state == "invalid"
    assert found.why == "ValueError: num_attention_heads (12) must be a multiple of tensor_model_parallel_size (5)."
    assert _launch(packed_cfg, world_size=40) == []


def test_the_launch_environment_is_the_configs(packed_cfg: Any) -> None:
    """deterministic_mode needs NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 when TE's attention is built: the launch exports
    cfg.env_vars first; this process's own environment is left as it was."""
    before = dict(os.environ)
    packed_cfg.model.deterministic_mode = True
    found = construct(packed_cfg)
    assert found.state == "refused" and "NVTE_ALLOW_NONDETERMINISTIC_ALGO is not 0" in found.error
    packed_cfg.env_vars = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}
    assert construct(packed_cfg).state == "built"
    assert dict(os.environ) == before


@needs_proc
def test_cached_per_distinct_config_and_nothing_left_running(packed_cfg: Any) -> None:
    forget_constructions()
    first = construct(packed_cfg)
    assert construct(packed_cfg) is first
    average, per_token = packed_cfg.ddp.average_in_collective, packed_cfg.model.calculate_per_token_loss
    packed_cfg.ddp.average_in_collective, packed_cfg.model.calculate_per_token_loss = not average, True
    refused = construct(packed_cfg)
    assert refused is not first and refused.state == "refused"
    # the same builds again from an empty cache: no Python thread is left, and no build keeps its world (a world's
    # ~19 gloo groups, 3 threads each, are what made the suite crawl). A few groups per build still outlive it here,
    # held where no Python container refers to them (not found yet; see docs/development.md)
    from mbridge_seqpack.capture.cpu_world import cpu_world

    threads, gloo = threading.active_count(), gloo_threads()
    with cpu_world():
        world = gloo_threads() - gloo
    forget_constructions()
    assert construct(packed_cfg).state == "refused"
    packed_cfg.ddp.average_in_collective, packed_cfg.model.calculate_per_token_loss = average, per_token
    assert construct(packed_cfg).state == "built"
    assert threading.active_count() == threads
    assert world >= 50 and gloo_threads() - gloo < world


def test_a_world_already_up_is_not_used(packed_cfg: Any) -> None:
    import torch.distributed as dist

    forget_constructions()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        found = construct(packed_cfg)
    finally:
        dist.destroy_process_group()
    assert (found.state, found.why) == (
        "not_run",
        "torch.distributed is already initialized in this process (the build needs a world of its own)",
    )


def test_virtual_pipeline_stages_are_said_to_be_dropped(packed_cfg: Any) -> None:
    packed_cfg.model.pipeline_model_parallel_size = 2
    packed_cfg.model.virtual_pipeline_model_parallel_size = 2
    found = construct(packed_cfg)
    assert found.state == "built"
    assert found.followed == (
        "virtual_pipeline_model_parallel_size=2 -> None (a one-rank world has one pipeline stage, so the model is "
        "built as one chunk)",
    )


def test_off_unless_turned_on(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt-in until the recipe zoo has run through it: without the variable neither launch rule runs."""
    packed_cfg.model.calculate_per_token_loss = True
    packed_cfg.ddp.average_in_collective = True
    assert [v.rule_id for v in _launch(packed_cfg)] == ["launch.model_build"]
    monkeypatch.delenv("MBRIDGE_SEQPACK_LAUNCH")
    assert [v.rule_id for v in check(packed_cfg, world_size=8) if v.rule_id.startswith("launch.")] == []


@pytest.mark.parametrize(
    ("experts", "freq", "shrunk"), [(64, 1, 8), (64, 2, 8), (12, 1, 12), (64, [0, 0], 64), (True, 1, True)]
)
def test_the_shrink_cuts_the_routed_experts_only(packed_cfg: Any, experts: Any, freq: Any, shrunk: Any) -> None:
    """Above 16 routed experts the shrink keeps top-k's 8 (one group); a model with no MoE layer (a frequency list
    of zeros) or no expert count (a bool) keeps its num_moe_experts as it is."""
    from mbridge_seqpack.minilaunch.shrink import shrunk_provider

    model = packed_cfg.model
    model.num_layers, model.num_moe_experts, model.moe_layer_freq, model.moe_router_topk = 2, experts, freq, 8
    assert shrunk_provider(model).provider.num_moe_experts == shrunk
    assert model.num_moe_experts == experts  # the original is not touched
