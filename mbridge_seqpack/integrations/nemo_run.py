"""NeMo-Run plugin: ``SequencePacking(run.Plugin)``, in the pattern of Megatron-Bridge's ``recipes/run_plugins.py``.

For a ``run.Script`` task (Megatron-Bridge's recipe runner and other Hydra-style scripts) it appends the
overrides of the chosen capability, the mixins' facts plus, given the ``base`` config the script builds, every
field the mixins derive from it, and sets ``MBRIDGE_SEQPACK_MODE`` on the executor so the training process
checks its final config (zero-code activation). For a ``run.Partial`` task it applies the mixins to the task's
``config``: a ``run.Config`` stays serializable (wrapped in ``with_capability``, built where the task runs, after a
trial build refuses a capability that cannot hold); a live ``ConfigContainer`` is changed in place.
``nemo-run`` is an optional dependency: ``pip install mbridge-seqpack[nemo-run]``.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from mbridge_seqpack.errors import UsageError
from mbridge_seqpack.modes import MODE_ENV, MODES

try:
    from nemo_run import Partial, Plugin, Script

    HAVE_NEMO_RUN = True
except (ImportError, ModuleNotFoundError):  # the class still imports, so configs and docs can name it
    Partial, Plugin, Script = object, object, object  # type: ignore[assignment,misc]
    HAVE_NEMO_RUN = False

__all__ = [
    "SequencePacking",
    "SequencePackingScriptArgs",
    "script_overrides",
    "with_capability",
    "HAVE_NEMO_RUN",
    "MISSING_NEMO_RUN",
]

logger = logging.getLogger(__name__)

MISSING_NEMO_RUN = (
    "mbridge_seqpack.integrations.nemo_run needs NeMo-Run: pip install 'mbridge-seqpack[nemo-run]' "
    "(or pip install nemo-run)"
)


@dataclass
class SequencePackingScriptArgs:
    """What the plugin passes to a ``run.Script``: dotted path -> value, in a stable order."""

    assignments: dict[str, Any]


def _hydra_converter(args: SequencePackingScriptArgs) -> list[str]:
    """Default converter: Megatron-Bridge's Hydra-style overrides (``++`` inside dicts)."""
    from mbridge_seqpack.overrides import render_override

    return [render_override(path, value) for path, value in args.assignments.items()]


def _value(cfg: Any, path: str) -> Any:
    """The value at ``path``, or None where a parent is missing (e.g. no ``dataset_kwargs``)."""
    from mbridge_seqpack.config_paths import get_path

    try:
        return get_path(cfg, path)
    except ValueError:
        return None


def _fact_assignments(mixins: Sequence[Any]) -> dict[str, Any]:
    from mbridge_seqpack.compose.mixins import SEQ_LENGTH, collect_facts

    out: dict[str, Any] = {}
    for path, value in sorted(collect_facts(mixins).items()):
        if path == "model.cuda_graph_modules":
            value = list(value)
        out[path] = value
        if path == SEQ_LENGTH:
            out["model.seq_length"] = value  # scripts that do not sync it from the dataset still agree
    return out


def script_overrides(mixins: Sequence[Any], base: Any = None) -> dict[str, Any]:
    """Assignments for a ``run.Script``: the facts, and with ``base`` (the config the script starts from) every
    derived field whose value ``apply`` changes. Raises ``PackingConfigError`` if the result breaks a rule."""
    out = _fact_assignments(mixins)
    if base is None:
        return out
    from mbridge_seqpack.compose.mixins import apply

    derived = apply(copy.deepcopy(base), *mixins)
    from mbridge_seqpack.compose.derive import DERIVED_PATHS

    for path in DERIVED_PATHS:
        before, after = _value(base, path), _value(derived, path)
        if after is not None and before != after:
            out.setdefault(path, after)
    return out


