"""#52 items 4 and 6: every data error is a user error (exit 2) naming file, line and field, found before
tokenizing where it can be; a record over the size limit is refused by its line before it is read whole. The
references are Megatron-Bridge's own chat-record reader (data/conversation_processing.py) and Python's JSON."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.errors import InputError, os_reason
from mbridge_seqpack.tokenization.sequences import INT_DIGITS, RECORD_LIMIT_ENV, check_jsonl, max_record_bytes

CHAT = {"chat": True, "use_hf_tokenizer_chat_template": True}
TURNS = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def _jsonl(path: Path, *records: Any) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _refusal(path: Path, kwargs: dict[str, Any] | None = None, **options: Any) -> str:
    with pytest.raises(InputError) as info:
        check_jsonl(path, kwargs or {}, **options)
    return str(info.value)


def test_an_integer_longer_than_python_converts_is_refused_with_its_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Exceeds the limit"):  # the reference: Python's own JSON reader
        json.loads('{"n": ' + "9" * (INT_DIGITS + 1) + "}")
    ok = '{"input": "a", "output": "b", "n": ' + "9" * INT_DIGITS + "}"
    big = '{"input": "a", "output": "b", "meta": {"ids": [1, -' + "9" * (INT_DIGITS + 1) + "]}}"
    assert check_jsonl(_jsonl(tmp_path / "ok.jsonl", ok), {}) == 1
    path = _jsonl(tmp_path / "in.jsonl", ok, big)
    assert _refusal(path) == (
        f"{path}:2: field 'meta.ids[1]' is an integer of {INT_DIGITS + 1} digits, more than Python converts "
        f"({INT_DIGITS}: Megatron-Bridge's reader fails on it); write it as a string"
    )


def test_an_empty_messages_beside_a_full_conversations_is_refused_as_megatron_bridge_reads_it(tmp_path: Path) -> None:
    """Megatron-Bridge reads ``messages`` whenever it is not null, empty or not: the conversations are not read."""
    from megatron.bridge.data.conversation_processing import normalize_chat_conversation

    record = {"messages": [], "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
    assert normalize_chat_conversation(record) == []  # the reference: what Megatron-Bridge would train on
    path = _jsonl(tmp_path / "in.jsonl", {"messages": TURNS}, record)
    assert _refusal(path, CHAT) == (
        f"{path}:2: a chat record needs a non-empty 'messages' list of {{role, content}} objects, got [] "
        "('conversations' beside it is not read: Megatron-Bridge reads 'messages' first; drop 'messages')"
    )
    only = {"messages": None, "conversations": record["conversations"]}
    assert len(normalize_chat_conversation(only)) == 2 and check_jsonl(_jsonl(tmp_path / "ok.jsonl", only), CHAT) == 1


@pytest.mark.parametrize("tools", [{"name": "f"}, "f", 3])
def test_per_row_tools_not_a_list_are_refused(tmp_path: Path, tools: Any) -> None:
    path = _jsonl(
        tmp_path / "in.jsonl",
        {"messages": TURNS, "tools": [{"type": "function"}]},
        {"messages": TURNS, "tools": tools},
    )
    assert _refusal(path, CHAT).startswith(
        f"{path}:2: field 'tools' must be a list of tool schemas (handed to the chat template), got "
        f"{type(tools).__name__} {json.dumps(tools)}"
    )


def test_a_tool_call_turn_with_null_content_is_accepted_and_a_plain_null_content_refused(tmp_path: Path) -> None:
    """Megatron-Bridge hands an OpenAI tool-call turn to the chat template as it is (normalize_chat_conversation
    keeps it); the template renders its ``tool_calls``. A null content without calls would render as "None"."""
    from megatron.bridge.data.conversation_processing import normalize_chat_conversation

    call = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f"}}]}
    record = {"messages": [TURNS[0], call, {"role": "tool", "content": "4"}, TURNS[1]]}
    assert normalize_chat_conversation(record)[1] == call
    assert check_jsonl(_jsonl(tmp_path / "ok.jsonl", record), CHAT) == 1
    bad = _jsonl(tmp_path / "in.jsonl", {"messages": [TURNS[0], {"role": "assistant", "content": None}]})
    assert _refusal(bad, CHAT).startswith(f"{bad}:1: field 'messages[1].content' must be a string, got NoneType null")
    calls = _jsonl(tmp_path / "calls.jsonl", {"messages": [TURNS[0], {**call, "tool_calls": {"name": "f"}}]})
    assert _refusal(calls, CHAT) == f"{calls}:1: field 'messages[1].tool_calls' must be a list, got dict"


def test_a_record_over_the_limit_is_refused_by_its_line_before_it_is_read_whole(tmp_path: Path) -> None:
    """A 16 MB line under a 1 MB limit: refused by its line number, with at most the limit in memory."""
    limit = 1 << 20
    path = tmp_path / "in.jsonl"
    with open(path, "w") as out:
        out.write(json.dumps({"input": "a", "output": "b"}) + "\n")
        out.write('{"input": "' + "x" * (16 << 20) + '", "output": "b"}\n')
    tracemalloc.start()
    try:
        text = _refusal(path, limit=limit)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text == (
        f"{path}:2: the record is longer than 1,048,576 bytes, the limit a record is read to; split the record, or "
        "fix the line breaks of the file"
    )
    assert peak < 3 * limit, peak
    exact = tmp_path / "exact.jsonl"  # a line of exactly the limit (its newline not counted) is read
    line = json.dumps({"input": "a", "output": ""})
    exact.write_text(line[:-2] + "x" * (limit - len(line)) + '"}\n')
    assert len(exact.read_bytes()) == limit + 1 and check_jsonl(exact, {}, limit=limit) == 1


def test_the_record_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RECORD_LIMIT_ENV, raising=False)
    assert max_record_bytes() == 256 << 20
    monkeypatch.setenv(RECORD_LIMIT_ENV, "0.5")
    assert max_record_bytes() == 1 << 19
    for bad in ("0", "-1", "nan", "big", "1e300"):
        monkeypatch.setenv(RECORD_LIMIT_ENV, bad)
        with pytest.raises(InputError) as info:
            max_record_bytes()
        assert str(info.value) == (
            f"{RECORD_LIMIT_ENV}={bad!r}: expected a positive number of megabytes (at most 1048576)"
        )


def test_an_os_error_without_an_errno_is_said_in_words_never_none() -> None:
    """numpy's tofile on a full disk raises OSError("N requested and M written") with no errno: strerror is None."""
    bare = OSError("4096 requested and 0 written")
    assert bare.strerror is None and os_reason(bare) == "4096 requested and 0 written"
    assert os_reason(OSError(28, "No space left on device")) == "No space left on device"


