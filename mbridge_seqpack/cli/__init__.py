"""The ``mbridge-seqpack`` command line.

One module per command family (check, recipes, plan, data), the check
report, and argument helpers. ``main`` is the console-script entry point."""

from mbridge_seqpack.cli.main import main

__all__ = ["main"]