@dataclass(kw_only=True)
class SequencePacking(Plugin):  # type: ignore[misc,valid-type]
    """Sequence packing / context parallelism / CUDA graphs for a NeMo-Run task, checked where it trains.

    Args:
        mixins: the capability, as ``mbridge_seqpack.compose.mixins`` objects (``OfflinePacking(8192)``,
            ``ContextParallel(2)``, ``PackedCudaGraphs()``, ...).
        base: for ``run.Script``: the recipe the script builds, as a packaged recipe name,
            ``path/file.py:function`` or a recipe function (NeMo-Run serializes plugins, so a function rather
            than a ConfigContainer; an instance works when ``setup`` is called directly). The script's own
            Hydra-style arguments are applied to it first, then the mixins; every derived field that changes
            (``pad_seq_to_mult = lcm(existing, 2*CP)``, per-token loss, ...) is passed too. Without a base
            only the facts are passed and the training process's hook reports anything left.
        mode: ``MBRIDGE_SEQPACK_MODE`` for the executor: "error" (default), "warn" or "off".
        corrections: opt-in corrections for the training process, by name (``["router_padding_mask"]``:
            Megatron-Bridge PR 5470 backported, the MoE router excludes packed padding); set on the executor as
            ``MBRIDGE_SEQPACK_CORRECTIONS``, installed with the plugin only on the Megatron versions each is written
            for (``check`` says where it is not).
        script_args_converter_fn: turns ``SequencePackingScriptArgs`` into script arguments (default:
            Hydra-style overrides), as Megatron-Bridge's plugins allow.
    """

    mixins: Sequence[Any] = field(default_factory=tuple)
    base: Any = None
    mode: str = "error"
    corrections: Sequence[str] = field(default_factory=tuple)
    script_args_converter_fn: Optional[Callable[[SequencePackingScriptArgs], list[str]]] = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"SequencePacking.mode must be 'error', 'warn' or 'off', got {self.mode!r}")
        from mbridge_seqpack.corrections import check_names

        self.corrections = check_names(
            (self.corrections,) if isinstance(self.corrections, str) else self.corrections,
            "SequencePacking.corrections",
        )
        for mixin in self.mixins:
            if not hasattr(mixin, "facts"):
                raise TypeError(
                    f"SequencePacking.mixins takes mbridge_seqpack.compose.mixins objects; got {type(mixin).__name__}"
                )

    def setup(self, task: Any, executor: Any) -> None:
        if not HAVE_NEMO_RUN:
            raise ImportError(MISSING_NEMO_RUN)
        executor.env_vars[MODE_ENV] = self.mode
        if self.corrections:
            from mbridge_seqpack.corrections import CORRECTIONS_ENV

            executor.env_vars[CORRECTIONS_ENV] = ",".join(self.corrections)
        if isinstance(task, Script):
            args = SequencePackingScriptArgs(script_overrides(self.mixins, self._base_config(task.args)))
            overrides = (self.script_args_converter_fn or _hydra_converter)(args)
            task.args.extend(overrides)
            logger.info(f"{self.__class__.__name__} added CLI overrides: {', '.join(overrides)}")
        elif isinstance(task, Partial):
            self._apply_to_partial(task)
        else:
            raise NotImplementedError(
                f"SequencePacking supports run.Script and run.Partial tasks, not {type(task).__name__}"
            )

    def _base_config(self, script_args: Sequence[str]) -> Any:
        """The base recipe with the script's own ``key=value`` arguments applied (as its runner will)."""
        if self.base is None:
            return None
        from mbridge_seqpack.overrides import apply_overrides, check_override_syntax

        if isinstance(self.base, str):
            from mbridge_seqpack.recipes import load_recipe_target

            cfg = load_recipe_target(self.base)[0]()
        elif callable(self.base):
            cfg = self.base()
        else:
            cfg = copy.deepcopy(self.base)
        own = [arg for arg in script_args if "=" in arg and not arg.startswith("-")]
        check_override_syntax(own)
        return apply_overrides(cfg, own)

    def _apply_to_partial(self, task: Any) -> None:
        """A ``run.Config`` stays a configuration NeMo-Run can serialize: it is wrapped in
        ``run.Config(with_capability, config=..., mixins=[run.Config(Mixin, ...)])``, built where the task runs,
        after a trial build here refuses a capability that cannot hold. A live ConfigContainer is changed in place."""
        import dataclasses

        import fiddle as fdl
        from nemo_run import Config

        from mbridge_seqpack.compose.mixins import apply

        config = getattr(task, "config", None)
        if config is None:
            raise UsageError(
                "SequencePacking: the run.Partial has no `config` argument (a ConfigContainer), "
                "e.g. run.Partial(finetune, config=cfg, forward_step_func=forward_step)"
            )
        if isinstance(config, fdl.Buildable):
            apply(fdl.build(copy.deepcopy(config)), *self.mixins)  # raises PackingConfigError now, not at launch
            mixins = [
                Config(type(m), **{f.name: getattr(m, f.name) for f in dataclasses.fields(m)}) for m in self.mixins
            ]
            task.config = Config(with_capability, config=config, mixins=mixins)
        else:
            task.config = apply(config, *self.mixins)
        logger.info(f"{self.__class__.__name__} applied {', '.join(type(m).__name__ for m in self.mixins)}")


def with_capability(config: Any, mixins: Sequence[Any]) -> Any:
    """``config`` with the mixins applied: what a ``run.Partial``'s config becomes under :class:`SequencePacking`
    (a module-level function, so NeMo-Run serializes it by name and builds it where the task runs)."""
    from mbridge_seqpack.compose.mixins import apply

    return apply(config, *mixins)
