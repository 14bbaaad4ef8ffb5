"""Data subcommands ``pack`` (tokenizes with Megatron-Bridge), ``inspect`` and ``verify`` (no Megatron import)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mbridge_seqpack.cli.args import (
    INT64_MAX,
    add_runner_flag,
    bounded_float,
    json_object_text,
    positive_count,
    positive_int,
    seed_value,
    text_value,
)
from mbridge_seqpack.errors import UsageError

if TYPE_CHECKING:
    from megatron.bridge.training.config import ConfigContainer

    from mbridge_seqpack.artifact.builder_location import BuilderLocation
    from mbridge_seqpack.pipeline.engine import PackEngine
    from mbridge_seqpack.pipeline.pack import PackOptions, PackResult


#: bounds of the counts ``pack`` takes: far above any real value, low enough that nothing sized by them overflows
MAX_WORKERS = 4096  # tokenizer processes on one machine
MAX_RANKS = 1 << 20  # DP ranks, GPUs, rows per rank per step
MAX_SEQUENCES_PER_ROW = 1 << 25  # a row holds at most one sequence per token (pipeline/pack.py MAX_PACK_SIZE)


def _dataset_kwargs(args: argparse.Namespace) -> dict:
    """Megatron-Bridge ``dataset_kwargs`` from the flags: --dataset-kwargs, with what --prompt-key/--answer-key and
    --chat set (a key both set differently is refused)."""
    from mbridge_seqpack.cli.pack_flags import dataset_kwargs_of_flags

    kwargs: dict = {}
    if args.dataset_kwargs:
        try:
            kwargs = json.loads(args.dataset_kwargs)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"--dataset-kwargs must be a JSON object ({exc.msg}), e.g. "
                f'\'{{"prompt_template": "{{input}} {{output}}"}}\''
            ) from None
        if not isinstance(kwargs, dict):
            raise UsageError("--dataset-kwargs must be a JSON object, e.g. '{\"add_eos\": true}'")
        from mbridge_seqpack.tokenization.dataset_kwargs import check_dataset_kwargs

        check_dataset_kwargs(kwargs)
    merged = dataset_kwargs_of_flags(args, kwargs)
    from mbridge_seqpack.tokenization.dataset_kwargs import check_prompt_template

    check_prompt_template(merged, "--dataset-kwargs" if args.dataset_kwargs else "--prompt-key/--answer-key")
    return merged


def _from_recipe(
    args: argparse.Namespace,
) -> tuple[dict[str, Path], Path | str, PackOptions, BuilderLocation | None, Any, tuple[ConfigContainer, int | None]]:
    """Pack size, alignment, lengths, tokenizer (its folder and the recipe's whole ``TokenizerConfig``: chat
    template, HF kwargs, special tokens, ... as the launch builds it) and dataset_kwargs from a recipe (as
    Megatron-Bridge's prep), and where its dataset builder will look for the pack (None when the input is not the
    config's own JSONL), and the config with its world size (the summary runs its row-count rules on the
    pack)."""
    from mbridge_seqpack.pipeline.pack import PackOptions
    from mbridge_seqpack.recipes.targets import build_launch
    from mbridge_seqpack.tokenization.dataset_kwargs import check_config_dataset_kwargs, check_prompt_template

    launch = build_launch(args.recipe, args.overrides, runner=args.runner, own_data=True)
    cfg = launch.cfg
    from mbridge_seqpack.textout import wrap

    notes = [*launch.notes(), *([launch.source_note] if launch.source_note else [])]
    for note in notes:  # the alignment the pack is sealed with is the one the launch will use
        print("\n".join(wrap(note, "note: ", hang="  ")), file=sys.stderr)
    specs = getattr(cfg.dataset, "offline_packing_specs", None)
    if specs is None:
        raise UsageError(
            f"recipe {args.recipe} does not use offline packing (dataset.offline_packing_specs is "
            f"None); add dataset.enable_offline_packing=true and its specs, or pass --pack-size"
        )
    from mbridge_seqpack.cli.pack_flags import recipe_conflicts
    from mbridge_seqpack.placement.cost import CostModel
    from mbridge_seqpack.recipes.targets import world_and_source
    from mbridge_seqpack.rules.context import RuleContext

    dataset_kwargs = _megatron_dataset_kwargs(args, cfg)
    check_config_dataset_kwargs(dataset_kwargs)
    check_prompt_template(dataset_kwargs, "dataset.dataset_kwargs")
    world, source = world_and_source(args.world_size, launch, getattr(args, "launcher", None))
    ctx = RuleContext(cfg=cfg, world_size=world)
    dp = ctx.topology.data_parallel or 1
    if args.world_size is None and not args.no_balance:  # issue #53: the layout's world size, and where it came from
        note = f"rows laid out for world size {world} (DP {dp}) from {source}; pass --world-size N for another"
        print("\n".join(wrap(note, "note: ", hang="  ")), file=sys.stderr)
    recipe = {
        "pack_size": int(specs.packed_sequence_size),
        "pad_seq_to_mult": int(specs.pad_seq_to_mult or 1),
        "max_seq_length": specs.max_single_sequence_length or None,
        "seed": int(cfg.dataset.seed),
        # `cyclic` reads its own random order every epoch: file order is as good as any
        "sampler": "batch" if getattr(cfg.dataset, "dataloader_type", None) == "batch" else "single",
        "sampler_seed": int(ctx.sampler_seed or 0),
        "data_parallel": dp,
        "micro_batches": max(1, int(cfg.train.global_batch_size) // dp),
        "tokenizer": cfg.tokenizer.tokenizer_model,
        "dataset_kwargs": dataset_kwargs,
        "preprocessing": getattr(cfg.dataset, "preprocessing", None),
    }
    recipe_conflicts(args, recipe, {"model_parallel": ctx.topology.model_parallel})
    if recipe["tokenizer"] is None:  # a NullTokenizer, say: nothing to seal, and the prep may refuse it
        from mbridge_seqpack.tokenization.prep_support import fileless_tokenizer_problem

        problem = fileless_tokenizer_problem(
            cfg.tokenizer,
            dataset_kwargs=dataset_kwargs,
            max_seq_length=recipe["max_seq_length"] or recipe["pack_size"],
            seed=recipe["seed"],
            pad_seq_to_mult=recipe["pad_seq_to_mult"],
        )
        raise UsageError(f"recipe {args.recipe}: {problem}")
    root = _recipe_root(args, cfg)
    inputs = {"training": Path(args.input) if args.input else root / "training.jsonl"}
    validation = Path(args.validation) if args.validation else root / "validation.jsonl"
    if args.validation or (not args.input and validation.is_file()):
        inputs["validation"] = validation
    options = PackOptions(
        pack_size=recipe["pack_size"],
        pad_seq_to_mult=recipe["pad_seq_to_mult"],
        max_seq_length=recipe["max_seq_length"],
        dataset_kwargs=dataset_kwargs,
        seed=recipe["seed"],
        balance=not args.no_balance,
        data_parallel=dp,
        micro_batches=recipe["micro_batches"],
        sampler=recipe["sampler"],
        sampler_seed=recipe["sampler_seed"],
        cost=CostModel.from_provider(cfg.model),
        max_sequences_per_row=args.max_sequences_per_row,
        overflow=args.overflow,
    )
    return (
        inputs,
        recipe["tokenizer"],
        options,
        _builder_location(args, cfg, root),
        cfg.tokenizer,
        (cfg, ctx.world_size),
    )


def _megatron_dataset_kwargs(args: argparse.Namespace, cfg: ConfigContainer) -> dict:
    """The recipe's dataset_kwargs as Megatron-Bridge's builder folds them (``config_dataset_kwargs``), which runs its
    ``GPTSFTDatasetConfig.validate()`` first: a config it refuses (two sources, a deprecated key beside
    ``dataset.preprocessing``, a bad preprocessing field) is the user's, said in one line with the field."""
    from mbridge_seqpack.tokenization.dataset_kwargs import config_dataset_kwargs

    try:
        return config_dataset_kwargs(cfg.dataset)
    except (ValueError, TypeError) as exc:
        raise UsageError(
            f"recipe {args.recipe}: Megatron-Bridge's dataset config refuses it (dataset: {exc}); fix that dataset.* "
            "field with an override after the recipe name, and launch with the same"
        ) from None


