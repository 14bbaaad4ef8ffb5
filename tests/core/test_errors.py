"""One error family (#22): every error the plugin raises on purpose is an ``errors.SeqpackError``; the command line
exits 2 for those (1 for a config that breaks a rule) and shows anything else as a bug (exit 3)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mbridge_seqpack.cli.recipes as recipes_cli
from mbridge_seqpack.artifact.content_check import ContentCheckError
from mbridge_seqpack.artifact.row_group_seal import CorruptedPackError
from mbridge_seqpack.artifact.store import ArtifactError
from mbridge_seqpack.cli.main import main
from mbridge_seqpack.contract.record import CheckoutImportError
from mbridge_seqpack.corrections.router_padding import CorrectionNotApplicableError
from mbridge_seqpack.errors import PackingConfigError, SeqpackError, UsageError
from mbridge_seqpack.thd.inject import StaticShapeMismatchError
from mbridge_seqpack.thd.layout import StaticShapeOverflowError
from mbridge_seqpack.tokenization.sequences import InputError

PACKAGE = Path(__file__).resolve().parents[2] / "mbridge_seqpack"


def test_every_error_class_belongs_to_the_family() -> None:
    for cls in (
        PackingConfigError,
        UsageError,
        InputError,
        ArtifactError,
        ContentCheckError,
        CorruptedPackError,
        StaticShapeMismatchError,
        StaticShapeOverflowError,
        CheckoutImportError,
        CorrectionNotApplicableError,
    ):
        assert issubclass(cls, SeqpackError) and issubclass(cls, ValueError), cls
    defined = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                defined.append((path.name, node.name, [ast.unparse(b) for b in node.bases]))
    assert {name for _, name, _ in defined} == {
        "SeqpackError",
        "UsageError",
        "PackingConfigError",
        "InputError",
        "ArtifactError",
        "ContentCheckError",
        "CorruptedPackError",
        "StaticShapeMismatchError",
        "StaticShapeOverflowError",
        "CheckoutImportError",  # contract/record.py: a checkout that does not import (bisect-run skips it)
        "CorrectionNotApplicableError",  # corrections/router_padding.py: the step meets a config it does not cover
    }
    assert all(bases == ["ValueError"] for _, name, bases in defined if name == "SeqpackError")


def test_no_bare_value_error_is_raised_on_purpose() -> None:
    raised = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                if isinstance(node.exc.func, ast.Name) and node.exc.func.id == "ValueError":
                    raised.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert raised == []


def test_a_bug_shows_as_one(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(*args: object) -> None:
        raise TypeError("'NoneType' object is not subscriptable")

    monkeypatch.setattr(recipes_cli, "recipe_listing", broken)
    assert main(["recipes"]) == 3
    err = capsys.readouterr().err
    assert "TypeError: 'NoneType' object is not subscriptable" in err  # the traceback, for the report
    assert err.rstrip().endswith(
        "mbridge-seqpack: internal error (a bug in mbridge-seqpack, not in your input): please report it to its "
        "issue tracker with the command line, `mbridge-seqpack --version` and the traceback above"
    )


def test_an_error_of_the_family_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refused(*args: object) -> None:
        raise UsageError("--pack-size 0 must be positive")

    monkeypatch.setattr(recipes_cli, "recipe_listing", refused)
    assert main(["recipes"]) == 2
    assert capsys.readouterr().err == "mbridge-seqpack: error: --pack-size 0 must be positive\n"
