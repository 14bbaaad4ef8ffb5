"""Verdicts many functions share (so one reason is written once and reviewed once)."""

from __future__ import annotations

from devtools.census.verdicts import harmless, unreachable, validated

#: a dataset / collate running in the data-loader process on host tensors
HOST_DATA = harmless(
    "host read of a CPU tensor in dataset / collate code: it runs in the data loader before the step, no device "
    "value is involved and no graph is being captured"
)
#: malformed data, not a config
DATA_CONTENT = harmless(
    "data content: trips only on a malformed example, file or index (a clear message naming it); a config check "
    "cannot see the data's content"
)
#: an internal consistency check whose inputs the same code has just built
INVARIANT = unreachable(
    "internal invariant: the values checked are built a few lines above (or by the only caller) so that it holds"
)
#: a missing package of the pinned stack
ENVIRONMENT = unreachable(
    "environment: a package or build the pinned stack installs is missing; no config value reaches it"
)
#: a programming error: a wrong type or an unknown enum from code, not from a config
API_MISUSE = unreachable(
    "API misuse by calling code (a wrong type, a missing argument, an unknown internal enum value); Megatron's "
    "callers pass well-formed values whatever the config"
)
#: inference / generation only
INFERENCE = unreachable("inference / generation path: training passes no inference context or KV cache")
#: checkpoint conversion / export
CHECKPOINT = unreachable("checkpoint loading / conversion / export: no packed data or CP split reaches it")
#: tensor with fewer bytes, debug and logging
LOGGING = harmless("logging / debugging / timing only: outside the step's captured region and never fatal")
#: re-raise of an exception caught in the same function
RERAISE = harmless("re-raises (or wraps) an exception caught just above: not a new failure point")


def config_class(check: str, fields: tuple[str, ...] = ()) -> object:
    """A config class's own validation: it raises when the config is built or validated, before any GPU work."""
    return validated(check, "Megatron-Bridge's own config-time check: raised before any GPU work", fields)


#: a version gate the pinned TE / torch satisfy
TE_PINNED = unreachable(
    "version gate: the pinned Transformer Engine 2.20.2 / torch 2.13 / Megatron-Core 0.19.2 satisfy it"
)
#: model construction that follows a provider's own layer spec
SPEC_BUILD = unreachable(
    "model construction: the layer spec and arguments come from Megatron-Core's / Megatron-Bridge's own spec "
    "builders, which never pass the refused combination"
)
#: the model's architecture fields
ARCHITECTURE = unreachable(
    "model architecture: the fields come from the provider's (or the Hugging Face config's) model shape and must "
    "match the checkpoint; an override that breaks them builds a model no checkpoint loads, not a packing or "
    "parallelism choice"
)


def enum_gap(*fields: str) -> object:
    """A value outside a field's documented choices: dataclass ``Literal`` types are not enforced, so a typo in an
    override reaches the code that dispatches on it."""
    from devtools.census.verdicts import gap

    return gap(
        tuple(fields),
        "a value outside the field's documented choices (a typo in an override: dataclass Literal types are not "
        "enforced, and neither TransformerConfig nor ConfigContainer.validate checks this one) raises when the "
        "model / data loader is built or at the first forward",
        general=True,
    )


def known_value(*fields: str) -> object:
    """A value outside a field's declared Literal choices, refused at validate() by the values rule."""
    from devtools.census.verdicts import guarded

    return guarded(
        "config.known_values",
        "a value outside the field's declared (Literal) choices raises where Megatron dispatches on it; the rule "
        "reads the choices from the annotations and refuses any other value",
        tuple(fields),
    )