def _recipe_root(args: argparse.Namespace, cfg: ConfigContainer) -> Path:
    """Where the recipe's JSONL splits are: ``dataset.dataset_root``, or for a Hugging Face dataset
    (``dataset.hf_dataset``) the directory Megatron-Bridge's builder materializes it into, materialized now with
    its own ``materialize_hf_dataset`` when the splits are not there yet (as its builder does at launch)."""
    if getattr(cfg.dataset, "hf_dataset", None) is None:
        return Path(str(getattr(cfg.dataset, "dataset_root", "") or "."))
    from megatron.bridge.data.builders.gpt_sft import materialize_hf_dataset, resolve_gpt_sft_dataset_root

    root = Path(resolve_gpt_sft_dataset_root(cfg.dataset))
    if not args.input:
        try:
            with contextlib.redirect_stdout(sys.stderr):  # its progress lines must not mix into --json
                materialize_hf_dataset(cfg.dataset, root)
        except Exception as exc:  # noqa: BLE001  (datasets / hub errors: the source, said in one line)
            raise UsageError(
                f"recipe {args.recipe}: Megatron-Bridge could not materialize its Hugging Face dataset into {root} "
                f"({type(exc).__name__}: {str(exc)[:200]}); fix dataset.hf_dataset, or pack a JSONL (INPUT)"
            ) from None
    return root


