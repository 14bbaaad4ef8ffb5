"""``pack``'s flags, audited against its modes: every flag takes effect (and what it changes is sealed in the pack)
or the command exits 2 saying what to do instead. Nothing is dropped silently.

Modes: ``--recipe`` (the recipe owns the settings that decide the rows, as Megatron-Bridge's launch reads them:
a flag that would set one of them differently is refused with the override that sets it on the recipe, so pack
and launch agree), an explicit input or the embedded corpus (the flags set everything), a recipe reading a
Hugging Face dataset (a recipe mode), ``--ray`` (where the work runs), ``--overflow drop``. :data:`PACK_FLAGS`
says, for every flag the parser defines, what it does and where its effect is sealed; ``tests/cli/test_pack_flags.py``
holds the parser and this table equal and runs every flag in every mode.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from mbridge_seqpack.errors import UsageError

__all__ = ["PACK_FLAGS", "INPUT_DEFAULTS", "check_flag_combinations", "fill_input_defaults", "recipe_conflicts"]

#: dest -> (the flag as typed, what it does and where its effect is recorded; "recipe:" what --recipe does with it)
PACK_FLAGS: dict[str, str] = {
    "input": "the training JSONL; with --recipe: packs that file with the recipe's settings (not where the builder "
    "looks: the `use:` override is printed); fingerprint input_sha256/input_bytes",
    "overrides": "Hydra-style overrides of the recipe (--recipe only)",
    "recipe": "take the settings from a recipe (the mode)",
    "runner": "model Megatron-Bridge's run_recipe.py pre-launch fixes (--recipe only)",
    "validation": "validation JSONL: a second sealed split",
    "tokenizer": "fingerprint tokenizer/tokenizer_sha256/tokenizer_settings; recipe: tokenizer.tokenizer_model (and "
    "every other tokenizer.* field the launch's tokenizer build reads: chat template, HF kwargs, special tokens)",
    "pack_size": "fingerprint pack_size; recipe: dataset.offline_packing_specs.packed_sequence_size",
    "pad_seq_to_mult": "fingerprint pad_seq_to_mult; recipe: dataset.offline_packing_specs.pad_seq_to_mult",
    "max_seq_length": "fingerprint max_seq_length; recipe: dataset.offline_packing_specs.max_single_sequence_length",
    "output": "where the sealed pack goes",
    "overwrite": "replace a non-empty --output",
    "seal_key_file": "metadata seal_keyed/entry_hmac_sha256: the entries keyed with HMAC-SHA256 (never the key)",
    "seed": "fingerprint seed (tie order of the packer and the balance); recipe: dataset.seed",
    "prompt_key": "fingerprint dataset_kwargs prompt_template/label_key/truncation_field; recipe: the same keys of "
    "dataset.dataset_kwargs",
    "answer_key": "as --prompt-key",
    "chat": "fingerprint dataset_kwargs chat/use_hf_tokenizer_chat_template; recipe: the same keys",
    "dataset_kwargs": "fingerprint dataset_kwargs; recipe: dataset.dataset_kwargs",
    "overflow": "metadata overflow and dropped_sequences",
    "workers": "tokenizer processes on this machine (the bytes do not change); not with --ray",
    "ray": "tokenize and write on a Ray cluster (the bytes do not change)",
    "ray_shard_mb": "input megabytes per Ray task (the bytes do not change); --ray only",
    "no_balance": "fingerprint algorithm (no '+balanced'); no balance record",
    "sampler": "balance record sampler; recipe: dataset.dataloader_type",
    "sampler_seed": "balance record sampler_seed (batch sampler only); recipe: dataset.seed",
    "data_parallel": "balance record data_parallel; recipe: the world size and parallel layout",
    "micro_batches": "balance record micro_batches; recipe: train.global_batch_size",
    "world_size": "the recipe's world size, hence DP (--recipe only)",
    "max_sequences_per_row": "balance record max_sequences_per_row",
    "json": "print the result as JSON",
    "verbose": "every command's flag: show every third-party warning (cli/startup.py); the bytes do not change",
}

#: what a flag set to None means without --recipe (with --recipe the recipe's value)
INPUT_DEFAULTS: dict[str, Any] = {
    "pad_seq_to_mult": 1,
    "seed": 0,
    "sampler": "batch",
    "sampler_seed": 1234,
    "data_parallel": 8,
    "micro_batches": 1,
    "ray_shard_mb": 64.0,
}

#: the layout flags: where each balanced row is written for the sampler and DP ranks that read it
LAYOUT_FLAGS = ("sampler", "sampler_seed", "data_parallel", "micro_batches")


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_flag_combinations(args: argparse.Namespace) -> None:
    """Flags that do nothing in the mode the others select (before any slow work)."""
    recipe = bool(args.recipe)
    if not recipe:
        if args.world_size is not None:
            raise UsageError(
                "--world-size sizes DP from a recipe's parallel layout (with --recipe); without one pass "
                "--data-parallel D"
            )
        if args.runner is not None:
            raise UsageError(
                f"{'--runner' if args.runner else '--no-runner'} models Megatron-Bridge's recipe runner "
                "for --recipe; without --recipe drop it"
            )
    if args.ray is None and args.ray_shard_mb is not None:
        raise UsageError("--ray-shard-mb sizes the tasks of a --ray pack; add --ray ADDRESS or drop it")
    if args.ray is not None and args.workers is not None:
        raise UsageError(
            "--workers sets this machine's tokenizer processes; with --ray every Ray worker tokenizes its shards in "
            "one process: size the cluster instead (ray start --num-cpus N) or the tasks (--ray-shard-mb)"
        )
    if args.no_balance and args.max_sequences_per_row is not None:
        raise UsageError(
            "--max-sequences-per-row re-deals the rows by cost to hold the cap (the balance), so it cannot keep "
            "--no-balance's best-fit rows: drop --no-balance (the capped rows are balanced) or the cap"
        )
    if args.no_balance:
        for dest in LAYOUT_FLAGS:
            if getattr(args, dest) is not None:
                raise UsageError(
                    f"{flag(dest)} lays out balanced rows for the sampler and DP ranks that read them; --no-balance "
                    f"keeps best-fit rows in their own order: drop {flag(dest)} or --no-balance"
                )
    sampler = args.sampler if args.sampler is not None else (None if recipe else INPUT_DEFAULTS["sampler"])
    if sampler == "single" and args.sampler_seed is not None:
        raise UsageError(
            "--sampler-seed seeds the batch sampler's shuffle; --sampler single reads the rows in file order: "
            "drop --sampler-seed"
        )
    keys_given = args.prompt_key is not None or args.answer_key is not None
    if args.chat and keys_given:
        raise UsageError(
            "--chat reads each record's 'messages' through the tokenizer's chat template; --prompt-key/--answer-key "
            "name the fields of prompt/answer records: drop one"
        )


def dataset_kwargs_of_flags(args: argparse.Namespace, given: dict[str, Any]) -> dict[str, Any]:
    """``--dataset-kwargs`` with what --prompt-key/--answer-key/--chat set; a key set twice to different values
    is refused (neither wins silently)."""
    derived: dict[str, Any] = {}
    if args.prompt_key is not None or args.answer_key is not None:
        prompt, answer = args.prompt_key or "input", args.answer_key or "output"
        derived = {"prompt_template": f"{{{prompt}}} {{{answer}}}", "label_key": answer, "truncation_field": prompt}
    if args.chat:
        derived = {"chat": True, "use_hf_tokenizer_chat_template": True}
    for key, value in derived.items():
        if key in given and given[key] != value:
            source = "--chat" if args.chat else "--prompt-key/--answer-key"
            raise UsageError(
                f"--dataset-kwargs sets {key}={json.dumps(given[key])}, {source} sets {json.dumps(value)}: drop one"
            )
    return {**given, **derived}


def fill_input_defaults(args: argparse.Namespace) -> None:
    """Without --recipe, a flag left unset takes its documented default."""
    for dest, value in INPUT_DEFAULTS.items():
        if getattr(args, dest) is None and (dest != "ray_shard_mb" or args.ray is not None):
            setattr(args, dest, value)


def _override(path: str, value: Any) -> str:
    from mbridge_seqpack.override_text import render_override

    return render_override(path, value)


def _same_tokenizer(given: str, configured: Any) -> bool:
    if str(given) == str(configured):
        return True
    return (
        Path(given).exists()
        and Path(str(configured)).exists()
        and Path(given).resolve() == Path(str(configured)).resolve()
    )


def recipe_conflicts(args: argparse.Namespace, recipe: dict[str, Any], layout: dict[str, int]) -> None:
    """Refuse every flag that would set a recipe-owned value differently from the recipe (the launch reads the
    recipe), each with the override that sets it there; a flag equal to the recipe's value is accepted.

    ``recipe``: the values ``pack --recipe`` takes (pack_size, pad_seq_to_mult, max_seq_length, seed, sampler,
    sampler_seed, data_parallel, micro_batches, tokenizer, dataset_kwargs); ``layout``: model-parallel size."""
    from mbridge_seqpack.tokenization.dataset_kwargs import CONTENT_DEFAULTS, chat_preprocessing_overrides

    specs = "dataset.offline_packing_specs"
    fields = {
        "pack_size": f"{specs}.packed_sequence_size",
        "pad_seq_to_mult": f"{specs}.pad_seq_to_mult",
        "max_seq_length": f"{specs}.max_single_sequence_length",
        "seed": "dataset.seed",
        "sampler": "dataset.dataloader_type",
        "sampler_seed": "dataset.seed",
    }
    refused: list[str] = []

    def refuse(given: str, has: str, instead: str) -> None:
        refused.append(f"{given} conflicts with the recipe ({has}); pass {instead} instead")

    for dest, path in fields.items():
        value = getattr(args, dest)
        if value is not None and value != recipe[dest]:
            refuse(f"{flag(dest)} {value}", f"{path}={recipe[dest]}", f"the override {_override(path, value)}")
    if args.tokenizer is not None and not _same_tokenizer(args.tokenizer, recipe["tokenizer"]):
        refuse(
            f"--tokenizer {args.tokenizer}",
            f"tokenizer.tokenizer_model={recipe['tokenizer']}",
            f"the override {_override('tokenizer.tokenizer_model', args.tokenizer)} (Megatron-Bridge's builder names "
            "the pack's folder after it)",
        )
    if args.data_parallel is not None and args.data_parallel != recipe["data_parallel"]:
        refuse(
            f"--data-parallel {args.data_parallel}",
            f"DP {recipe['data_parallel']} = world size / (TP x PP x CP = {layout['model_parallel']})",
            f"--world-size {args.data_parallel * layout['model_parallel']}",
        )
    if args.micro_batches is not None and args.micro_batches != recipe["micro_batches"]:
        gbs = args.micro_batches * recipe["data_parallel"]
        refuse(
            f"--micro-batches {args.micro_batches}",
            f"train.global_batch_size / DP = {recipe['micro_batches']}",
            f"the override {_override('train.global_batch_size', gbs)}",
        )
    given = json.loads(args.dataset_kwargs) if args.dataset_kwargs else {}
    configured = recipe["dataset_kwargs"]
    if args.chat and not configured.get("chat"):  # Megatron-Bridge 0.6.2 deprecates dataset_kwargs chat=true
        refuse(
            "--chat",
            "dataset.preprocessing="
            + (type(recipe["preprocessing"]).__name__ if recipe.get("preprocessing") is not None else "None")
            + ": prompt/answer records",
            "the overrides " + " ".join(map(shlex.quote, chat_preprocessing_overrides())),
        )
    wanted = dataset_kwargs_of_flags(args, given) if not args.chat else dict(given)
    missing = object()
    differs = {
        key: value for key, value in wanted.items() if configured.get(key, CONTENT_DEFAULTS.get(key, missing)) != value
    }
    if differs:
        source = " ".join(
            part
            for part, on in (
                (f"--dataset-kwargs {args.dataset_kwargs}", bool(args.dataset_kwargs)),
                ("--prompt-key/--answer-key", args.prompt_key is not None or args.answer_key is not None),
                ("--chat", bool(args.chat)),
            )
            if on
        )
        refuse(
            source,
            "dataset.dataset_kwargs: "
            + ", ".join(f"{k}={json.dumps(configured.get(k, CONTENT_DEFAULTS.get(k)))}" for k in differs),
            "the override(s) " + " ".join(_override(f"dataset.dataset_kwargs.{k}", v) for k, v in differs.items()),
        )
    if refused:
        raise UsageError(
            f"pack --recipe {args.recipe} takes these from the recipe, as the launch does: "
            + "; ".join(refused)
            + " (after the recipe name; launch with the same overrides)"
        )
