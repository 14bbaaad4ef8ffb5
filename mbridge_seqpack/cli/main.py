"""``mbridge-seqpack``: check configs, list recipes, plan pack length vs batch, pack and inspect data.

Commands that do not need Megatron-Bridge (``pack`` checks its inputs first, ``inspect``, ``verify``, ``--help``)
do not import it before they must: that import took 20 s on an idle 2-core machine (44 s without cached bytecode;
``startup.MEASURED_IMPORT_S``), so a command says so on stderr as it starts, and keeps third-party notices that do
not concern the user out of its output unless ``--verbose`` (``cli/startup.py``).

Exit codes: 0 ok, 1 a config that breaks a rule (or a check that found one), 2 an error of the plugin's family
(``errors.SeqpackError``: bad input, usage, artifact) or an exhausted resource, 3 a bug (shown as one, with the
traceback and where to report it), 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn, Sequence

from mbridge_seqpack.cli.args import DEFAULT_RECIPE
from mbridge_seqpack.cli.check import add_check_command
from mbridge_seqpack.cli.contract import add_contract_command
from mbridge_seqpack.cli.data import add_data_commands
from mbridge_seqpack.cli.launch_line import pack_launch_line, strip_launcher
from mbridge_seqpack.cli.plan import add_plan_command
from mbridge_seqpack.cli.recipes import add_recipes_command
from mbridge_seqpack.cli.startup import command_line
from mbridge_seqpack.errors import PackingConfigError, SeqpackError, UsageError
from mbridge_seqpack.textout import message_lines

__all__ = ["build_parser", "main", "UsageError"]


ERROR_PREFIX = "mbridge-seqpack: error: "


def say_error(text: str) -> None:
    """One error of the user's on stderr, as lines of at most 100 columns."""
    print("\n".join(message_lines(text, ERROR_PREFIX)), file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors worded as the plugin's own (``mbridge-seqpack: error: ...``, wrapped)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        say_error(message)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    from mbridge_seqpack import __version__

    parser = _Parser(prog="mbridge-seqpack", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"mbridge-seqpack {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_check_command(sub)
    add_recipes_command(sub)
    add_plan_command(sub)
    add_data_commands(sub)
    add_contract_command(sub)
    for command in (parser, *sub.choices.values()):  # before or after the command name
        command.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=False if command is parser else argparse.SUPPRESS,
            help="show every warning of the libraries below (torch's CUDA probe, import notices, deprecations)",
        )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line as the commands read it: a pasted ``torchrun ... run_recipe.py ...`` after ``check`` made
    plain (``launch_line``), and overrides after the options added to the overrides."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    launcher = None
    if "check" in argv:  # `check torchrun ... run_recipe.py ...`: a pasted launch line
        at = argv.index("check") + 1
        argv = [*argv[:at], *strip_launcher(argv[at:])]
    elif "pack" in argv:  # `pack torchrun ... run_recipe.py ...`: the recipe, its overrides and its world size
        at = argv.index("pack") + 1
        try:
            rest, launcher = pack_launch_line(argv[at:], DEFAULT_RECIPE)
        except UsageError as exc:
            parser.error(str(exc))  # exit 2, one message
        argv = [*argv[:at], *rest]
    args, extra = parser.parse_known_args(argv)
    if launcher is not None:
        args.launcher = launcher
    # `check NAME --world-size 8 key=value`: overrides may follow the options too
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:  # a command may word its own usage errors (contract bisect-run: exit 128, for git bisect run)
        getattr(args, "parser_for_errors", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with command_line(verbose=args.verbose):
            return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C, most often during the long import: no traceback
        print("mbridge-seqpack: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `mbridge-seqpack inspect --json | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except PackingConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except SeqpackError as exc:
        say_error(str(exc))
        return 2
    except MemoryError:
        say_error("out of memory; lower --pack-size (or --workers), or run on a larger machine")
        return 2
    except OSError as exc:  # a full disk (ENOSPC), a vanished or unreadable file: the resource, not a bug
        where = f"{exc.filename}: " if exc.filename else ""
        say_error(f"{where}{exc.strerror or exc}; free the resource and run again")
        return 2
    except Exception:  # noqa: BLE001  (anything else is a bug in the plugin: say so, with what a report needs)
        import traceback

        traceback.print_exc()
        print(
            "mbridge-seqpack: internal error (a bug in mbridge-seqpack, not in your input): please report it to its "
            "issue tracker with the command line, `mbridge-seqpack --version` and the traceback above",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