def _builder_location(args: argparse.Namespace, cfg: ConfigContainer, root: Path) -> BuilderLocation | None:
    """Megatron-Bridge's own packed location for ``cfg``, when the pack is made from the config's JSONL and the
    dataset root is not the package's embedded sample (never written into)."""
    from mbridge_seqpack.artifact.builder_location import builder_location
    from mbridge_seqpack.recipes.building_blocks import embedded_data_dir

    if args.input or args.validation:
        return None  # another file than the builder would prepare from: a pack there would be stale for the config
    if getattr(cfg.dataset, "hf_dataset", None) is not None:
        return builder_location(cfg, root=root)
    if root.resolve() == embedded_data_dir().resolve():
        from mbridge_seqpack.textout import wrap

        note = (
            "the dataset root is the package's embedded sample; packing into --output (or ./packed_<N>_mult<M>), "
            "not beside it. Set dataset.dataset_root=DIR to pack where Megatron-Bridge's builder reads"
        )
        print("\n".join(wrap(note, "note: ", hang="  ")), file=sys.stderr)
        return None
    return builder_location(cfg)


@dataclass(frozen=True)
class PackRequest:
    """What ``pack`` is asked to do, resolved from the flags or the recipe; nothing is read or written yet."""

    inputs: dict[str, Path]
    tokenizer: Path | str
    options: PackOptions
    output: Path
    found_by_builder: bool  # the output is where Megatron-Bridge's dataset builder looks (``--recipe``)
    engine: PackEngine | None = None  # None: this machine's (pipeline/engine.py LocalEngine)
    tokenizer_config: Any = None  # the recipe's TokenizerConfig
    launched: tuple[ConfigContainer, int | None] | None = None  # the recipe's config and world size
    overwrite: bool = False
    workers: int | None = None
    seal_key_file: str | None = None


def _exists(item: str) -> bool:
    """Whether ``item`` names an existing path; an override too long to be a file name (an inline chat template of
    more than 255 characters: "File name too long") or otherwise not one is not a path."""
    try:
        return Path(item).exists()
    except (OSError, ValueError):
        return False


