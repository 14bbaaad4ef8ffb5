"""Runs rows of command lines through the CLI's ``main`` in this one process, in order, and prints one JSON line per
row: exit code, stdout, stderr, and whether Megatron-Bridge had been imported by then (``tests/cli/test_bad_inputs.py``
starts it as a subprocess; one process pays the 40-90 s Megatron import once for every row that needs it).

Input (argv[1]): a JSON file of rows ``{"id", "argv", "env", "cwd"}``; ``env`` values of None unset a variable.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys


def run_row(row: dict) -> dict:
    from mbridge_seqpack.cli.main import main

    saved = {name: os.environ.get(name) for name in row.get("env", {})}
    for name, value in row.get("env", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    here = os.getcwd()
    os.chdir(row.get("cwd") or here)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(row["argv"])
            except SystemExit as exc:  # argparse's usage errors
                rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.chdir(here)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return {
        "id": row["id"],
        "rc": rc,
        "out": out.getvalue(),
        "err": err.getvalue(),
        "megatron": "megatron.bridge" in sys.modules,
    }


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        rows = json.load(handle)
    for row in rows:
        print(json.dumps(run_row(row)), flush=True)
