"""Malformed inputs and flags to ``mbridge-seqpack pack``: each gets exit code 2 and one message naming the file and
line, the field or the flag; none a traceback, none a hang. Each case is refused before Megatron-Bridge's prep (and
its ~40 s import) runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest

from mbridge_seqpack.cli.main import main
from tests.support.stderr_text import unwrap

GOOD = {"input": "a question", "output": "an answer"}
CHAT = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}


def _lines(*rows: Any) -> Callable[[Path], Path]:
    """A JSONL file: dict/list rows as JSON, str rows verbatim, bytes rows raw."""

    def write(tmp: Path) -> Path:
        path = tmp / "in.jsonl"
        raw = b""
        for row in rows:
            raw += row if isinstance(row, bytes) else (row if isinstance(row, str) else json.dumps(row)).encode()
            raw += b"\n"
        path.write_bytes(raw)
        return path

    return write


def _fifo(tmp: Path) -> Path:
    path = tmp / "in.jsonl"
    os.mkfifo(path)
    return path


def _directory(tmp: Path) -> Path:
    path = tmp / "in.jsonl"
    path.mkdir()
    return path


def _missing(tmp: Path) -> Path:
    return tmp / "nowhere.jsonl"


# (id, input maker, extra flags, message fragment)
DATA_CASES = [
    ("not-utf8", _lines(GOOD, b"\xff\xfe{}"), [], "in.jsonl:2: not UTF-8"),
    ("bad-json", _lines(GOOD, "{input: 1}"), [], "in.jsonl:2: not valid JSON"),
    ("truncated-json", _lines('{"input": "a", "output": "b"'), [], "in.jsonl:1: not valid JSON"),
    ("trailing-garbage", _lines('{"input": "a", "output": "b"} x'), [], "in.jsonl:1: not valid JSON"),
    ("array-line", _lines(GOOD, [1, 2]), [], "in.jsonl:2: each line must be a JSON object, got list"),
    ("string-line", _lines('"text"'), [], "in.jsonl:1: each line must be a JSON object, got str"),
    ("number-line", _lines("42"), [], "in.jsonl:1: each line must be a JSON object, got int"),
    ("null-line", _lines("null"), [], "in.jsonl:1: each line must be a JSON object, got NoneType"),
    ("missing-input", _lines({"output": "b"}), [], "in.jsonl:1: missing field 'input'"),
    ("missing-output", _lines(GOOD, {"input": "a"}), [], "in.jsonl:2: missing field 'output'"),
    ("int-output", _lines({"input": "a", "output": 3}), [], "in.jsonl:1: field 'output' must be a string, got int"),
    ("list-input", _lines({"input": ["a"], "output": "b"}), [], "field 'input' must be a string, got list"),
    ("dict-input", _lines({"input": {"a": 1}, "output": "b"}), [], "field 'input' must be a string, got dict"),
    ("null-output", _lines({"input": "a", "output": None}), [], "field 'output' must be a string, got NoneType"),
    ("lone-surrogate", _lines('{"input": "\\ud800", "output": "b"}'), [], "in.jsonl:1: field 'input'"),
    ("deep-nesting", _lines(GOOD, "[" * 200_000), [], "in.jsonl:2: JSON nested too deeply"),
    ("empty-file", _lines(), [], "in.jsonl: no records"),
    ("blank-lines", _lines("", "   ", ""), [], "in.jsonl: no records"),
    ("fifo", _fifo, [], "in.jsonl: is a pipe, not a regular file"),
    ("directory", _directory, [], "in.jsonl: is a directory, not a regular file"),
    ("missing-file", _missing, [], "nowhere.jsonl: cannot be read"),
    ("other-keys", _lines(GOOD), ["--prompt-key", "question"], "in.jsonl:1: missing field 'question'"),
    ("chat-no-messages", _lines({"text": "x"}), ["--chat"], "in.jsonl:1: a chat record needs a non-empty 'messages'"),
    ("chat-messages-str", _lines({"messages": "hi"}), ["--chat"], "a chat record needs a non-empty 'messages'"),
    ("chat-empty", _lines({"messages": []}), ["--chat"], "a chat record needs a non-empty 'messages'"),
    (
        "chat-no-role",
        _lines({"messages": [{"content": "q"}]}),
        ["--chat"],
        "messages[0] must be an object with 'role'",
    ),
    ("chat-turn-str", _lines({"messages": ["q"]}), ["--chat"], "messages[0] must be an object with 'role'"),
    (
        "chat-content-int",
        _lines({"messages": [{"role": "user", "content": 1}]}),
        ["--chat"],
        "field 'messages[0].content' must be a string, got int",
    ),
    (
        "sharegpt-no-value",
        _lines({"conversations": [{"from": "User"}]}),
        ["--chat"],
        "conversations[0] must be an object with 'from' and 'value'",
    ),
    (
        "sharegpt-value-list",
        _lines({"conversations": [{"from": "User", "value": ["q"]}]}),
        ["--chat"],
        "field 'conversations[0].value' must be a string, got list",
    ),
    ("chat-second-line", _lines(CHAT, {"messages": [{"role": "user"}]}), ["--chat"], "in.jsonl:2: messages[0]"),
]

FLAG_CASES = [
    ("pack-size-zero", ["--pack-size", "0"], "argument --pack-size: expected a positive integer, got 0"),
    ("pack-size-negative", ["--pack-size", "-5"], "argument --pack-size: expected a positive integer, got -5"),
    ("pack-size-text", ["--pack-size", "big"], "argument --pack-size: expected a positive integer, got 'big'"),
    ("pack-size-float", ["--pack-size", "4096.5"], "argument --pack-size: expected a positive integer"),
    ("pack-size-absurd", ["--pack-size", "999999999999"], "--pack-size 999999999999 is beyond"),
    ("mult-zero", ["--pad-seq-to-mult", "0"], "argument --pad-seq-to-mult: expected a positive integer, got 0"),
    ("mult-over-pack", ["--pad-seq-to-mult", "8192"], "--pad-seq-to-mult 8192 must be at most --pack-size 4096"),
    ("max-seq-over-pack", ["--max-seq-length", "5000"], "--max-seq-length 5000 must be in 1..--pack-size (4096)"),
    ("max-seq-zero", ["--max-seq-length", "0"], "argument --max-seq-length: expected a positive integer, got 0"),
    ("kwargs-not-json", ["--dataset-kwargs", "{add_eos: true}"], "argument --dataset-kwargs: expected a JSON object"),
    ("kwargs-list", ["--dataset-kwargs", "[1]"], "argument --dataset-kwargs: expected a JSON object, got a JSON list"),
    ("kwargs-unknown", ["--dataset-kwargs", '{"add_eso": true}'], "unknown key 'add_eso' (did you mean 'add_eos'?)"),
    ("kwargs-managed", ["--dataset-kwargs", '{"seed": 1}'], "'seed' is set by --seed"),
    ("kwargs-bool", ["--dataset-kwargs", '{"add_eos": "no"}'], "'add_eos' must be a boolean, got str"),
    ("kwargs-int", ["--dataset-kwargs", '{"min_seq_length": "3"}'], "'min_seq_length' must be an integer, got str"),
    ("kwargs-choice", ["--dataset-kwargs", '{"truncation_method": "mid"}'], "'truncation_method' must be one of"),
    ("kwargs-tokens", ["--dataset-kwargs", '{"special_tokens": ["a"]}'], "'special_tokens' must be an object"),
    ("tokenizer-missing", ["--tokenizer", "/no/such/tok"], "/no/such/tok"),
    ("workers-zero", ["--workers", "0"], "argument --workers: expected a positive integer, got 0"),
    ("validation-missing", ["--validation", "/no/such.jsonl"], "/no/such.jsonl: cannot be read"),
    ("sampler-bogus", ["--sampler", "random"], "argument --sampler: invalid choice: 'random'"),
    ("sampler-seed-negative", ["--sampler-seed", "-1"], "argument --sampler-seed: expected a seed in 0..4294967295"),
    ("rows-zero", ["--max-sequences-per-row", "0"], "argument --max-sequences-per-row: expected a positive integer"),
    ("seed-text", ["--seed", "x"], "argument --seed: expected a seed (an integer in 0..4294967295), got 'x'"),
    ("dp-zero", ["--data-parallel", "0"], "argument --data-parallel: expected a positive integer, got 0"),
]


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal
        code = int(exc.code or 0)
    return code, unwrap(capsys.readouterr().err)


@pytest.mark.parametrize(("make", "flags", "message"), [c[1:] for c in DATA_CASES], ids=[c[0] for c in DATA_CASES])
def test_malformed_input_is_refused_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, make: Callable[[Path], Path], flags: list[str], message: str
) -> None:
    path = make(tmp_path)
    code, err = _run(["pack", str(path), "--pack-size", "4096", "--output", str(tmp_path / "o"), *flags], capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("flags", "message"), [c[1:] for c in FLAG_CASES], ids=[c[0] for c in FLAG_CASES])
def test_malformed_flag_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], message: str
) -> None:
    data = _lines(GOOD)(tmp_path)
    argv = ["pack", str(data), "--output", str(tmp_path / "o"), *flags]
    if "--pack-size" not in flags:
        argv += ["--pack-size", "4096"]
    code, err = _run(argv, capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_an_output_that_is_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = _lines(GOOD)(tmp_path)
    (tmp_path / "o").write_text("x")
    code, err = _run(["pack", str(data), "--pack-size", "4096", "--output", str(tmp_path / "o")], capsys)
    assert code == 2 and "--output" in err and "Traceback" not in err


def test_the_matrix_is_large_enough() -> None:
    assert len(DATA_CASES) + len(FLAG_CASES) + 1 >= 50


# ------------------------------------------------------------------------------------------ #43: every flag value
POSITIVE = "expected a positive integer, got"
INT64_OVER = str(1 << 63)  # one past int64
SEED = "expected a seed in 0..4294967295"
TEMPLATE_END = "--dataset-kwargs: 'prompt_template' '{input}' must end with {output} (the answer field"

#: (flag as typed, value, what the message says after "argument FLAG: " or in full, kind); None flag: INPUT
VALUE_CASES: list[tuple[str | None, str, str, str]] = [
    (None, "", "pack: INPUT is an empty string (an unset shell variable?)", "empty"),
    (None, " ", "pack: INPUT is an empty string (an unset shell variable?)", "empty"),
    *[
        (flag, value, f"argument {flag}: expected a value, got {value!r} (an unset shell variable?)", "empty")
        for flag in (
            "--output",
            "--tokenizer",
            "--validation",
            "--ray",
            "--recipe",
            "--prompt-key",
            "--answer-key",
            "--dataset-kwargs",
            "--seal-key-file",
        )
        for value in ("", "  ")
    ],
    ("--sampler", "", "argument --sampler: invalid choice: ''", "empty"),
    ("--overflow", "", "argument --overflow: invalid choice: ''", "empty"),
    *[
        case
        for flag, high in (
            ("--pack-size", 1 << 63),
            ("--pad-seq-to-mult", 1 << 63),
            ("--max-seq-length", 1 << 63),
            ("--workers", 4097),
            ("--data-parallel", (1 << 20) + 1),
            ("--micro-batches", (1 << 20) + 1),
            ("--world-size", (1 << 20) + 1),
            ("--max-sequences-per-row", (1 << 25) + 1),
        )
        for case in (
            (flag, "", f"argument {flag}: {POSITIVE} ''", "empty"),
            (flag, "-5", f"argument {flag}: {POSITIVE} -5", "negative"),
            (
                flag,
                str(high),
                f"argument {flag}: expected a positive integer up to {high - 1}, got {high}",
                "overflow",
            ),
            (flag, INT64_OVER + "0", f"argument {flag}: expected a positive integer up to", "overflow"),
            (flag, "2.5", f"argument {flag}: {POSITIVE} '2.5'", "kind"),
            (flag, "many", f"argument {flag}: {POSITIVE} 'many'", "kind"),
        )
    ],
    *[
        case
        for flag in ("--seed", "--sampler-seed")
        for case in (
            (flag, "", f"argument {flag}: expected a seed (an integer in 0..4294967295), got ''", "empty"),
            (flag, "-5", f"argument {flag}: {SEED} (numpy's np.random.seed", "negative"),
            (flag, "18446744073709551616", f"argument {flag}: {SEED}", "overflow"),
            (flag, "4294967296", f"argument {flag}: {SEED}", "overflow"),
            (flag, "1e3", f"argument {flag}: expected a seed (an integer in 0..4294967295), got '1e3'", "kind"),
        )
    ],
    ("--ray-shard-mb", "", "argument --ray-shard-mb: expected a positive number, got ''", "empty"),
    ("--ray-shard-mb", "-1", "argument --ray-shard-mb: expected a positive number, got -1", "negative"),
    ("--ray-shard-mb", "1e400", "argument --ray-shard-mb: expected a positive number, got 1e400", "overflow"),
    ("--ray-shard-mb", "1e20", "argument --ray-shard-mb: expected a positive number up to", "overflow"),
    ("--ray-shard-mb", "nan", "argument --ray-shard-mb: expected a positive number, got nan", "kind"),
    ("--ray-shard-mb", "big", "argument --ray-shard-mb: expected a positive number, got 'big'", "kind"),
    ("--dataset-kwargs", "[]", "argument --dataset-kwargs: expected a JSON object, got a JSON list", "kind"),
    ("--dataset-kwargs", "{x", "argument --dataset-kwargs: expected a JSON object (", "kind"),
]
#: the modes of ``pack`` (tests/cli/test_pack_flags.py), as the command before the case's flag
VALUE_MODES = {
    "input": ["{input}", "--pack-size", "1024"],
    "embedded": ["--pack-size", "1024"],
    "recipe": ["--recipe", "small_gpt_smoke_4k"],
    "ray": ["{input}", "--pack-size", "1024", "--ray", "local"],
}


def _value_argv(mode: str, flag: str | None, value: str, data: Path) -> list[str]:
    base = [part.replace("{input}", str(data)) for part in VALUE_MODES[mode]]
    if flag is None:  # the INPUT itself
        base = [part for part in base if part != str(data)] + [value]
        return ["pack", *base]
    return [
        "pack",
        *base,
        f"{flag}={value}" if value.startswith("-") else flag,
        *([] if value.startswith("-") else [value]),
    ]


@pytest.mark.parametrize("mode", list(VALUE_MODES))
@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [c[:3] for c in VALUE_CASES],
    ids=[f"{c[0] or 'INPUT'}={c[1]!r}" for c in VALUE_CASES],
)
def test_every_flag_value_acts_or_is_refused_by_name(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    mode: str,
    flag: str | None,
    value: str,
    message: str,
) -> None:
    """Exit 2 with the flag's name, no traceback, nothing written (the current directory included), before any
    Megatron import."""
    import sys

    data = _lines(GOOD)(tmp_path)
    monkeypatch.chdir(tmp_path)
    megatron_was_imported = "megatron.bridge" in sys.modules
    code, err = _run(_value_argv(mode, flag, value, data), capsys)
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    assert ("megatron.bridge" in sys.modules) == megatron_was_imported


@pytest.mark.parametrize("mode", ["input", "embedded", "ray"])
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dataset-kwargs", '{"prompt_template": "{input}"}'], TEMPLATE_END),
        (
            ["--dataset-kwargs", '{"prompt_template": "Q: {question} A: {output}"}'],
            "--dataset-kwargs: 'truncation_field' 'input' names 'input', not a field of 'prompt_template'",
        ),
        (["--dataset-kwargs", '{"prompt_template": null}'], "--dataset-kwargs: 'prompt_template' must be a string"),
    ],
    ids=["no-answer-field", "truncation-field-not-in-template", "null-template"],
)
def test_a_template_megatron_bridge_would_assert_on_is_refused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    mode: str,
    flags: list[str],
    message: str,
) -> None:
    data = _lines(GOOD)(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = ["pack", *[part.replace("{input}", str(data)) for part in VALUE_MODES[mode]], *flags]
    code, err = _run(argv, capsys)
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def _pack_options() -> list:
    import argparse

    from mbridge_seqpack.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices["pack"]._actions if a.option_strings and a.nargs != 0 and a.dest != "help"]


def test_the_value_table_covers_every_flag_that_takes_a_value() -> None:
    """Every value flag has an empty-string case; every number flag a negative, an overflow and a wrong kind."""
    kinds: dict[str, set[str]] = {}
    for flag, _, _, kind in VALUE_CASES:
        kinds.setdefault(flag or "INPUT", set()).add(kind)
    missing = {}
    for action in _pack_options():
        flag = action.option_strings[0]
        wanted = {"empty"}
        if getattr(action.type, "__name__", "") in ("positive_int", "seed_value", "positive_float"):
            wanted |= {"negative", "overflow", "kind"}
        if not wanted <= kinds.get(flag, set()):
            missing[flag] = sorted(wanted - kinds.get(flag, set()))
    assert missing == {}
    assert "empty" in kinds["INPUT"]
