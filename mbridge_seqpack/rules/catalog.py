"""Imports every rule module so the registry holds the full catalog, in this order."""

from mbridge_seqpack.rules import (  # noqa: F401
    types,
    parallelism,
    offline,
    in_batch,
    batch,
    cuda_graphs,
    models,
    energon,
    artifacts,
)