def _split_positionals(args: argparse.Namespace) -> None:
    """``pack --recipe X key=value [INPUT]``: the positionals are overrides, and at most one input file."""
    given = [item for item in [args.input, *args.overrides] if item is not None]
    if any(not item.strip() for item in given):
        raise UsageError(
            "pack: INPUT is an empty string (an unset shell variable?); name a JSONL file or leave it out"
        )
    files = [item for item in given if "=" not in item or _exists(item)]
    if len(files) > 1:
        raise UsageError(f"pack takes one INPUT file, got {len(files)}: {' '.join(files)}")
    args.input = files[0] if files else None
    args.overrides = [item for item in given if item not in files]
    if args.overrides and not args.recipe:
        raise UsageError(f"overrides {args.overrides} need --recipe NAME")


def _from_flags(args: argparse.Namespace) -> tuple[dict[str, Path], Path | str, PackOptions]:
    """Inputs, tokenizer and options from the flags alone (no recipe)."""
    from mbridge_seqpack.cli.pack_flags import fill_input_defaults
    from mbridge_seqpack.pipeline.pack import PackOptions
    from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir

    fill_input_defaults(args)
    if args.pack_size is None:
        raise UsageError("pack needs --pack-size N (or --recipe NAME to take it from a recipe)")
    if args.input is None and args.validation:
        raise UsageError(
            f"--validation {args.validation} needs the training JSONL beside it (INPUT); the embedded corpus "
            "brings its own validation split"
        )
    if args.input is None:  # the embedded corpus, both splits
        inputs = {
            "training": embedded_data_dir() / "training.jsonl",
            "validation": embedded_data_dir() / "validation.jsonl",
        }
    else:
        inputs = {"training": Path(args.input)}
        if args.validation:
            inputs["validation"] = Path(args.validation)
    options = PackOptions(
        pack_size=args.pack_size,
        pad_seq_to_mult=args.pad_seq_to_mult,
        max_seq_length=args.max_seq_length,
        dataset_kwargs=_dataset_kwargs(args),
        seed=args.seed,
        balance=not args.no_balance,
        data_parallel=args.data_parallel,
        micro_batches=args.micro_batches,
        max_sequences_per_row=args.max_sequences_per_row,
        sampler=args.sampler,
        sampler_seed=args.sampler_seed,
        overflow=args.overflow,
    )
    return inputs, args.tokenizer or embedded_tokenizer_dir(), options


def resolve_pack(args: argparse.Namespace) -> PackRequest:
    """The command line (and the recipe it names) as a :class:`PackRequest`; a user mistake is a ``UsageError``
    (exit 2) before anything is tokenized."""
    from mbridge_seqpack.cli.pack_flags import check_flag_combinations

    _split_positionals(args)
    check_flag_combinations(args)
    location = tokenizer_config = launched = None
    if args.recipe:
        inputs, tokenizer, options, location, tokenizer_config, launched = _from_recipe(args)
    else:
        inputs, tokenizer, options = _from_flags(args)
    if args.output:
        output = Path(args.output)
    elif location is not None:
        output = location.directory
    else:
        output = Path(f"packed_{options.pack_size}_mult{options.pad_seq_to_mult}")
    engine = None
    if args.ray:
        from mbridge_seqpack.pipeline.ray_engine import RayEngine

        shard_mb = args.ray_shard_mb if args.ray_shard_mb is not None else 64.0
        engine = RayEngine(args.ray, shard_bytes=max(1, int(shard_mb * (1 << 20))))
    return PackRequest(
        inputs=inputs,
        tokenizer=tokenizer,
        options=options,
        output=output,
        found_by_builder=location is not None and output.absolute() == location.directory.absolute(),
        engine=engine,
        tokenizer_config=tokenizer_config,
        launched=launched,
        overwrite=args.overwrite,
        workers=args.workers,
        seal_key_file=args.seal_key_file,
    )


