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
    ("kwargs-not-json", ["--dataset-kwargs", "{add_eos: true}"], "--dataset-kwargs must be a JSON object"),
    ("kwargs-list", ["--dataset-kwargs", "[1]"], "--dataset-kwargs must be a JSON object"),
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
    ("sampler-seed-negative", ["--sampler-seed", "-1"], "--sampler-seed must be a non-negative integer, got -1"),
    ("rows-zero", ["--max-sequences-per-row", "0"], "argument --max-sequences-per-row: expected a positive integer"),
    ("seed-text", ["--seed", "x"], "argument --seed: invalid int value: 'x'"),
    ("dp-zero", ["--data-parallel", "0"], "argument --data-parallel: expected a positive integer, got 0"),
]


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


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
