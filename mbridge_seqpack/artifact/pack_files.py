"""The pack files a config trains on, found as Megatron-Bridge finds them, and the launch's content plan over them.

An engine, not a rule: the ``artifact`` rules judge these files at ``validate()`` in O(metadata); the hook and the
check's report ask :func:`content_plan` for the bytes the launch reads in full on rank 0 while the model is built
(artifact/launch_guard.py), stopping before the first optimizer step if one differs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from mbridge_seqpack.artifact.content_check import ContentPlan

__all__ = ["PATH_FIELDS", "tokenizer_dir", "resolve_packed", "builder_default_files", "content_plan"]

#: the packed-path fields of ``offline_packing_specs`` -> the split each names
PATH_FIELDS = {"packed_train_data_path": "training", "packed_val_data_path": "validation"}


def tokenizer_dir(cfg: ConfigContainer) -> Path | None:
    """The configured tokenizer when it is local: a Hugging Face directory, or a single-file tokenizer (a
    SentencePiece ``.model``); a hub id, or none: nothing local to compare."""
    from mbridge_seqpack.digests import note_read

    model = getattr(getattr(cfg, "tokenizer", None), "tokenizer_model", None)
    if model is not None:
        note_read(str(model))
    local = model is not None and (Path(str(model)).is_dir() or Path(str(model)).is_file())
    return Path(str(model)) if local else None


def resolve_packed(spec: str) -> tuple[list[Path], str | None]:
    """The files Megatron-Bridge's packed dataset reads for ``spec`` (file, directory or glob), or why none."""
    from megatron.bridge.data.packing.paths import is_packed_parquet_spec, resolve_packed_parquet_paths

    from mbridge_seqpack.digests import note_read

    note_read(spec if not any(c in spec for c in "*?[") else Path(spec).parent)
    if not is_packed_parquet_spec(spec):
        return [], None if Path(spec).exists() else "does not exist"
    try:
        return [Path(p) for p in resolve_packed_parquet_paths(spec)], None
    except ValueError as exc:
        return [], str(exc)


def builder_default_files(cfg: ConfigContainer) -> dict[str, Path]:
    """The packed files Megatron-Bridge's builder will train on from its default location (no packed path set;
    validation only under ``do_validation``) that exist already: a pack there is used as it is, never re-made."""
    from mbridge_seqpack.artifact.builder_location import builder_location
    from mbridge_seqpack.digests import note_read

    dataset = cfg.dataset
    specs = dataset.offline_packing_specs
    wanted = {"training": specs.packed_train_data_path is None}
    wanted["validation"] = specs.packed_val_data_path is None and bool(getattr(dataset, "do_validation", True))
    if not any(wanted.values()):
        return {}
    location = builder_location(cfg)
    if location is None:
        return {}
    note_read(location.directory)
    for split in wanted:
        note_read(location.split_path(split))
    return {
        split: location.split_path(split)
        for split, default in wanted.items()
        if default and location.split_path(split).is_file()
    }


def content_plan(cfg: ConfigContainer) -> ContentPlan:
    """What the launch reads in full before its first optimizer step: every sealed pack file this config trains
    on (explicit packed paths and the builder's default location), the JSONL each split was made from where the
    config names it, and the tokenizer files (artifact/content_check.py). A file without a readable seal is left
    out (the rule refuses it at validate())."""
    from mbridge_seqpack.artifact.builder_location import jsonl_root
    from mbridge_seqpack.artifact.content_check import ContentPlan, PackFile, SourceFile, TokenizerFiles
    from mbridge_seqpack.artifact.store import ArtifactError
    from mbridge_seqpack.artifact.verified_parquet import find_seal

    plan = ContentPlan()
    specs = getattr(cfg.dataset, "offline_packing_specs", None)
    if specs is None:
        return plan
    files = []
    for name in PATH_FIELDS:
        value = getattr(specs, name, None)
        if value is not None:
            files += resolve_packed(str(value))[0]
    defaults = {path.resolve() for path in builder_default_files(cfg).values()}
    files += list(builder_default_files(cfg).values())
    root = jsonl_root(cfg)
    seen: set[Path] = set()
    for path in files:
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        try:
            seal = find_seal(path)
        except (ArtifactError, OSError):
            continue  # artifact.fingerprint_mismatch refuses it
        if seal is None:
            continue
        plan.packs.append(PackFile(path, seal.file_bytes, seal.file_sha256, seal.tiles))
        fp = seal.entry.fingerprint or {}
        explicit = path.resolve() not in defaults
        made_from = seal.entry.input_path if explicit else None
        source = (
            Path(made_from)
            if isinstance(made_from, str) and made_from
            else (root / f"{seal.entry.split}.jsonl" if root is not None else None)
        )
        if source is not None and source.is_file() and fp.get("input_sha256"):
            if all(s.path != source for s in plan.sources):
                plan.sources.append(SourceFile(source, str(fp["input_sha256"]), str(seal.entry.split)))
        directory = tokenizer_dir(cfg)
        if plan.tokenizer is None and directory is not None and fp.get("tokenizer_sha256"):
            plan.tokenizer = TokenizerFiles(directory, str(fp["tokenizer_sha256"]))
    return plan
