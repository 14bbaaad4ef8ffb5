"""Stale, mixed or broken packs: explicit packed paths must resolve, as Megatron-Bridge resolves them, to one
sealed, complete pack that agrees with the config; so must a sealed pack in the builder's default location
(artifact/builder_location.py), which Megatron-Bridge trains on as it finds it.

At ``validate()`` the checks cost O(metadata): sizes, the metadata seal, the Parquet footers read and hashed on
rank 0, the sizes of the inputs. Nothing is trusted by a file's stamp. The bytes themselves are what
artifact/pack_files.py ``content_plan`` lists: the launch reads them in full on rank 0 while the model is built and
stops before the first optimizer step if one differs (artifact/launch_guard.py), and every row group is verified
again where Megatron-Bridge's packed dataset reads it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mbridge_seqpack.artifact.pack_files import PATH_FIELDS, builder_default_files, resolve_packed, tokenizer_dir
from mbridge_seqpack.errors import ADVISORY, ERROR, Violation
from mbridge_seqpack.ranks import is_rank_zero
from mbridge_seqpack.rules.context import (
    DATASET_KWARGS_READS,
    PACK_FINGERPRINT_READS,
    PACK_PATH_READS,
    SPECS,
    TOPOLOGY_READS,
    RuleContext,
)
from mbridge_seqpack.rules.field_types import (
    ANY_INT,
    OPTIONAL_INT,
    OPTIONAL_MICRO_BATCH,
    OPTIONAL_NAME,
    OPTIONAL_PATH,
    OPTIONAL_POSITIVE_INT,
    POSITIVE_INT,
    UNCHECKED,
)
from mbridge_seqpack.rules.registry import rule

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from mbridge_seqpack.artifact.pack_entry import PackEntry
    from mbridge_seqpack.artifact.store import Fingerprint
    from mbridge_seqpack.placement.record import BalanceRecord


def _tokenizer_differs(cfg: ConfigContainer, sealed: str | None) -> bool:
    """Whether the configured tokenizer's files differ from those the pack was tokenized with. Remembered digests
    that agree are a hint (the launch's content check reads the files again); a disagreement is confirmed by
    reading them (small files) before anything is refused, and only digests that match the seal are remembered."""
    from mbridge_seqpack.artifact.content_check import TokenizerFiles
    from mbridge_seqpack.digests import recalled_sha256
    from mbridge_seqpack.tokenization.sequences import InputError, tokenizer_files_sha256

    directory = tokenizer_dir(cfg)
    if directory is None or not sealed:
        return False
    try:
        if tokenizer_files_sha256(directory, lambda path: recalled_sha256(path) or "") == sealed:
            return False
    except InputError:
        return False
    return TokenizerFiles(directory, sealed).check(lambda n: None) is not None


def _violation(
    field: str, spec: str, why: str, fix: str, assignments: dict[str, Any] | None = None, **extra: Any
) -> Violation:
    return Violation({field: spec, **extra}, why, fix=fix, assignments=assignments or {})


def _matching_the_pack(field: str, key: str, packed: int) -> dict[str, Any]:
    """The overrides that make the config read the pack it names as it was made (``check --fix`` offers them; the
    fix text offers re-packing instead): only for a pack the config names by path, since the builder's own
    location moves with these fields. The length is ``dataset.seq_length``'s, the model's follows it."""
    if field not in {f"{SPECS}.{name}" for name in PATH_FIELDS}:
        return {}
    if key == "pack_size":
        return {f"{SPECS}.packed_sequence_size": packed, "dataset.seq_length": packed, "model.seq_length": packed}
    return {f"{SPECS}.pad_seq_to_mult": packed}


def _repack_fix(ctx: RuleContext, field: str) -> str:
    specs = ctx.specs
    return (
        f"re-run `mbridge-seqpack pack --pack-size {specs.packed_sequence_size} --pad-seq-to-mult "
        f"{specs.pad_seq_to_mult or 1} --tokenizer TOKENIZER --output DIR` (or `pack --recipe ...`) and set "
        f"{field}=DIR/<split>_{specs.packed_sequence_size}.idx.parquet"
    )


def _check_files(
    ctx: RuleContext, field: str, spec: str, split: str, files: list[Path], fix: str | None = None
) -> list[Violation]:
    from mbridge_seqpack.artifact.seal import entry_for, find_metadata, lost_fingerprint_problem, seal_problems
    from mbridge_seqpack.artifact.seal_key import unsealed_problem
    from mbridge_seqpack.artifact.store import ArtifactError, Fingerprint, read_parquet_fingerprint

    fix = fix or _repack_fix(ctx, field)
    found: list[Violation] = []
    infos = []
    made_from = None  # the input the (first) sealed entry says its split was packed from
    for path in files:
        try:
            info = read_parquet_fingerprint(path)
        except ArtifactError as exc:
            return [_violation(field, spec, str(exc), fix)]
        meta, entries, problem = find_metadata(path.parent)
        if info is None:  # unsealed (e.g. Megatron-Bridge's own prep): nothing to compare, unless it lost its seal
            lost = (
                lost_fingerprint_problem(path, meta, entries)
                or _unsealed_beside_sealed(meta, entries)
                or unsealed_problem()  # a seal key is set: only packs sealed with it train
            )
            if lost:
                found.append(_violation(field, spec, f"{path}: {lost}", fix))
            continue
        # every rank validates the config at start-up: rank 0 reads the footers (O(metadata)), the others check
        # sizes; the row groups are read by the launch's content check and where the dataset reads them
        problems = (
            [problem]
            if problem
            else seal_problems(
                path, info, entry_for(entries, info), meta, contents="footer" if is_rank_zero() else "size"
            )
        )
        if problems:
            found.append(_violation(field, spec, f"{path}: {problems[0]}", fix))
            continue
        infos.append((path, info))
        made_from = made_from or getattr(entry_for(entries, info), "input_path", None)
    splits = {str(i.get("split")) for _, i in infos}
    if splits - {split}:
        found.append(
            _violation(
                field,
                spec,
                f"resolves to {len(files)} file(s) holding split(s) {sorted(splits)}; "
                f"Megatron-Bridge would read all of them as {split} data",
                fix,
                **{"artifact split": sorted(splits), "read as": split},
            )
        )
    prints = {repr(sorted(Fingerprint.from_dict(i["fingerprint"]).settings().items())) for _, i in infos}
    if len(prints) > 1:
        found.append(
            _violation(
                field,
                spec,
                f"resolves to files of {len(prints)} different pack runs (mixed pack sizes or settings)",
                fix,
            )
        )
    if found or not infos:
        return found
    sealed = infos[0][1]["fingerprint"]
    fp = Fingerprint.from_dict(sealed)
    specs = ctx.specs
    for key, cfg_path, configured in (
        ("pack_size", f"{SPECS}.packed_sequence_size", specs.packed_sequence_size),
        ("pad_seq_to_mult", f"{SPECS}.pad_seq_to_mult", specs.pad_seq_to_mult or 1),
    ):
        packed = getattr(fp, key)
        if packed != configured:
            found.append(
                _violation(
                    field,
                    spec,
                    f"the pack was built with {key}={packed}, the config asks for "
                    f"{configured}; it would train on rows of the wrong shape or alignment",
                    fix,
                    _matching_the_pack(field, key, packed),
                    **{f"artifact {key}": packed, cfg_path: configured},
                )
            )
    if is_rank_zero() and _tokenizer_differs(ctx.cfg, fp.tokenizer_sha256):
        found.append(
            _violation(
                field,
                spec,
                f"the pack was tokenized with another tokenizer ({fp.tokenizer}) than tokenizer.tokenizer_model",
                f"re-pack with --tokenizer {ctx.cfg.tokenizer.tokenizer_model}",
                **{
                    "artifact tokenizer": fp.tokenizer,
                    "tokenizer.tokenizer_model": str(ctx.cfg.tokenizer.tokenizer_model),
                },
            )
        )
    found += _tokenizer_settings_differ(ctx, field, spec, fp)
    found += _content_differences(ctx, field, spec, fp, fix)
    found += _input_differs(ctx, field, spec, split, fp, fix, made_from=made_from)
    meta = specs.packed_metadata_path
    if meta is not None and Path(str(meta)).is_file():
        _, entries, _ = find_metadata(Path(str(meta)).parent) if Path(str(meta)).parent.is_dir() else (None, [], None)
        if Path(str(meta)).name.endswith("_metadata.jsonl") and sealed not in [e.fingerprint for e in entries or []]:
            found.append(
                _violation(
                    field,
                    spec,
                    "packed_metadata_path was written by a different pack run than the "
                    "packed data; static cu_seqlens would be sized for other rows",
                    f"set {SPECS}.packed_metadata_path={infos[0][0].parent / Path(str(meta)).name}",
                    {f"{SPECS}.packed_metadata_path": str(infos[0][0].parent / Path(str(meta)).name)},
                    **{f"{SPECS}.packed_metadata_path": str(meta)},
                )
            )
    return found


def _sealed_entries(entries: list[PackEntry] | None) -> list[PackEntry]:
    """The metadata entries this plugin sealed (they carry their file's checksums); Megatron-Bridge's prep writes
    entries without them."""
    return [e for e in entries or [] if e.sealed]


def _unsealed_beside_sealed(meta: Path | None, entries: list[PackEntry] | None) -> str | None:
    """An unsealed Parquet file in a folder whose metadata seals a pack: not part of that pack (Megatron-Bridge's
    prep writes such a file there when a launch finds a split missing), so nothing vouches for its rows."""
    sealed = _sealed_entries(entries)
    if meta is None or not sealed:
        return None
    splits = sorted({str(e.split) for e in sealed})
    return (
        f"not sealed, though {meta.name} beside it seals a pack of split(s) {splits}: a file added to a sealed "
        "folder (Megatron-Bridge's prep writes one there when a launch finds a split missing), nothing vouches "
        "for its rows"
    )


def _prepared_into_sealed(ctx: RuleContext) -> list[Violation]:
    """A split the launch will prepare (its packed file is missing) while the metadata file it appends to is a
    sealed pack's: Megatron-Bridge's builder (data/builders/gpt_sft.py GPTSFTDatasetBuilder.prepare_packed_data)
    prepares the missing split and writes its entry into that file, so the sealed folder is changed by the launch
    and its own reads then refuse it with another cause. Refused before anything is written."""
    from mbridge_seqpack.artifact.builder_location import builder_location
    from mbridge_seqpack.artifact.seal import find_metadata

    specs = ctx.specs
    location = builder_location(ctx.cfg)
    meta = Path(str(specs.packed_metadata_path)) if specs.packed_metadata_path is not None else None
    if meta is None and location is not None:
        meta = location.metadata
    if meta is None or not meta.is_file():
        return []
    _, entries, problem = find_metadata(meta.parent)
    sealed = _sealed_entries(entries) if problem is None else []
    if not sealed:
        return []
    # an explicit packed path that resolves to nothing is refused by fingerprint_mismatch itself; a split without
    # one is prepared into the builder's default location unless a pack is there
    wanted = {"training": specs.packed_train_data_path}
    if getattr(ctx.dataset, "do_validation", True):
        wanted["validation"] = specs.packed_val_data_path
    found = []
    for split, explicit in wanted.items():
        target = location.split_path(split) if explicit is None and location is not None else None
        if target is None or target.exists():
            continue
        field = f"{SPECS}.packed_{'train' if split == 'training' else 'val'}_data_path"
        packed = sorted({str(e.split) for e in sealed})
        fix = f"pack the {split} split into that folder (re-run `mbridge-seqpack pack` with it), or set {field}"
        fix += " to a sealed pack of it" if split == "training" else " to a sealed pack of it, or do_validation=False"
        found.append(
            Violation(
                {field: str(target), f"{SPECS}.packed_metadata_path": str(meta), "sealed splits": packed},
                f"the {split} split is missing from the sealed pack whose metadata is {meta}: Megatron-Bridge's "
                f"builder would prepare it at launch, into {target}, and append its entry to the sealed metadata "
                "file, which the launch's own reads then refuse",
                fix=fix,
                assignments={"dataset.do_validation": False} if split == "validation" else {},
            )
        )
    return found


def _prepared_under_key(ctx: RuleContext) -> list[Violation]:
    """With a seal key set, the training split Megatron-Bridge's builder would prepare at launch (no packed path,
    nothing in its default location: GPTSFTDatasetBuilder.prepare_packed_data) would train on an unsealed pack:
    refused, as an unsealed pack already there is. (A validation split it prepares is evaluated, not trained on.)"""
    from mbridge_seqpack.artifact.builder_location import builder_location
    from mbridge_seqpack.artifact.seal_key import SEAL_COMMAND, unsealed_problem

    if ctx.specs.packed_train_data_path is not None or unsealed_problem() is None:
        return []
    location = builder_location(ctx.cfg)
    target = location.split_path("training") if location is not None else None
    if target is None or target.exists():
        return []
    problem = unsealed_problem("no training pack there: Megatron-Bridge's builder would prepare one, unsealed")
    return [
        Violation(
            {f"{SPECS}.packed_train_data_path": str(target)},
            str(problem),
            fix=f"pack it first with this config: {SEAL_COMMAND}",
        )
    ]


def _tokenizer_settings_differ(ctx: RuleContext, field: str, spec: str, fp: Fingerprint) -> list[Violation]:
    """The tokenizer config fields the launch's tokenizer build reads (type, chat template or its file, HF kwargs,
    special tokens, ...: tokenization/tokenizer_settings.py) against those the pack was tokenized with. A pack
    sealed before they were recorded has nothing to compare."""
    import json

    from mbridge_seqpack.tokenization.tokenizer_settings import settings_differences, tokenizer_settings

    configured_config = getattr(ctx.cfg, "tokenizer", None)
    if not fp.tokenizer_settings or configured_config is None:
        return []
    try:
        packed = json.loads(fp.tokenizer_settings)
    except (TypeError, ValueError):
        packed = None
    if not isinstance(packed, dict):
        return [_violation(field, spec, "its sealed tokenizer settings are unreadable", "re-run mbridge-seqpack pack")]
    configured = tokenizer_settings(configured_config)
    differ = settings_differences(packed, configured)
    if not differ:
        return []
    named: dict[str, Any] = {}
    for key, (_, now) in differ.items():
        if key == "chat_template" and configured.get("chat_template_path"):  # compared by content, set by its file
            named["tokenizer.chat_template_path"] = configured["chat_template_path"]
        else:
            named[f"tokenizer.{key}"] = now
    said = "; ".join(f"{key}: pack {json.dumps(was)}, config {json.dumps(now)}" for key, (was, now) in differ.items())
    return [
        _violation(
            field,
            spec,
            f"the pack was tokenized with other tokenizer settings than tokenizer.* ({said}); Megatron-Bridge's "
            "launch builds its tokenizer from them, so the pack holds other tokens than this config trains on",
            "re-pack with `mbridge-seqpack pack --recipe ...` and this config's overrides (it takes the tokenizer "
            "settings from the recipe)",
            **named,
        )
    ]


def _content_differences(ctx: RuleContext, field: str, spec: str, fp: Fingerprint, fix: str) -> list[Violation]:
    """What the pack was tokenized with against what Megatron-Bridge's prep would use for this config: the
    content-changing dataset_kwargs (with ``dataset.preprocessing`` folded in) and the longest sequence kept."""
    import json

    from mbridge_seqpack.tokenization.dataset_kwargs import config_dataset_kwargs, content_kwargs

    found = []
    try:
        packed = json.loads(fp.dataset_kwargs or "{}")
    except (TypeError, ValueError):
        packed = None
    if isinstance(packed, dict):
        ours, theirs = content_kwargs(config_dataset_kwargs(ctx.dataset)), content_kwargs(packed)
        differ = [key for key in ours if ours[key] != theirs[key]]
        if differ:
            said = "; ".join(f"{key}: pack {theirs[key]}, config {ours[key]}" for key in differ)
            found.append(
                _violation(
                    field,
                    spec,
                    f"the pack was tokenized with other dataset_kwargs / dataset.preprocessing ({said}); it holds "
                    "other tokens or loss masks than this config would train on",
                    fix,
                    **{f"dataset.dataset_kwargs.{key}": ours[key] for key in differ},
                )
            )
    configured = ctx.specs.max_single_sequence_length or getattr(ctx.dataset, "seq_length", None)
    if fp.max_seq_length is not None and configured is not None and fp.max_seq_length != configured:
        found.append(
            _violation(
                field,
                spec,
                f"the pack kept sequences up to {fp.max_seq_length} tokens, the config's prep keeps up to "
                f"{configured} (max_single_sequence_length, else dataset.seq_length)",
                fix,
                **{"artifact max_seq_length": fp.max_seq_length, f"{SPECS}.max_single_sequence_length": configured},
            )
        )
    return found


def compared_source(ctx: RuleContext, field: str, split: str, made_from: Any) -> tuple[Path | None, bool]:
    """The JSONL a pack is compared with, and whether it is the one the config names. A pack at the builder's
    default location (or one sealed before packs recorded their input) against ``dataset_root/<split>.jsonl``,
    where Megatron-Bridge's builder prepares it from; an explicit packed path against the file it was made from
    (the launch trains on that pack and never reads ``dataset_root``: ``pack --recipe R INPUT`` then ``check`` with
    the overrides it prints must pass)."""
    from mbridge_seqpack.artifact.builder_location import jsonl_root

    if field != "dataset.dataset_root" and isinstance(made_from, str) and made_from:
        return Path(made_from), False
    root = jsonl_root(ctx.cfg)
    return (root / f"{split}.jsonl" if root is not None else None), True


def _input_differs(
    ctx: RuleContext, field: str, spec: str, split: str, fp: Fingerprint, fix: str, made_from: Any = None
) -> list[Violation]:
    """The pack against the JSONL it is compared with (:func:`compared_source`): another size, or a remembered digest
    that a full read confirms, means the data changed since packing. Same size and no disagreeing record: the
    launch's content check reads it (rank 0, before the first optimizer step). Rank 0 only, as for the pack's own
    contents."""
    if not fp.input_sha256 or not is_rank_zero():
        return []
    from mbridge_seqpack.artifact.builder_location import jsonl_root
    from mbridge_seqpack.digests import note_read, recalled_sha256, verified_sha256

    source, configured = compared_source(ctx, field, split, made_from)
    if source is not None:
        note_read(source)
    if source is None or not source.is_file():
        return []

    size = source.stat().st_size
    if fp.input_bytes is not None and size != fp.input_bytes:
        why = f"{size} bytes, the pack was made from {fp.input_bytes}"
    else:
        recalled = recalled_sha256(source)
        if recalled is None or recalled == fp.input_sha256:
            return []  # deferred to the launch's content check
        if verified_sha256(source, fp.input_sha256) == fp.input_sha256:  # the record was stale: read, not trusted
            return []
        why = "sha256 differs"
    return [
        _violation(
            field,
            spec,
            f"the pack was made from another {split} file than {source} ({why}): the data changed since "
            "packing, or the pack belongs to another dataset",
            fix,
            **(
                {
                    "dataset.dataset_root"
                    if getattr(ctx.dataset, "dataset_root", None) is not None
                    else "materialized Hugging Face dataset": str(jsonl_root(ctx.cfg))
                }
                if configured
                else {"pack input": str(source)}
            ),
        )
    ]


def pack_matches_config(ctx: RuleContext, split: str, files: list[Path]) -> bool:
    """Whether ``files`` are the sealed pack this config trains on (no ``artifact.fingerprint_mismatch`` finding):
    rules that judge a pack's contents (its row counts, say) read only such a pack; a stale one is re-made."""
    return not _check_files(ctx, f"{SPECS}.{split}", ", ".join(map(str, files)), split, files)