def test_a_symbolic_link_loop_as_output_is_refused_before_any_work(tmp_path: Path) -> None:
    from mbridge_seqpack.artifact.store import ArtifactError, check_output

    loop = tmp_path / "out"
    loop.symlink_to(loop)
    with pytest.raises(ArtifactError) as info:
        check_output(loop, overwrite=True)
    assert str(info.value) == (
        f"--output {loop}: a symbolic link that resolves to nothing (a loop, or a missing target); remove it or "
        "choose another --output"
    )


RAISING_TEMPLATE = (
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if m['role'] == 'user' %}<user> {{ m['content'] }}\n{% else %}"
    "{% generation %}<assistant> {{ m['content'] }}{{ eos_token }}{% endgeneration %}\n{% endif %}{% endfor %}"
)


@pytest.mark.slow
def test_a_chat_template_that_raises_on_a_record_is_a_user_error_naming_its_line(
    tmp_path: Path, megatron_bridge: Any, capsys: pytest.CaptureFixture
) -> None:
    """The record's check passes (its turns are well formed); the user's chat template raises on it inside
    Megatron-Bridge's prep: the pack is refused with exit 2 and the record's line, nothing written."""
    from mbridge_seqpack.cli.main import main
    from tests.support.packs import chat_corpus, chat_tokenizer
    from tests.support.stderr_text import unwrap

    tokenizer = chat_tokenizer(tmp_path)
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": RAISING_TEMPLATE}))
    corpus = chat_corpus(tmp_path / "chat.jsonl", 30)
    lines = corpus.read_text().splitlines()
    lines.insert(17, json.dumps({"messages": [TURNS[0], TURNS[0], TURNS[1]]}))
    corpus.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    argv = ["pack", str(corpus), "--chat", "--tokenizer", str(tokenizer), "--pack-size", "512", "--output", str(out)]
    assert main(argv) == 2
    err = unwrap(capsys.readouterr().err)
    assert (
        f"{corpus}:18: Megatron-Bridge's chat prep fails on its conversation (the tokenizer's chat template raised): "
        "TemplateError: Conversation roles must alternate user/assistant/user/assistant/...; fix the record (e.g. "
        "turns in the order the template requires), or the chat template"
    ) in err, err
    assert "Traceback" not in err and not out.exists()