def run_pack(request: PackRequest) -> PackResult:
    """Pack what ``request`` names (pipeline/pack.py)."""
    from mbridge_seqpack.pipeline.pack import pack_jsonl

    return pack_jsonl(
        request.inputs,
        tokenizer=request.tokenizer,
        output_dir=request.output,
        options=request.options,
        overwrite=request.overwrite,
        workers=request.workers,
        engine=request.engine,
        tokenizer_config=request.tokenizer_config,
        seal_key_file=request.seal_key_file,
    )


def cmd_pack(args: argparse.Namespace) -> int:
    """``pack``: resolve the request (exit 2 on a user mistake), run it, render the report."""
    from mbridge_seqpack.cli.pack_summary import PackReport

    request = resolve_pack(args)
    report = PackReport(run_pack(request), request.options.pack_size, request.found_by_builder, request.launched)
    print(report.to_json() if args.json else report.to_text())
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from mbridge_seqpack.artifact.inspect_artifact import inspect_artifact

    if args.png:
        from mbridge_seqpack.cli.histogram import require_matplotlib

        require_matplotlib()  # before the artifact is read: the plot's extra may not be installed
    report = inspect_artifact(args.artifact)
    if args.png and report.splits:
        from mbridge_seqpack.cli.histogram import draw_histogram

        draw_histogram(report, args.png)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.to_text())
    if args.png and not args.json:
        print(f"plot: {args.png}")
    return 0 if report.ok else 1


def cmd_verify(args: argparse.Namespace) -> int:
    from mbridge_seqpack.thd.verify import verify_artifact

    report = verify_artifact(args.artifact, max_rows=args.rows, seed=args.seed)
    print(report.to_text())
    return 0 if report.ok else 1


