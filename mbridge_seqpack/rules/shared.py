"""Helpers that rules of more than one family call (one copy here; no rule is registered in this module)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mbridge_seqpack.analysis.attention_backend import (
    env_value,
)
from mbridge_seqpack.rules.context import RuleContext


def _seq_length_fix(ctx: RuleContext, new_length: int) -> dict[str, int]:
    """Move every copy of the sequence length together (model, dataset, pack size)."""
    fix = {"model.seq_length": new_length}
    if hasattr(ctx.dataset, "seq_length"):
        fix["dataset.seq_length"] = new_length
    if ctx.specs is not None:
        fix["dataset.offline_packing_specs.packed_sequence_size"] = new_length
    return fix


def no_packing(ctx: RuleContext) -> dict[str, Any]:
    """The assignments that turn this config's packing off (the last-resort fix of a packed-vs-unpacked finding)."""
    if ctx.offline_packing:
        return {"dataset.enable_offline_packing": False, "dataset.offline_packing_specs": None}
    return {"dataset.enable_in_batch_packing": False}


def _env_value(ctx: RuleContext, name: str) -> str | None:
    """The value the training process will see (the launch environment's, else ``env_vars``)."""
    return env_value(ctx.cfg, name)


def packed_split_files(ctx: RuleContext, split: str) -> list[Path]:
    """The existing Parquet files Megatron-Bridge's builder will read for a packed split: the explicit packed path
    (file, directory or glob, as data/packing/paths.py resolves it), else the builder's default location when the
    pack is already there; [] when the pack does not exist yet (the builder makes it at launch), is legacy .npy, or
    is stale for this config (``artifact.fingerprint_mismatch`` reports it, and its rows are not what will train)."""
    from megatron.bridge.data.packing.paths import is_packed_parquet_spec, resolve_packed_parquet_paths

    from mbridge_seqpack.artifact.builder_location import builder_location
    from mbridge_seqpack.rules.artifact import pack_matches_config

    field = {"training": "packed_train_data_path", "validation": "packed_val_data_path"}[split]
    spec = getattr(ctx.specs, field, None)
    if spec is not None:
        if not is_packed_parquet_spec(str(spec)):
            return []
        try:
            files = [Path(p) for p in resolve_packed_parquet_paths(str(spec))]
        except ValueError:
            return []  # artifact.fingerprint_mismatch names it
    else:
        location = builder_location(ctx.cfg)
        path = location.split_path(split) if location is not None else None
        files = [path] if path is not None and path.is_file() else []
    return files if files and pack_matches_config(ctx, split, files) else []


def parquet_rows(files: list[Path]) -> int | None:
    """Rows of the Parquet files (from their footers), or None when one cannot be read."""
    import pyarrow.parquet as pq

    try:
        return sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    except (OSError, ValueError):
        return None


def _mask_dropped_reason(ctx: RuleContext) -> str:
    """Why the dataset's attention mask never reaches an attention that applies it."""
    if not getattr(ctx.dataset, "create_attention_mask", True):
        return "create_attention_mask=False builds no mask at all"
    if getattr(ctx.dataset, "skip_getting_attention_mask_from_dataset", True):
        return (
            "Megatron-Bridge's get_batch drops the dataset's mask (skip_getting_attention_mask_from_dataset=True, "
            "the default)"
        )
    return "Transformer Engine's causal attention ignores attention_mask (it reads one only for padding/arbitrary)"


MAMBA, GDN = "M", "G"  # megatron/core/models/hybrid/hybrid_layer_allocation.py Symbols


def hybrid_layer_counts(model: Any) -> dict[str, int]:
    """Layers by type symbol a hybrid provider builds (main pattern and MTP depths), by Megatron-Core's own parser of
    ``hybrid_layer_pattern`` (HybridModelProvider.finalize moves the deprecated override pattern there; provide()
    passes the pattern alone, never the deprecated ratios); {} for other providers, no pattern, or a pattern
    Megatron will refuse itself."""
    from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider
    from megatron.core.models.hybrid.hybrid_layer_allocation import get_hybrid_layer_counts

    if not isinstance(model, HybridModelProvider):
        return {}
    from mbridge_seqpack.moe_layers import hybrid_pattern

    pattern = hybrid_pattern(model)
    if pattern is None:
        return {}
    try:
        return dict(get_hybrid_layer_counts(pattern))
    except (AssertionError, ValueError):
        return {}