@rule(
    "artifact.fingerprint_mismatch",
    "Packed paths (explicit, or the builder's default location) hold one sealed, complete pack matching the config.",
    severity=ERROR,
    evidence=(
        "data/packing/paths.py resolve_packed_parquet_paths reads every Parquet file of a directory or glob and "
        "data/packing/parquet.py GPTSFTPackedParquetDataset trains on all their rows; nothing in Megatron-Bridge "
        "compares them with the config or with each other, so a directory holding the validation split, a pack "
        "of another size, alignment or tokenizer, or a corrupted file trains silently wrong. With no packed path, "
        "data/builders/gpt_sft.py GPTSFTDatasetBuilder._prepare_packed_split skips its prep when its "
        "default_pack_path holds the file already (keyed by tokenizer name and config, not by the input data or "
        "tokenizer files), so a pack left there from other data trains silently too. A split whose packed file is "
        "missing is prepared at launch (GPTSFTDatasetBuilder.prepare_packed_data) and its entry appended to the "
        "configured metadata file: into a sealed pack's folder, which its verified reads then refuse."
    ),
    reads={
        **PACK_FINGERPRINT_READS,
        **DATASET_KWARGS_READS,
        **PACK_PATH_READS,
        "dataset.do_validation": UNCHECKED,
        "dataset.offline_packing_specs.packed_val_data_path": OPTIONAL_PATH,
    },
)
def fingerprint_mismatch(ctx: RuleContext) -> list[Violation] | None:
    specs = ctx.specs
    if specs is None:
        return None
    found: list[Violation] = []
    checked = False
    for name, split in PATH_FIELDS.items():
        value = getattr(specs, name)
        if value is None:
            continue
        field, spec = f"{SPECS}.{name}", str(value)
        files, problem = resolve_packed(spec)
        if problem:
            found.append(
                _violation(
                    field, spec, f"Megatron-Bridge finds no packed data there ({problem})", _repack_fix(ctx, field)
                )
            )
            continue
        checked = checked or bool(files)
        found += _check_files(ctx, field, spec, split, files)
    prepared = _prepared_into_sealed(ctx) or _prepared_under_key(ctx)
    checked, found = checked or bool(prepared), found + prepared
    for split, path in builder_default_files(ctx.cfg).items():
        checked = True
        fix = (
            f"re-run `mbridge-seqpack pack --recipe ... --overwrite` with this config (it replaces the pack there), "
            f"or delete {path.parent} to let Megatron-Bridge prepare it"
        )
        found += _check_files(ctx, "dataset.dataset_root", str(path), split, [path], fix)
    return found if (checked or found) else None


