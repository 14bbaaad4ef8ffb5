"""A read-only view of a ConfigContainer with the derived facts every rule needs.

Rules read the real Megatron-Bridge objects through this view so each rule stays a few lines and
the "which dataset kind / which CUDA-graph scope / which world size" logic lives in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from mbridge_seqpack.analysis.precision import precision_source
from mbridge_seqpack.analysis.topology import Topology
from mbridge_seqpack.errors import UsageError
from mbridge_seqpack.moe_layers import MoeLayers, moe_layers
from mbridge_seqpack.rules.field_types import (
    ANY_INT,
    BOOL,
    CP_COMM_TYPE,
    MAPPING,
    OPTIONAL_INT_LIST,
    OPTIONAL_MAPPING,
    OPTIONAL_MICRO_BATCH,
    OPTIONAL_NAME,
    OPTIONAL_NAMES,
    OPTIONAL_NON_NEGATIVE_INT,
    OPTIONAL_NUMBERS,
    OPTIONAL_PATH,
    OPTIONAL_POSITIVE_INT,
    OPTIONAL_STR,
    OPTIONAL_WINDOW,
    POSITIVE_INT,
    UNCHECKED,
    FieldType,
)

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

__all__ = [
    "RuleContext",
    "resolve_world_size",
    "SPECS",
    "TOPOLOGY_READS",
    "MOE_READS",
    "ATTENTION_VERDICT_READS",
    "EQUIVALENCE_READS",
    "PACK_FINGERPRINT_READS",
    "DATASET_KWARGS_READS",
    "GRAPH_PATH_READS",
    "PACK_PATH_READS",
    "BATCH_READS",
    "FP8_ROW_READS",
    "TP_OVERLAP_READS",
]

#: where a config keeps its offline packing specs (the prefix of every field the packing rules name)
SPECS = "dataset.offline_packing_specs"

#: the fields :attr:`RuleContext.topology` reads, with their types: a rule that asks the layout reads them all
TOPOLOGY_READS: dict[str, FieldType] = {
    "model.tensor_model_parallel_size": POSITIVE_INT,
    "model.pipeline_model_parallel_size": POSITIVE_INT,
    "model.context_parallel_size": POSITIVE_INT,
    "model.expert_model_parallel_size": POSITIVE_INT,
    "model.expert_tensor_parallel_size": OPTIONAL_POSITIVE_INT,
    "dist.eval_context_parallel_size": OPTIONAL_POSITIVE_INT,
    "model.sequence_parallel": BOOL,
}

#: the fields :attr:`RuleContext.moe` reads (``mbridge_seqpack/moe_layers.py``): a rule that asks it reads them all
MOE_READS: dict[str, FieldType] = {
    "model.num_moe_experts": OPTIONAL_NON_NEGATIVE_INT,
    "model.moe_layer_freq": UNCHECKED,
    "model.num_layers": UNCHECKED,
    "model.hybrid_layer_pattern": UNCHECKED,
    "model.hybrid_override_pattern": UNCHECKED,
}


#: the fields ``RuleContext.attention_verdict`` gives Transformer Engine's backend selection
ATTENTION_VERDICT_READS: dict[str, FieldType] = {
    "dataset.enable_offline_packing": BOOL,
    "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
    "dataset.offline_packing_specs.pad_cu_seqlens": BOOL,
    "dataset.offline_packing_specs.pad_seq_to_mult": POSITIVE_INT,
    "dataset.seq_length": POSITIVE_INT,
    "env_vars": MAPPING,
    "mixed_precision": UNCHECKED,
    "model.attention_backend": OPTIONAL_NAME,
    "model.attention_dropout": UNCHECKED,
    "model.bf16": UNCHECKED,
    "model.cp_comm_type": CP_COMM_TYPE,
    "model.deterministic_mode": BOOL,
    "model.fp8": UNCHECKED,
    "model.fp8_recipe": UNCHECKED,
    "model.hierarchical_context_parallel_sizes": OPTIONAL_INT_LIST,
    "model.hybrid_layer_pattern": UNCHECKED,
    "model.hybrid_override_pattern": UNCHECKED,
    "model.kv_channels": UNCHECKED,
    "model.log_max_attention_logit": UNCHECKED,
    "model.multi_latent_attention": UNCHECKED,
    "model.num_attention_heads": OPTIONAL_NON_NEGATIVE_INT,
    "model.num_layers": UNCHECKED,
    "model.num_query_groups": OPTIONAL_NON_NEGATIVE_INT,
    "model.qk_clip": UNCHECKED,
    "model.recompute_granularity": OPTIONAL_NAME,
    "model.recompute_modules": UNCHECKED,
    "model.softmax_scale": UNCHECKED,
    "model.softmax_type": OPTIONAL_NAME,
    "model.transformer_layer_spec": UNCHECKED,
    "model.window_size": OPTIONAL_WINDOW,
    "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
}

#: what the packed-vs-unpacked equivalence run (``mbridge_seqpack.equivalence``) is set up from
EQUIVALENCE_READS: dict[str, FieldType] = {
    "dataset.defer_in_batch_packing_to_step": BOOL,
    "dataset.enable_in_batch_packing": BOOL,
    "dataset.offline_packing_specs.pad_cu_seqlens": BOOL,
    "dataset.offline_packing_specs.pad_seq_to_mult": POSITIVE_INT,
    "model.calculate_per_token_loss": BOOL,
    "model.context_parallel_size": POSITIVE_INT,
    "model.moe_aux_loss_coeff": OPTIONAL_NUMBERS,
    "model.moe_expert_capacity_factor": UNCHECKED,
    "model.moe_pad_expert_input_to_capacity": UNCHECKED,
    "model.moe_router_enable_expert_bias": UNCHECKED,
    "model.moe_router_group_topk": UNCHECKED,
    "model.moe_router_load_balancing_type": OPTIONAL_NAMES,
    "model.moe_router_num_groups": UNCHECKED,
    "model.moe_router_pre_softmax": UNCHECKED,
    "model.moe_router_score_function": UNCHECKED,
    "model.moe_router_topk": OPTIONAL_POSITIVE_INT,
    "model.moe_router_topk_scaling_factor": UNCHECKED,
    "model.moe_token_drop_policy": UNCHECKED,
    "model.moe_z_loss_coeff": UNCHECKED,
    "model.mtp_loss_scaling_factor": UNCHECKED,
    "model.mtp_num_layers": OPTIONAL_NON_NEGATIVE_INT,
    **MOE_READS,
    "model.sequence_parallel": BOOL,
    "model.tensor_model_parallel_size": POSITIVE_INT,
    "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
}

#: what a pack on disk is compared with: its specs and the tokenizer config
PACK_FINGERPRINT_READS: dict[str, FieldType] = {
    "dataset.offline_packing_specs.max_single_sequence_length": OPTIONAL_POSITIVE_INT,
    "dataset.offline_packing_specs.packed_metadata_path": OPTIONAL_PATH,
    "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
    "dataset.offline_packing_specs.pad_seq_to_mult": POSITIVE_INT,
    "dataset.seq_length": POSITIVE_INT,
    "tokenizer.chat_template": UNCHECKED,
    "tokenizer.chat_template_path": UNCHECKED,
    "tokenizer.force_system_message": UNCHECKED,
    "tokenizer.hf_tokenizer_kwargs": UNCHECKED,
    "tokenizer.image_tag_type": UNCHECKED,
    "tokenizer.merge_file": UNCHECKED,
    "tokenizer.metadata_path": UNCHECKED,
    "tokenizer.null_tokenizer_eod_id": UNCHECKED,
    "tokenizer.null_tokenizer_pad_id": UNCHECKED,
    "tokenizer.sp_tokenizer_kwargs": UNCHECKED,
    "tokenizer.special_tokens": UNCHECKED,
    "tokenizer.tiktoken_num_special_tokens": UNCHECKED,
    "tokenizer.tiktoken_pattern": UNCHECKED,
    "tokenizer.tokenizer_hf_no_include_special_tokens": UNCHECKED,
    "tokenizer.tokenizer_hf_no_use_fast": UNCHECKED,
    "tokenizer.tokenizer_model": UNCHECKED,
    "tokenizer.tokenizer_prompt_format": UNCHECKED,
    "tokenizer.tokenizer_sentencepiece_ignore_extra_whitespaces": UNCHECKED,
    "tokenizer.tokenizer_sentencepiece_legacy": UNCHECKED,
    "tokenizer.tokenizer_type": UNCHECKED,
    "tokenizer.trust_remote_code": UNCHECKED,
    "tokenizer.vocab_file": UNCHECKED,
    "tokenizer.vocab_size": UNCHECKED,
}

#: the ``dataset_kwargs`` keys the row-width facts read (``pad_to_max_length``, the collate multiple)
DATASET_KWARGS_READS: dict[str, FieldType] = {
    "dataset.dataset_kwargs": OPTIONAL_MAPPING,
    "dataset.dataset_kwargs['answer_only_loss']": BOOL,
    "dataset.dataset_kwargs['pad_seq_length_to_mult']": POSITIVE_INT,
    "dataset.dataset_kwargs['pad_to_max_length']": BOOL,
}

#: the fields ``RuleContext.graph_path`` places a config in the CUDA-graph path matrix by
GRAPH_PATH_READS: dict[str, FieldType] = {
    "dataset.enable_in_batch_packing": BOOL,
    "model.cuda_graph_impl": OPTIONAL_STR,
    "model.cuda_graph_modules": OPTIONAL_NAMES,
    "model.cuda_graph_scope": UNCHECKED,
    **MOE_READS,
}

#: where a config's pack is found and which tokenizer named it
PACK_PATH_READS: dict[str, FieldType] = {
    "dataset.dataset_root": UNCHECKED,
    "dataset.offline_packing_specs.packed_train_data_path": OPTIONAL_PATH,
    "dataset.offline_packing_specs.tokenizer_model_name": UNCHECKED,
}

#: the training and evaluation batch sizes
BATCH_READS: dict[str, FieldType] = {
    "train.global_batch_size": OPTIONAL_MICRO_BATCH,
    "train.micro_batch_size": OPTIONAL_MICRO_BATCH,
    "validation.eval_global_batch_size": OPTIONAL_MICRO_BATCH,
    "validation.eval_iters": OPTIONAL_NON_NEGATIVE_INT,
    "validation.eval_micro_batch_size": OPTIONAL_MICRO_BATCH,
}

#: the precision and row width the FP8 token multiples are computed from
FP8_ROW_READS: dict[str, FieldType] = {
    "dataset.pad_to_multiple_of": POSITIVE_INT,
    "mixed_precision.fp8": UNCHECKED,
    "mixed_precision.fp8_recipe": OPTIONAL_NAME,
}

#: the fields the userbuffer TP overlap token count is computed from
TP_OVERLAP_READS: dict[str, FieldType] = {
    "comm_overlap": UNCHECKED,
    "model.seq_length": POSITIVE_INT,
    "model.tp_comm_overlap": BOOL,
}


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
    #: what the rule running now read on trust (``attention_verdict``'s assumptions); ``run_rule`` empties it before
    #: each rule and keeps it on an ok result, which the report then shows as assumed, not as a plain ok
    assumed: list[str] = field(default_factory=list, repr=False, compare=False)

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
        three attention rules ask), and Megatron-Core's own when ``provide()`` swaps it in for
        ``attention_backend=local``."""
        from mbridge_seqpack.analysis.attention_backend import local_attention_swap
        from mbridge_seqpack.analysis.model_family import non_te_core_attention

        return non_te_core_attention(self.model) + local_attention_swap(self.model)

    @property
    def attention_verdict(self) -> Any:
        """Transformer Engine's own backend selection for each kind of layer (``analysis/attention_backend.py``),
        computed once per check on the target GPU stack (``analysis/te_attention.py``); what it takes on trust off
        a GPU (cuDNN's own support query, an undeclared stack) is noted for the rule reading it."""
        verdict = self._attention_verdict
        self.assumed.extend(a for a in verdict.assumptions if a not in self.assumed)
        return verdict

    @cached_property
    def _attention_verdict(self) -> Any:
        from mbridge_seqpack.analysis.attention_backend import verdict_of

        return verdict_of(self.cfg, non_te=self.non_te_core_attention)

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

    @property
    def packing_flags(self) -> dict[str, Any]:
        """The fields that turn packing on for this config, with their values (for a violation's fields)."""
        flags: dict[str, Any] = {}
        if self.offline_packing:
            flags["dataset.enable_offline_packing"] = True
        if self.in_batch_packing:
            flags["dataset.enable_in_batch_packing"] = True
        if self.energon_packing:
            flags["dataset.packing_buffer_size"] = self.dataset.packing_buffer_size
        return flags

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
    def graph_packing(self) -> str | None:
        """The packing mode the CUDA-graph path matrix tells apart (``analysis/graph_paths.py``): in-batch, offline
        fixed width or offline variable width; None without THD packing there."""
        if self.in_batch_packing:
            return "in_batch"
        if self.offline_packing and self.specs is not None:
            return "offline_fixed" if self.pad_to_max_length else "offline_variable"
        return None

    @property
    def graph_coordinates(self) -> Any:
        """This config's (implementation, capture, packing) in the graph-path matrix; None without a training graph
        over packed data."""
        from mbridge_seqpack.analysis.graph_paths import classify

        packing = self.graph_packing
        if packing is None:
            return None
        return classify(
            packing,  # type: ignore[arg-type]
            full_iteration=self.full_iteration_graph,
            impl=self.cuda_graph_impl,
            modules=self.graph_modules if self.cuda_graph_impl == "transformer_engine" else [],
            cfg=self.cfg,
        )

    @property
    def graph_path(self) -> Any:
        """This config's cell of the graph-path matrix (``analysis/graph_paths.py`` GraphPath), or None."""
        from mbridge_seqpack.analysis.graph_paths import cell_at

        return cell_at(self.graph_coordinates)

    @cached_property
    def moe(self) -> MoeLayers:
        """Which layers are MoE and with how many routed experts, as Megatron-Core builds them
        (``mbridge_seqpack/moe_layers.py``, the one reading of ``num_moe_experts`` / ``moe_layer_freq`` / the hybrid
        pattern); ``ctx.moe.experts`` is None for a model with no MoE layer."""
        return moe_layers(self.model)

    # ---- precision ---------------------------------------------------------------------------
    @property
    def precision_source(self) -> tuple[str, Any] | None:
        """Where the run's precision fields come from, as (path prefix, object): a ``mixed_precision`` config, or a
        recipe name resolved to Megatron-Bridge's preset, overwrites every precision field of the model in
        runtime_config_update (mixed_precision.py update_config_with_precision_overrides); None for a recipe name
        Megatron-Bridge does not know (it reports that itself). Read by ``analysis/precision.py``, which the
        attention verdict reads too."""
        return precision_source(self.cfg)

    @property
    def precision_is_preset(self) -> bool:
        """The precision is a recipe name: Megatron-Bridge's preset, no field the user typed."""
        return isinstance(getattr(self.cfg, "mixed_precision", None), str)

    @property
    def fp8_recipe(self) -> str | None:
        """The TE FP8 recipe the run will use (from ``precision_source``), or None without FP8."""
        found = self.precision_source
        source = found[1] if found is not None else None
        if not getattr(source, "fp8", None):
            return None
        recipe = getattr(source, "fp8_recipe", None) or "delayed"
        return str(getattr(recipe, "value", recipe))

    @property
    def mtp_layers(self) -> int:
        return int(getattr(self.model, "mtp_num_layers", None) or 0)

    @property
    def fp4_recipe(self) -> str | None:
        """The TE FP4 recipe the run will use (``nvfp4``, from ``precision_source``), or None without FP4."""
        found = self.precision_source
        source = found[1] if found is not None else None
        if not getattr(source, "fp4", None):
            return None
        recipe = getattr(source, "fp4_recipe", None) or "nvfp4"
        return str(getattr(recipe, "value", recipe))

    # ---- pretraining datasets ----------------------------------------------------------------
    @property
    def pretraining_dataset(self) -> bool:
        """Megatron-Bridge's GPT pretraining dataset config (Megatron-Core's ``GPTDatasetConfig``: real, mock or
        FIM data), read by ``GPTDataset.__getitem__``."""
        from megatron.bridge.training.config import GPTDatasetConfig

        return isinstance(self.dataset, GPTDatasetConfig)

    @cached_property
    def dataset_mask_honoured(self) -> bool:
        """Whether an attention mask built by the pretraining dataset reaches a core attention that applies it: the
        step must keep it (``skip_getting_attention_mask_from_dataset=False``, training/gpt_step.py get_batch) and
        the core attention must not be Transformer Engine's, whose causal mask type ignores ``attention_mask``."""
        if getattr(self.dataset, "skip_getting_attention_mask_from_dataset", True):
            return False
        return bool(self.non_te_core_attention)

    # ---- widths ------------------------------------------------------------------------------
    @property
    def fixed_width_rows(self) -> bool:
        """Rows padded to full width once Megatron-Bridge's validate() has run: ``pad_to_max_length``, which it
        turns on itself for datasets that carry the field under PP>1 or EP>1 (training/config.py)."""
        if self.pad_to_max_length:
            return True
        if not hasattr(self.dataset, "pad_to_max_length"):
            return False
        return self.topology.pp > 1 or self.topology.ep > 1

    # ---- communication overlap ---------------------------------------------------------------
    @property
    def tp_comm_overlap(self) -> bool:
        """Transformer Engine userbuffer TP overlap as it will run: ``comm_overlap.tp_comm_overlap`` (applied by
        CommOverlapConfig.setup) or ``model.tp_comm_overlap``, kept only with TP>1 and sequence parallelism
        (training/comm_overlap.py _get_model_comm_overlap_cfgs)."""
        overlap = getattr(self.cfg, "comm_overlap", None)
        source = overlap if overlap is not None else self.model  # setup() writes the comm_overlap value on the model
        requested = getattr(source, "tp_comm_overlap", False)
        topo = self.topology
        return bool(requested) and topo.tp > 1 and topo.sequence_parallel
