"""A read-only view of a ConfigContainer with the derived facts every rule needs.

Rules read the real Megatron-Bridge objects through this view so each rule stays a few lines and
the "which dataset kind / which CUDA-graph scope / which world size" logic lives in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from mbridge_seqpack.errors import UsageError
from mbridge_seqpack.rules.topology import Topology

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = ["RuleContext", "resolve_world_size", "SPECS"]

#: where a config keeps its offline packing specs (the prefix of every field the packing rules name)
SPECS = "dataset.offline_packing_specs"


def resolve_world_size(world_size: int | None) -> int:
    """The world size to check against: explicit, else torch.distributed / WORLD_SIZE as Megatron-Bridge does."""
    if world_size is not None:
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise UsageError(f"world_size must be a positive integer, got {world_size!r}; pass e.g. world_size=8")
        return world_size
    from megatron.bridge.utils.common_utils import get_world_size_safe

    return int(get_world_size_safe())


@dataclass
class RuleContext:
    """The config under check, the world size it will run on, and facts derived from both."""

    cfg: ConfigContainer
    world_size: int

    @classmethod
    def build(cls, cfg: ConfigContainer, world_size: int | None = None) -> "RuleContext":
        """Resolve the world size once and wrap ``cfg``."""
        return cls(cfg=cfg, world_size=resolve_world_size(world_size))

    # ---- sub-configs -------------------------------------------------------------------------
    @property
    def model(self) -> Any:
        return self.cfg.model

    @property
    def dataset(self) -> Any:
        return self.cfg.dataset

    @property
    def train(self) -> Any:
        return self.cfg.train

    @property
    def specs(self) -> Any:
        """``dataset.offline_packing_specs`` or None."""
        return getattr(self.dataset, "offline_packing_specs", None)

    @property
    def sampler_seed(self) -> Any:
        """The seed Megatron-Bridge's samplers shuffle with (data/loaders.py: ``dataset.seed``, else
        ``dataset.random_seed``, else ``rng.seed``)."""
        for value in (getattr(self.dataset, "seed", None), getattr(self.dataset, "random_seed", None)):
            if value is not None:
                return value
        return getattr(getattr(self.cfg, "rng", None), "seed", None)

    # ---- layout ------------------------------------------------------------------------------
    @cached_property
    def non_te_core_attention(self) -> list[str]:
        """Core-attention classes of the layer spec that are not Transformer Engine's (resolved once per check:
        three attention rules ask)."""
        from mbridge_seqpack.rules.model_family import non_te_core_attention

        return non_te_core_attention(self.model)

    @cached_property
    def topology(self) -> Topology:
        m = self.model
        return Topology(
            world_size=self.world_size,
            tp=int(getattr(m, "tensor_model_parallel_size", 1) or 1),
            pp=int(getattr(m, "pipeline_model_parallel_size", 1) or 1),
            cp=int(getattr(m, "context_parallel_size", 1) or 1),
            ep=int(getattr(m, "expert_model_parallel_size", 1) or 1),
            etp=getattr(m, "expert_tensor_parallel_size", None),
            eval_cp=self.cfg.dist.eval_context_parallel_size if self.cfg.dist is not None else None,
            sequence_parallel=bool(getattr(m, "sequence_parallel", False)),
        )

    # ---- dataset kind ------------------------------------------------------------------------
    @cached_property
    def _dataset_classes(self) -> dict[str, type]:
        from megatron.bridge.data.builders import DirectHFSFTDatasetConfig, GPTSFTDatasetConfig
        from megatron.bridge.data.builders.energon import EnergonDatasetConfig
        from megatron.bridge.data.builders.mock_vlm_sft import MockVLMSFTDatasetConfig

        return {
            "gpt_sft": GPTSFTDatasetConfig,
            "direct_hf": DirectHFSFTDatasetConfig,
            "energon": EnergonDatasetConfig,
            "mock_vlm": MockVLMSFTDatasetConfig,
        }

    def dataset_is(self, *kinds: str) -> bool:
        """Whether the dataset config is one of the named Megatron-Bridge kinds."""
        classes = tuple(self._dataset_classes[k] for k in kinds)
        return isinstance(self.dataset, classes)

    @property
    def is_finetuning(self) -> bool:
        """SFT datasets (the ones Megatron-Bridge applies its CP fine-tuning asserts to)."""
        return self.dataset_is("gpt_sft", "direct_hf", "energon", "mock_vlm")

    @property
    def has_collate_padding(self) -> bool:
        """Datasets whose collate pads to the CP/SP multiple (DirectHF, Energon, MockVLM)."""
        return self.dataset_is("direct_hf", "energon", "mock_vlm")

    # ---- packing modes -----------------------------------------------------------------------
    @property
    def offline_packing(self) -> bool:
        return bool(getattr(self.dataset, "enable_offline_packing", False))

    @property
    def in_batch_packing(self) -> bool:
        return bool(getattr(self.dataset, "enable_in_batch_packing", False))

    @property
    def energon_packing(self) -> bool:
        """Energon online packing: an Energon dataset with a positive ``packing_buffer_size``."""
        size = getattr(self.dataset, "packing_buffer_size", None)
        return self.dataset_is("energon") and size is not None and size > 0

    @property
    def any_packing(self) -> bool:
        """THD layout is in use (offline, in-batch or Energon online packing)."""
        return self.offline_packing or self.in_batch_packing or self.energon_packing or self.specs is not None

    # ---- fixed width -------------------------------------------------------------------------
    @property
    def pad_to_max_length_path(self) -> str:
        """Where this dataset keeps ``pad_to_max_length``: an attribute, or a ``dataset_kwargs`` key."""
        if hasattr(self.dataset, "pad_to_max_length"):
            return "dataset.pad_to_max_length"
        return "dataset.dataset_kwargs.pad_to_max_length"

    @property
    def pad_to_max_length(self) -> bool:
        kwargs = getattr(self.dataset, "dataset_kwargs", None) or {}
        return getattr(self.dataset, "pad_to_max_length", False) is True or kwargs.get("pad_to_max_length") is True

    def pad_to_max_length_fix(self) -> dict[str, Any]:
        """Assignment that turns fixed-width padding on for this dataset kind."""
        if hasattr(self.dataset, "pad_to_max_length"):
            return {"dataset.pad_to_max_length": True}
        if getattr(self.dataset, "dataset_kwargs", None) is None:
            return {"dataset.dataset_kwargs": {"pad_to_max_length": True}}
        return {"dataset.dataset_kwargs.pad_to_max_length": True}

    # ---- CUDA graphs -------------------------------------------------------------------------
    @property
    def cuda_graph_impl(self) -> str:
        return str(getattr(self.model, "cuda_graph_impl", "none") or "none")

    @property
    def full_iteration_graph(self) -> bool:
        from megatron.bridge.utils.cuda_graph import is_full_iteration_cuda_graph

        return bool(is_full_iteration_cuda_graph(self.model))

    @property
    def training_cuda_graphs(self) -> bool:
        """Graphs that replay training steps and so need a static token width."""
        return self.full_iteration_graph or self.cuda_graph_impl == "transformer_engine"

    @property
    def graph_modules(self) -> list[str]:
        """Per-layer capture scope by name (``cuda_graph_modules`` or the deprecated ``cuda_graph_scope``)."""
        from megatron.bridge.utils.cuda_graph import cuda_graph_module_names

        return list(cuda_graph_module_names(self.model))

    @property
    def has_dense_mlp_layers(self) -> bool:
        """Whether some layer has a dense MLP (Megatron-Core refuses ``cuda_graph_modules=[mlp]`` otherwise)."""
        experts = getattr(self.model, "num_moe_experts", None)
        if not experts or experts <= 1:
            return True
        freq = getattr(self.model, "moe_layer_freq", 1)
        return isinstance(freq, list) and 0 in freq

    @property
    def static_thd_injected(self) -> bool:
        """Whether the full-iteration graph will get host-side ``max_seqlen`` from mbridge_seqpack: the wrapper is on
        ``FullCudaGraphWrapper.data_read`` in this process, or (a pre-launch check) ``MBRIDGE_SEQPACK_MODE`` turns the
        plugin on for the launch and the start-up hook is in the environment (``thd.inject.injection_state``)."""
        from mbridge_seqpack.thd.inject import injection_active

        return injection_active()

    # ---- precision ---------------------------------------------------------------------------
    @property
    def fp8_recipe(self) -> str | None:
        """The TE FP8 recipe the run will use, or None without FP8. A ``mixed_precision`` config (or recipe name)
        overwrites every precision field of the model in runtime_config_update (mixed_precision.py
        update_config_with_precision_overrides), so it wins over ``model.fp8``."""
        mixed = getattr(self.cfg, "mixed_precision", None)
        if isinstance(mixed, str):
            from megatron.bridge.training.mixed_precision import get_mixed_precision_config

            try:
                mixed = get_mixed_precision_config(mixed)
            except ValueError:
                return None  # Megatron-Bridge reports the unknown recipe name itself
        source = mixed if mixed is not None else self.model
        if not getattr(source, "fp8", None):
            return None
        recipe = getattr(source, "fp8_recipe", None) or "delayed"
        return str(getattr(recipe, "value", recipe))

    @property
    def mtp_layers(self) -> int:
        return int(getattr(self.model, "mtp_num_layers", None) or 0)
