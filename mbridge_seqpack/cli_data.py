"""Data subcommands ``pack``, ``inspect`` and ``verify``; none of them imports Megatron-Bridge."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def cmd_pack(args: argparse.Namespace) -> int:
    from mbridge_seqpack.packing.pipeline import pack_jsonl
    from mbridge_seqpack.recipe_kit import embedded_data_dir, embedded_tokenizer_dir

    if args.input is None:  # the embedded corpus, both splits
        inputs = {"training": embedded_data_dir() / "training.jsonl",
                  "validation": embedded_data_dir() / "validation.jsonl"}
    else:
        inputs = {"training": Path(args.input)}
        if args.validation:
            inputs["validation"] = Path(args.validation)
    tokenizer = args.tokenizer or embedded_tokenizer_dir()
    output = Path(args.output) if args.output else Path(f"packed_{args.pack_size}_mult{args.pad_seq_to_mult}")
    result = pack_jsonl(inputs, tokenizer=tokenizer, pack_size=args.pack_size, output_dir=output,
                        pad_seq_to_mult=args.pad_seq_to_mult, seed=args.seed, overflow=args.overflow,
                        prompt_key=args.prompt_key, answer_key=args.answer_key, eos_token=args.eos_token,
                        progress=not args.json and sys.stderr.isatty() or args.progress)
    if args.json:
        print(json.dumps({"directory": str(result.directory), "metadata": str(result.metadata),
                          "splits": result.splits}, indent=2))
        return 0
    print(f"packed into {result.directory}")
    for name, entry in result.splits.items():
        stats = entry["stats"]
        print(f"  {name}: {stats['num_sequences']} sequences -> {stats['num_bins']} rows of {entry['pack_size']} "
              f"(lower bound {stats['lower_bound']}), efficiency {stats['efficiency']:.2%}, "
              f"max {entry['max_samples_per_bin']} per row, {stats['num_dropped']} dropped")
    print(f"  metadata: {result.metadata}")
    print("  use: cfg.dataset.offline_packing_specs.packed_train_data_path = "
          f"'{result.directory / ('training_%d.idx.parquet' % args.pack_size)}'")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from mbridge_seqpack.packing.inspect_artifact import inspect_artifact

    report = inspect_artifact(args.artifact, png=args.png)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.to_text())
    if args.png and not args.json:
        print(f"histogram: {args.png}")
    return 0 if report.ok else 1


def cmd_verify(args: argparse.Namespace) -> int:
    from mbridge_seqpack.verify import verify_artifact

    report = verify_artifact(args.artifact, max_rows=args.rows, seed=args.seed)
    print(report.to_text())
    return 0 if report.ok else 1


def add_data_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register the data subcommands on the main parser."""
    p = sub.add_parser("pack", help="tokenize a prompt/answer JSONL and pack it into a Megatron-Bridge artifact")
    p.add_argument("input", nargs="?", default=None, help="training JSONL (default: the embedded corpus)")
    p.add_argument("--validation", default=None, help="validation JSONL")
    p.add_argument("--tokenizer", default=None, help="HF tokenizer directory or tokenizer.json (default: embedded)")
    p.add_argument("--pack-size", type=positive_int, required=True, help="tokens per packed row")
    p.add_argument("--pad-seq-to-mult", type=positive_int, default=1,
                   help="pad every sequence to this multiple (lcm(2*CP, CP*TP if SP); see `check`)")
    p.add_argument("--output", default=None, help="artifact directory (default: ./packed_<N>_mult<M>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overflow", choices=("error", "drop"), default="error",
                   help="sequences longer than the pack: fail (default) or drop and count them")
    p.add_argument("--prompt-key", default="input")
    p.add_argument("--answer-key", default="output")
    p.add_argument("--eos-token", default=None)
    p.add_argument("--progress", action="store_true", help="show a progress bar even when not on a terminal")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_pack)

    p = sub.add_parser("inspect", help="verify a packed artifact and print its statistics")
    p.add_argument("artifact", help="artifact directory (or one of its .idx.parquet files)")
    p.add_argument("--png", default=None, help="write a sequences-per-row histogram to this PNG")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("verify", help="packed-vs-unpacked parity checks (attention, loss, CP split) on an artifact")
    p.add_argument("artifact", help="artifact directory written by `pack`")
    p.add_argument("--rows", type=positive_int, default=16, help="training rows to check (default 16)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_verify)
