"""Stale-pack rule: explicit packed paths must carry a fingerprint that agrees with the config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.rules.context import RuleContext
from mbridge_seqpack.rules.registry import rule

SPECS = "dataset.offline_packing_specs"


def _tokenizer_sha(cfg: Any) -> str | None:
    """sha256 of the configured tokenizer's tokenizer.json, when it is a local file or directory."""
    from mbridge_seqpack.packing.sequences import tokenizer_identity

    model = getattr(getattr(cfg, "tokenizer", None), "tokenizer_model", None)
    if model is None:
        return None
    path = Path(str(model))
    if not (path / "tokenizer.json").is_file() and not (path.is_file() and path.name.endswith(".json")):
        return None  # a hub id or a non-HF tokenizer: nothing local to compare
    return tokenizer_identity(path)


def _compare(ctx: RuleContext, field_path: str, artifact: str, info: dict[str, Any]) -> list[Violation]:
    found = []
    fp = info.get("fingerprint", {})
    specs = ctx.specs
    checks = [
        ("pack_size", fp.get("pack_size"), f"{SPECS}.packed_sequence_size", specs.packed_sequence_size),
        ("pad_seq_to_mult", fp.get("pad_seq_to_mult"), f"{SPECS}.pad_seq_to_mult", specs.pad_seq_to_mult or 1),
    ]
    for key, packed, cfg_path, configured in checks:
        if packed != configured:
            found.append(Violation(
                "artifact.fingerprint_mismatch",
                {field_path: artifact, f"artifact {key}": packed, cfg_path: configured},
                f"the pack at {artifact} was built with {key}={packed}, the config asks for {configured}; "
                "reusing it would train on rows of the wrong shape or alignment",
                fix=f"re-pack: mbridge-seqpack pack INPUT.jsonl --pack-size {specs.packed_sequence_size} "
                f"--pad-seq-to-mult {specs.pad_seq_to_mult or 1} --tokenizer TOKENIZER (or point {field_path} at "
                f"a matching pack)",
            ))
    tok_sha = _tokenizer_sha(ctx.cfg)
    if tok_sha is not None and fp.get("tokenizer_sha256") not in (None, tok_sha):
        found.append(Violation(
            "artifact.fingerprint_mismatch",
            {field_path: artifact, "artifact tokenizer_sha256": fp.get("tokenizer_sha256"),
             "tokenizer.tokenizer_model sha256": tok_sha},
            f"the pack at {artifact} was tokenized with a different tokenizer ({fp.get('tokenizer')}) than "
            f"tokenizer.tokenizer_model",
            fix=f"re-pack with --tokenizer {ctx.cfg.tokenizer.tokenizer_model}",
        ))
    return found


@rule(
    "artifact.fingerprint_mismatch",
    "Explicit packed paths must match the config (pack size, alignment, tokenizer).",
    severity=ERROR,
    evidence=(
        "data/packing/parquet.py GPTSFTPackedParquetDataset reads whatever rows the path holds; nothing in "
        "Megatron-Bridge compares them with the config, so a pack built for another size, alignment or "
        "tokenizer trains silently wrong (misaligned THD splits, wrong token ids)."
    ),
)
def fingerprint_mismatch(ctx: RuleContext) -> list[Violation] | None:
    from mbridge_seqpack.packing.artifact import ArtifactError, read_parquet_fingerprint

    specs = ctx.specs
    if specs is None:
        return None
    paths = [(f"{SPECS}.{name}", getattr(specs, name)) for name in ("packed_train_data_path", "packed_val_data_path")
             if getattr(specs, name) is not None and Path(str(getattr(specs, name))).is_file()]
    if not paths:
        return None
    found: list[Violation] = []
    for field_path, value in paths:
        try:
            info = read_parquet_fingerprint(value)
        except ArtifactError as exc:
            found.append(Violation("artifact.fingerprint_mismatch", {field_path: str(value)}, str(exc),
                                   fix=f"re-run mbridge-seqpack pack and point {field_path} at its output"))
            continue
        if info is None:
            continue  # not written by this plugin: nothing to compare
        found += _compare(ctx, field_path, str(value), info)
        meta = specs.packed_metadata_path
        if meta is not None and Path(str(meta)).is_file():
            try:
                entries = json.loads(Path(str(meta)).read_text())
                fps = [e.get("fingerprint") for e in entries if isinstance(e, dict)]
            except (OSError, json.JSONDecodeError, AttributeError):
                fps = []
            if info.get("fingerprint") not in fps:
                found.append(Violation(
                    "artifact.fingerprint_mismatch",
                    {field_path: str(value), f"{SPECS}.packed_metadata_path": str(meta)},
                    "the metadata file was written by a different pack run than the packed data; static "
                    "cu_seqlens would be sized for other rows",
                    fix=f"point {SPECS}.packed_metadata_path at the metadata written next to {value}",
                ))
    return found
