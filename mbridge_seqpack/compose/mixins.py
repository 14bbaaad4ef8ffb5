"""Recipe mixins: declare a capability once, derive every dependent field from the final topology.

``apply(cfg, *mixins)`` works in three steps so the result does not depend on mixin order:
1. collect the *facts* each mixin declares (dotted path -> value); two mixins declaring different
   values for one path is a conflict and raises;
2. write the facts;
3. derive every dependent field (the three sequence lengths, ``pad_seq_to_mult``, per-token loss,
   fixed width, static ``cu_seqlens``, micro batch) from the final config, then run the rule catalog
   and raise :class:`PackingConfigError` if something still cannot hold (e.g. a model family that
   opts out of packing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from mbridge_seqpack.compose.derive import derive, ensure_specs
from mbridge_seqpack.config_paths import set_path
from mbridge_seqpack.errors import ERROR, PackingConfigError, UsageError, Violation

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

#: Megatron-Bridge's recipe runner treats ``dataset.seq_length`` as the owner of the length and syncs
#: ``model.seq_length`` from it; mixins state the length there too
SEQ_LENGTH = "dataset.seq_length"

__all__ = [
    "Mixin",
    "OfflinePacking",
    "InBatchPacking",
    "ContextParallel",
    "Parallelism",
    "LongContext",
    "PackedCudaGraphs",
    "apply",
    "collect_facts",
    "derive",
]


class Mixin(Protocol):
    """A capability: the primary facts it fixes, as dotted paths under ``cfg``."""

    def facts(self) -> dict[str, Any]: ...


def _positive(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise UsageError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class OfflinePacking:
    """Offline packed SFT: rows of ``pack_size`` tokens (default: the model's seq_length), micro batch 1."""

    pack_size: int | None = None
    max_single_sequence_length: int | None = None
    packed_train_data_path: str | None = None
    packed_val_data_path: str | None = None
    packed_metadata_path: str | None = None

    def __post_init__(self) -> None:
        _positive("OfflinePacking.pack_size", self.pack_size)
        _positive("OfflinePacking.max_single_sequence_length", self.max_single_sequence_length)

    def facts(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dataset.enable_offline_packing": True, "train.micro_batch_size": 1}
        if self.pack_size is not None:
            out[SEQ_LENGTH] = self.pack_size
        for name in (
            "max_single_sequence_length",
            "packed_train_data_path",
            "packed_val_data_path",
            "packed_metadata_path",
        ):
            if getattr(self, name) is not None:
                out[f"dataset.offline_packing_specs.{name}"] = getattr(self, name)
        return out


@dataclass(frozen=True)
class InBatchPacking:
    """Collate-time packing (VLM): ``micro_batch_size`` (> 1) sequences concatenated per row."""

    micro_batch_size: int = 2

    def __post_init__(self) -> None:
        _positive("InBatchPacking.micro_batch_size", self.micro_batch_size)
        if self.micro_batch_size < 2:
            raise UsageError(
                f"InBatchPacking.micro_batch_size must be > 1 (it packs the sequences of one micro batch), got "
                f"{self.micro_batch_size}; use OfflinePacking for micro batch 1"
            )

    def facts(self) -> dict[str, Any]:
        return {
            "dataset.enable_in_batch_packing": True,
            "dataset.defer_in_batch_packing_to_step": False,
            "train.micro_batch_size": self.micro_batch_size,
        }


@dataclass(frozen=True)
class ContextParallel:
    """Context parallelism: size, communication type, hierarchical (a2a+p2p) level sizes."""

    size: int
    comm_type: str | None = None
    hierarchical_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _positive("ContextParallel.size", self.size)

    def facts(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model.context_parallel_size": self.size}
        if self.comm_type is not None:
            out["model.cp_comm_type"] = self.comm_type
        if self.hierarchical_sizes is not None:
            out["model.hierarchical_context_parallel_sizes"] = list(self.hierarchical_sizes)
        return out


@dataclass(frozen=True)
class Parallelism:
    """Tensor / pipeline / expert parallel sizes; sequence parallelism defaults to on when TP > 1."""

    tensor: int = 1
    pipeline: int = 1
    expert: int = 1
    sequence_parallel: bool | None = None

    def __post_init__(self) -> None:
        for name in ("tensor", "pipeline", "expert"):
            _positive(f"Parallelism.{name}", getattr(self, name))

    def facts(self) -> dict[str, Any]:
        sp = self.tensor > 1 if self.sequence_parallel is None else self.sequence_parallel
        return {
            "model.tensor_model_parallel_size": self.tensor,
            "model.pipeline_model_parallel_size": self.pipeline,
            "model.expert_model_parallel_size": self.expert,
            "model.sequence_parallel": sp,
        }


@dataclass(frozen=True)
class LongContext:
    """Sequence length and the CP size that carries it, set together."""

    seq_length: int
    context_parallel_size: int = 1

    def __post_init__(self) -> None:
        _positive("LongContext.seq_length", self.seq_length)
        _positive("LongContext.context_parallel_size", self.context_parallel_size)

    def facts(self) -> dict[str, Any]:
        return {SEQ_LENGTH: self.seq_length, "model.context_parallel_size": self.context_parallel_size}


@dataclass(frozen=True)
class PackedCudaGraphs:
    """CUDA graphs over offline packed rows, on a path Megatron-Core replays (``docs/graph-paths.md``).

    Default: TE per-layer capture of ``("mlp",)``: attention runs eagerly with the packed boundaries and the graph
    takes the fixed-width hidden states. ``modules`` may name any scope after attention (``moe_router`` for
    all-MoE models); attention inside a TE graph asserts on ``packed_seq_params`` at the first replay, so
    ``"attn"`` and the whole layer (``()``) are refused. ``impl="full_iteration"`` captures the whole step; it needs
    mbridge_seqpack's host-side ``max_seqlen`` at run time (``MBRIDGE_SEQPACK_MODE``), which the rules check. Either
    way it turns on Transformer Engine's RNG tracker (``rng.te_rng_tracker``), which Megatron-Bridge's ``provide()``
    asserts for every CUDA-graph config.
    """

    impl: str = "transformer_engine"
    modules: tuple[str, ...] = ("mlp",)

    def __post_init__(self) -> None:
        if self.impl not in ("transformer_engine", "full_iteration"):
            raise UsageError(
                f"PackedCudaGraphs.impl must be 'transformer_engine' or 'full_iteration', got {self.impl!r}"
            )
        if self.impl == "transformer_engine" and (not self.modules or "attn" in self.modules):
            raise UsageError(
                f"PackedCudaGraphs.modules={tuple(self.modules)!r} puts attention inside a TE graph, which asserts on "
                "packed_seq_params at the first replay; capture after attention, e.g. modules=('mlp',)"
            )

    def facts(self) -> dict[str, Any]:
        # models/gpt_provider.py provide() asserts the TE RNG tracker for every CUDA-graph config (launch.model_build)
        out: dict[str, Any] = {"model.cuda_graph_impl": self.impl, "rng.te_rng_tracker": True}
        if self.impl == "transformer_engine":
            out["model.cuda_graph_modules"] = tuple(self.modules)
        else:  # training/config.py asserts it for full-iteration graphs
            out["rerun_state_machine.check_for_nan_in_loss"] = False
        return out


# ---- apply / derive -------------------------------------------------------------------------------


def collect_facts(mixins: Iterable[Any]) -> dict[str, Any]:
    """Every mixin's facts merged; two mixins giving one path different values raise ``mixins.conflict``."""
    merged: dict[str, tuple[Any, Any]] = {}
    conflicts: list[Violation] = []
    for mixin in mixins:
        if not hasattr(mixin, "facts"):
            raise TypeError(f"apply() takes mixins (objects with .facts()); got {type(mixin).__name__}")
        for path, value in mixin.facts().items():
            if path in merged and merged[path][0] != value:
                other = merged[path][1]
                conflicts.append(
                    Violation(
                        {path: [merged[path][0], value]},
                        f"{type(other).__name__} and {type(mixin).__name__} set {path} to different values, so "
                        "the result would depend on their order",
                        fix=f"give {path} one value (drop it from one of the two mixins)",
                        rule_id="mixins.conflict",
                    )
                )
            merged.setdefault(path, (value, mixin))
    if conflicts:
        raise PackingConfigError(conflicts)
    return {path: value for path, (value, _) in merged.items()}


def _set_cuda_graph_modules(model: Any, modules: tuple[str, ...]) -> None:
    from megatron.bridge.utils.cuda_graph import set_cuda_graph_modules

    set_cuda_graph_modules(model, list(modules))


def _write(cfg: ConfigContainer, facts: dict[str, Any]) -> None:
    for path, value in sorted(facts.items()):
        if path == SEQ_LENGTH and not hasattr(cfg.dataset, "seq_length"):
            cfg.model.seq_length = value  # a dataset without a length of its own: the model holds it
        elif path == "model.cuda_graph_modules":
            _set_cuda_graph_modules(cfg.model, value)
        elif path.startswith("dataset.offline_packing_specs."):
            ensure_specs(cfg)
            set_path(cfg, path, value)
        else:
            set_path(cfg, path, value)


#: rules whose outcome depends on the world size; apply() runs them only when it is given
_WORLD_SIZE_RULES = ("batch.world_size_divisible", "batch.global_batch_divisible", "batch.global_batch_min")


def apply(cfg: ConfigContainer, *mixins: Any, world_size: int | None = None) -> ConfigContainer:
    """Apply ``mixins`` to ``cfg`` in place (order-independent), derive dependent fields, check, return cfg."""
    from mbridge_seqpack.rules import RuleContext, all_rules, evaluate

    facts = collect_facts(mixins)
    _write(cfg, facts)
    derive(cfg)
    rules = [r for r in all_rules() if world_size is not None or r.rule_id not in _WORLD_SIZE_RULES]
    ctx = RuleContext.build(cfg, world_size if world_size is not None else 1)
    violations = [v for result in evaluate(ctx, rules) for v in result.violations if v.severity == ERROR]
    if violations:
        raise PackingConfigError(violations)
    return cfg