def add_data_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register the data subcommands on the main parser."""
    p = sub.add_parser("pack", help="tokenize SFT JSONL with Megatron-Bridge's own dataset code and pack it, sealed")
    p.add_argument("input", nargs="?", default=None, help="training JSONL (default: the embedded corpus)")
    p.add_argument("overrides", nargs="*", default=[], help="with --recipe: Hydra-style key=value overrides")
    p.add_argument(
        "--recipe",
        type=text_value,
        default=None,
        help="take pack size, alignment, tokenizer, dataset_kwargs, seed and layout from this recipe (packaged "
        "name, Megatron-Bridge recipe name or file.py:function), as Megatron-Bridge's own prep does; a flag that "
        "sets one of them differently is refused with the override that does",
    )
    add_runner_flag(p)
    p.add_argument("--validation", type=text_value, default=None, help="validation JSONL")
    p.add_argument(
        "--tokenizer", type=text_value, default=None, help="Hugging Face tokenizer directory (default: embedded)"
    )
    p.add_argument("--pack-size", type=positive_int, default=None, help="tokens per packed row")
    p.add_argument(
        "--pad-seq-to-mult",
        type=positive_int,
        default=None,
        help="pad every sequence to this multiple (default 1; 2*CP with context parallelism; see `check`)",
    )
    p.add_argument(
        "--max-seq-length",
        type=positive_int,
        default=None,
        help="longest single sequence (Megatron-Bridge truncates longer prompts; default: pack size)",
    )
    p.add_argument(
        "--output",
        type=text_value,
        default=None,
        help="artifact directory (default with --recipe: where Megatron-Bridge's dataset builder looks, "
        "<dataset_root>/packed/<tokenizer>_pad_seq_to_mult<M>_sft_<fingerprint>; else ./packed_<N>_mult<M>)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --output once the new pack is done")
    p.add_argument(
        "--seal-key-file",
        type=text_value,
        default=None,
        help="also seal the metadata with HMAC-SHA256 under the key in this file (default: $MBRIDGE_SEQPACK_SEAL_KEY"
        "_FILE or $MBRIDGE_SEQPACK_SEAL_KEY, if set); check and the launch then need the key too. Without a key the "
        "seal detects corruption and accidental edits, not a deliberate edit with recomputed hashes",
    )
    p.add_argument("--seed", type=seed_value, default=None, help="tie order of the packer and the balance (default 0)")
    p.add_argument("--prompt-key", type=text_value, default=None, help="JSONL field of the prompt (default: input)")
    p.add_argument("--answer-key", type=text_value, default=None, help="JSONL field of the answer (default: output)")
    p.add_argument(
        "--chat", action="store_true", help="records hold a 'messages' list; use the tokenizer's chat template"
    )
    p.add_argument(
        "--dataset-kwargs", type=json_object_text, default=None, help="JSON object of Megatron-Bridge dataset_kwargs"
    )
    p.add_argument(
        "--overflow",
        choices=("error", "drop"),
        default="error",
        help="a sequence longer than --max-seq-length (untruncated chat): refuse (default), or drop it as "
        "Megatron-Bridge's prep does, counted in the output and metadata",
    )
    p.add_argument(
        "--workers",
        type=positive_count(MAX_WORKERS),
        default=None,
        help="tokenizer processes (default: every core)",
    )
    p.add_argument(
        "--ray",
        type=text_value,
        default=None,
        metavar="ADDRESS",
        help="tokenize and write on a Ray cluster (the 'ray' extra): 'auto' (the cluster of this node), host:port, "
        "ray://host:port, or 'local' (start one here); --output must be on storage every node sees. Same bytes "
        "as without it",
    )
    p.add_argument(
        "--ray-shard-mb",
        type=bounded_float(INT64_MAX / (1 << 20)),
        default=None,
        help="with --ray: input megabytes per shard, one worker task each (default 64)",
    )
    p.add_argument(
        "--no-balance",
        action="store_true",
        help="keep best-fit rows as packed (default: equal-cost rows, ordered so DP ranks are equally busy)",
    )
    p.add_argument(
        "--sampler",
        choices=("batch", "single"),
        default=None,
        help="Megatron-Bridge sampler that reads the pack, dataset.dataloader_type (default batch, its SFT default: "
        "rows are laid out for its first, seeded epoch; with --recipe: the recipe's)",
    )
    p.add_argument(
        "--sampler-seed",
        type=seed_value,
        default=None,
        help="dataset.seed, the batch sampler's shuffle seed (default 1234, GPTSFTDatasetConfig's; with --recipe: "
        "the recipe's)",
    )
    p.add_argument(
        "--data-parallel",
        type=positive_count(MAX_RANKS),
        default=None,
        help="DP ranks the row order is balanced for (default 8; with --recipe: the recipe's)",
    )
    p.add_argument(
        "--micro-batches",
        type=positive_count(MAX_RANKS),
        default=None,
        help="rows per DP rank per step, global batch / DP (default 1; with --recipe: the recipe's)",
    )
    p.add_argument(
        "--world-size",
        type=positive_count(MAX_RANKS),
        default=None,
        help="with --recipe: GPUs (default: the recipe's declared world size)",
    )
    p.add_argument(
        "--max-sequences-per-row",
        type=positive_count(MAX_SEQUENCES_PER_ROW),
        default=None,
        help="cap on sequences per row (static cu_seqlens capacity); extra rows it costs are reported",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_pack)

    p = sub.add_parser("inspect", help="verify a packed artifact and print its statistics")
    p.add_argument("artifact", help="artifact directory (or one of its .idx.parquet files)")
    p.add_argument(
        "--png",
        type=text_value,
        default=None,
        help="write a PNG of the sequence lengths against the pack size and of each row's fill",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("verify", help="packed-vs-unpacked parity checks (attention, loss, CP split) on an artifact")
    p.add_argument("artifact", help="artifact directory (or one .idx.parquet file)")
    p.add_argument("--rows", type=positive_int, default=16, help="rows to check per file (default 16)")
    p.add_argument("--seed", type=seed_value, default=0)
    p.set_defaults(func=cmd_verify)