def _layout_read_by(ctx: RuleContext) -> dict[str, Any]:
    """How this config will read the training rows: sampler, its seed, DP ranks and rows per rank per step."""
    dataloader = getattr(ctx.dataset, "dataloader_type", None)
    dp = ctx.topology.data_parallel
    gbs = getattr(ctx.train, "global_batch_size", None)
    return {
        "sampler": dataloader,
        "sampler_seed": ctx.sampler_seed,
        "data_parallel": dp,
        "micro_batches": gbs // dp if isinstance(gbs, int) and dp else None,
    }


@rule(
    "artifact.balance_layout",
    "A work-balanced pack is read with the sampler, seed, DP size and global batch it was laid out for.",
    severity=ADVISORY,
    evidence=(
        "data/samplers.py: MegatronPretrainingBatchSampler.__iter__ (dataloader_type='batch') reads "
        "torch.randperm(total_samples) seeded dataset.seed + epoch, MegatronPretrainingSampler ('single') reads "
        "in file order, and both hand position j of a global batch to DP rank j % dp; 'cyclic' and "
        "max_train_samples (data/packing/parquet.py samples_mapping) reshuffle every epoch. A pack laid out for "
        "other values trains correctly, only without the step balance its metadata reports: an advisory."
    ),
    reads={
        **TOPOLOGY_READS,
        **DATASET_KWARGS_READS,
        **PACK_PATH_READS,
        "dataset.dataloader_type": OPTIONAL_NAME,
        "dataset.do_validation": UNCHECKED,
        "dataset.max_train_samples": OPTIONAL_POSITIVE_INT,
        "dataset.offline_packing_specs.packed_sequence_size": ANY_INT,
        "dataset.offline_packing_specs.packed_val_data_path": OPTIONAL_PATH,
        "dataset.offline_packing_specs.pad_seq_to_mult": POSITIVE_INT,
        "dataset.seed": OPTIONAL_INT,
        "tokenizer.hf_tokenizer_kwargs": UNCHECKED,
        "tokenizer.tokenizer_model": UNCHECKED,
        "tokenizer.tokenizer_type": UNCHECKED,
        "train.global_batch_size": OPTIONAL_MICRO_BATCH,
    },
)
def balance_layout(ctx: RuleContext) -> list[Violation] | None:
    from mbridge_seqpack.artifact.seal import entry_for, find_metadata
    from mbridge_seqpack.artifact.store import ArtifactError, read_parquet_fingerprint
    from mbridge_seqpack.placement.record import BalanceRecord

    specs = ctx.specs
    if specs is None:
        return None
    spec = specs.packed_train_data_path or builder_default_files(ctx.cfg).get("training")
    if spec is None:
        return None
    files, problem = resolve_packed(str(spec))
    if problem or not files:
        return None
    try:
        info = read_parquet_fingerprint(files[0])
    except ArtifactError:
        return None  # artifact.fingerprint_mismatch reports it
    entry = entry_for(find_metadata(files[0].parent)[1], info) if info is not None else None
    packed = BalanceRecord.of_value(entry.balance if entry is not None else None)
    if packed is None or packed.straggler_ratio is None:
        return None  # not balanced for a layout (or fewer rows than one step)
    read = _layout_read_by(ctx)
    laid_out = {key: getattr(packed, key) for key in read}  # a pack before the sampler was recorded: `single`
    keys = [key for key in read if key != "sampler_seed" or laid_out["sampler"] == "batch"]  # seed: batch only
    differs = {key: (laid_out.get(key), read[key]) for key in keys if laid_out.get(key) != read[key]}
    reshuffles = getattr(ctx.dataset, "max_train_samples", None) is not None
    if not differs and not reshuffles:
        return _read_order_differs(packed, int(entry.num_rows or 0) if entry is not None else 0)
    fields = {f"pack {key}": was for key, (was, _) in differs.items()}
    names = {"sampler": "dataset.dataloader_type", "sampler_seed": "dataset.seed"}
    fields.update({names.get(key, key): now for key, (_, now) in differs.items()})
    assignments = {names[key]: was for key, (was, _) in differs.items() if key in names}
    if differs.keys() - names.keys() or reshuffles:
        fix = (
            f"re-run `mbridge-seqpack pack --recipe ...` with this config (or pass --data-parallel "
            f"{read['data_parallel']} --micro-batches {read['micro_batches']} --sampler "
            f"{read['sampler'] if read['sampler'] in ('batch', 'single') else 'single'} --sampler-seed "
            f"{read['sampler_seed']})"
        )
        assignments = {}
    else:
        fix = ""
    if reshuffles:
        fields["dataset.max_train_samples"] = ctx.dataset.max_train_samples
    ratio = packed.straggler_ratio
    return [
        Violation(
            fields,
            f"the pack's rows are laid out so that each step keeps every DP rank equally busy (modeled straggler "
            f"ratio {ratio:.4f}) for the sampler, seed, DP size and global batch it was packed for; read "
            f"otherwise{' (max_train_samples reshuffles the rows every epoch)' if reshuffles else ''}, training "
            f"is correct but that balance does not hold",
            fix=fix,
            assignments=assignments,
        )
    ]


def _read_order_differs(packed: BalanceRecord, rows: int) -> list[Violation]:
    """The batch sampler's permutation comes from torch: this environment's must read the rows as the packing
    environment's did (``read_order_sha256``, recorded since the batch layout exists)."""
    from mbridge_seqpack.placement.sampler import read_order_digest

    recorded = packed.read_order_sha256
    if packed.sampler != "batch" or recorded is None or rows < 1:
        return []
    here = read_order_digest(rows, "batch", int(packed.sampler_seed or 0))
    if here == recorded:
        return []
    return [
        Violation(
            {"pack read order sha256": recorded[:16], "read order sha256 here": here[:16]},
            f"torch here permutes the {rows} rows (seed {packed.sampler_seed}) otherwise than where the pack "
            f"was made, so the batch sampler will not read the balanced steps; training is correct but that "
            f"balance does not hold",
            fix="re-run `mbridge-seqpack pack` in this environment (same sampler, seed, DP size and global batch)",
        )
    ]
