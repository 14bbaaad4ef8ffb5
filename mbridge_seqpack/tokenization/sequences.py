"""SFT JSONL -> token sequences with the loss mask Megatron-Bridge stores, tokenized by Megatron-Bridge itself.

The tokens of a pack must be exactly what Megatron-Bridge would train on, so tokenization is not
re-implemented: :func:`tokenize_split` calls Megatron-Bridge's own ``tokenize_dataset`` (its
``GPTSFTDataset`` / ``GPTSFTChatDataset`` with the prompt template, chat template, truncation and
alignment padding of ``dataset_kwargs``), then turns each example into the label-aligned loss mask
Megatron-Bridge's ``fill_packing_strategy`` writes. The plugin's parts are the input checks before the
~40 s Megatron import, the packer and the sealed artifact.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from mbridge_seqpack.digests import file_sha256
from mbridge_seqpack.errors import InputError, SeqpackError, os_reason
from mbridge_seqpack.tokenization.dataset_kwargs import template_fields
from mbridge_seqpack.tokenization.file_kind import (
    CHAT_KEYS,
    chat_record_message,
    chat_template_refusals,
    json_array_message,
    not_jsonl_message,
)

__all__ = [
    "TokenizedSequences",
    "InputError",
    "file_sha256",
    "tokenizer_files_sha256",
    "sealed_tokenizer_files",
    "check_chat_template",
    "check_jsonl",
    "template_fields",
    "load_megatron_tokenizer",
    "tokenize_split",
]


#: the order the seal hashed files in before the names came from the tokenizer's classes
#: (tokenization/tokenizer_files.py): kept first, so a pack sealed then over these files keeps its digest
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
)


def sealed_tokenizer_files(target: str | Path) -> list[str]:
    """The files of the tokenizer at ``target`` the seal hashes, in its order (tokenization/tokenizer_files.py);
    ``[""]`` for a single-file tokenizer (a SentencePiece ``.model``)."""
    from mbridge_seqpack.tokenization.tokenizer_files import tokenizer_files

    root = Path(target)
    if not root.exists():
        raise InputError(
            f"tokenizer {target}: no such file or directory; pass a Hugging Face tokenizer directory "
            f"(--tokenizer DIR, holding tokenizer.json and tokenizer_config.json) or a SentencePiece .model file"
        )
    if not (root.is_dir() or root.is_file()):
        raise InputError(f"tokenizer {target}: not a directory or a regular file; pass a tokenizer directory")
    found = tokenizer_files(root)
    if not found:
        raise InputError(
            f"tokenizer {target}: no tokenizer files there ({', '.join(TOKENIZER_FILES[:2])}, ...); "
            f"pass a Hugging Face tokenizer directory with --tokenizer"
        )
    return [name for name in TOKENIZER_FILES if name in found] + [n for n in found if n not in TOKENIZER_FILES]


def tokenizer_files_sha256(directory: str | Path, file_digest: Callable[[Path], str] | None = None) -> str:
    """One hash over every file the tokenizer at ``directory`` loads (names and contents:
    :func:`sealed_tokenizer_files`) and the ``config.json`` fields that choose its class; ``file_digest`` hashes one
    file (default: read it whole; a launch passes ``digests.launch_sha256``, the same digest, remembered)."""
    from mbridge_seqpack.tokenization.tokenizer_files import class_choice

    root = Path(directory)
    digest = hashlib.sha256()
    names = sealed_tokenizer_files(root)
    choice = class_choice(root) if root.is_dir() else None  # read first: the files' digests are the last calls
    for name in names:
        path = root / name if name else root
        digest.update(name.encode() + b"\0" + (file_digest or file_sha256)(path).encode() + b"\0")
    if choice is not None:
        digest.update(b"config.json:class\0" + hashlib.sha256(choice).hexdigest().encode() + b"\0")
    return digest.hexdigest()


def check_chat_template(directory: str | Path, dataset_kwargs: dict[str, Any]) -> None:
    """``--chat`` (``use_hf_tokenizer_chat_template``) renders each conversation with the tokenizer's chat template;
    a tokenizer without one fails inside the tokenizer's worker pool (transformers' ValueError), so it is told here,
    before the Megatron import. The template is the ``chat_template`` of ``tokenizer_config.json``, or
    ``chat_template.jinja`` / ``chat_template.json`` beside it (what transformers reads)."""
    if not (dataset_kwargs.get("chat") and dataset_kwargs.get("use_hf_tokenizer_chat_template")):
        return
    root = Path(directory)
    if not root.is_dir():  # tokenizer_files_sha256 says what it must be
        return
    if (root / "chat_template.jinja").is_file() or (root / "chat_template.json").is_file():
        return
    try:
        config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    if isinstance(config, dict) and config.get("chat_template"):
        return
    raise InputError(
        f"tokenizer {directory}: no chat template (no chat_template in tokenizer_config.json, no "
        "chat_template.jinja), which --chat renders each conversation with; use a chat model's tokenizer "
        "(--tokenizer DIR), add its template, or pack prompt/answer records (--prompt-key/--answer-key)"
    )


def _regular_file(path: Path) -> None:
    """Refuse what is not a regular file before opening it: a FIFO would block the open until a writer came."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({os_reason(exc)}); pass an existing JSONL file") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a pipe" if stat.S_ISFIFO(mode) else "a device or socket"
        raise InputError(f"{path}: is {kind}, not a regular file; pass a JSONL file (copy a stream to a file first)")


#: the longest record (one JSONL line) read by default: a line is read up to this many bytes and refused past it,
#: never read whole first, so one huge line cannot exhaust memory
MAX_RECORD_BYTES = 256 << 20
#: the most digits Python converts to an int (sys.get_int_max_str_digits' default): a longer JSON integer raises
INT_DIGITS = 4300


#: sets the record limit, in megabytes, for ``pack`` and every Ray worker of it
RECORD_LIMIT_ENV = "MBRIDGE_SEQPACK_MAX_RECORD_MB"


def max_record_bytes() -> int:
    """The record limit: ``$MBRIDGE_SEQPACK_MAX_RECORD_MB`` megabytes, else :data:`MAX_RECORD_BYTES`."""
    import math

    text = os.environ.get(RECORD_LIMIT_ENV, "")
    if not text:
        return MAX_RECORD_BYTES
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = math.nan
    if not (math.isfinite(megabytes) and 0 < megabytes <= 1 << 20):
        raise InputError(f"{RECORD_LIMIT_ENV}={text!r}: expected a positive number of megabytes (at most 1048576)")
    return max(1, int(megabytes * (1 << 20)))


def _prep_failure(shown: Any, number: int, dataset_kwargs: dict[str, Any], exc: Exception) -> str:
    """What to say of a record Megatron-Bridge's prep fails on alone."""
    text = " ".join(str(exc).split())[:200] or type(exc).__name__
    if dataset_kwargs.get("chat"):
        where = "its conversation"
        if dataset_kwargs.get("use_hf_tokenizer_chat_template"):
            where += " (the tokenizer's chat template raised)" if "jinja" in type(exc).__module__ else ""
        return (
            f"{shown}:{number}: Megatron-Bridge's chat prep fails on {where}: {type(exc).__name__}: {text}; fix "
            "the record (e.g. turns in the order the template requires), or the chat template"
        )
    return f"{shown}:{number}: Megatron-Bridge's prep fails on this record: {type(exc).__name__}: {text}; fix it"


def _tokenizer_refusal(
    tokenizer: Any,
    max_seq_length: int,
    pad_seq_to_mult: int,
    dataset_kwargs: dict[str, Any],
    seed: int,
    exc: Exception,
) -> str | None:
    """The tokenizer's refusal when Megatron-Bridge's prep raises the same on a neutral record as on the failing one
    (tokenization/prep_support.py): then no record is at fault."""
    from mbridge_seqpack.tokenization.prep_support import prep_refusal, refusal_message

    again = prep_refusal(
        tokenizer,
        dataset_kwargs=dataset_kwargs,
        max_seq_length=max_seq_length,
        seed=seed,
        pad_seq_to_mult=pad_seq_to_mult,
    )
    if again is None or (type(again), str(again)) != (type(exc), str(exc)):
        return None
    return refusal_message(tokenizer, dataset_kwargs, again)


class _HugeInt(str):
    """A JSON integer too long for Python to convert, kept as its digits to name its field."""


def _parse_int(digits: str) -> Any:
    return _HugeInt(digits) if len(digits.lstrip("-")) > INT_DIGITS else int(digits)


def _huge_field(record: Any) -> tuple[str, int] | None:
    """(field path, digits) of the first :class:`_HugeInt` in a parsed record (walked without recursion: a record
    nested as deep as JSON parses must not overflow the stack here)."""
    stack: list[tuple[str, Any]] = [("", record)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, _HugeInt):
            return where or "(the record)", len(value.lstrip("-"))
        if isinstance(value, dict):
            stack.extend((f"{where}.{key}" if where else str(key), item) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in reversed(list(enumerate(value))))
    return None


def _bounded_lines(handle: Any, first_line: int, shown: Any, limit: int) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each line, reading ``limit`` + 1 bytes at most: a longer line is refused by its number
    before the rest of it is read."""
    number = first_line
    while True:
        try:
            raw = handle.readline(limit + 1)
        except OSError as exc:
            raise InputError(f"{shown}: reading failed ({os_reason(exc)}); check the file and its disk") from None
        if not raw:
            return
        if len(raw) > limit and not (len(raw) == limit + 1 and raw.endswith(b"\n")):
            raise InputError(
                f"{shown}:{number}: the record is longer than {limit:,} bytes, the limit a record is read to; split "
                "the record, or fix the line breaks of the file"
            )
        yield number, raw
        number += 1


def _iter_records(
    path: Path, first_line: int = 1, shown: Any = None, limit: int | None = None
) -> Iterator[tuple[int, Any]]:
    """(line number, record) of every non-blank line; errors name ``shown`` (default ``path``) and number lines from
    ``first_line`` (a shard of a larger file). No line is read past ``limit`` bytes (:func:`max_record_bytes`)."""
    _regular_file(path)
    shown = path if shown is None else shown
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({os_reason(exc)}); pass an existing JSONL file") from None
    with handle:
        if first_line == 1:  # the file's start: a compressed file is told as one, not as "not UTF-8"
            found = not_jsonl_message(path, shown, handle.peek(8)[:8])
            if found is not None:
                raise InputError(found)
        seen = first_line > 1
        limit = max_record_bytes() if limit is None else limit
        for number, raw in _bounded_lines(handle, first_line, shown, limit):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"{shown}:{number}: not UTF-8 (byte {exc.start}); re-encode the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            if not seen and line.lstrip().startswith("["):  # a JSON array, on one line or pretty-printed
                raise InputError(json_array_message(shown))
            seen = True
            try:
                record = json.loads(line, parse_int=_parse_int)
            except json.JSONDecodeError as exc:
                raise InputError(f"{shown}:{number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            except RecursionError:
                raise InputError(f"{shown}:{number}: JSON nested too deeply to read; flatten the record") from None
            huge = _huge_field(record)
            if huge is not None:
                raise InputError(
                    f"{shown}:{number}: field {huge[0]!r} is an integer of {huge[1]} digits, more than Python "
                    f"converts ({INT_DIGITS}: Megatron-Bridge's reader fails on it); write it as a string"
                )
            yield number, record


def _check_chat(path: Path, number: int, record: dict) -> None:
    """A conversation as Megatron-Bridge's chat prep reads it (data/conversation_processing.py
    normalize_chat_conversation, chat_template_kwargs_from_example): ``messages``, else ``conversation``, else
    ``conversations`` (the first not null, even when empty), each turn {role, content} or ShareGPT {from, value};
    per-row ``tools`` handed to the chat template as they are, so a list. An OpenAI tool-call turn (with
    ``tool_calls``) may have ``"content": null``: Megatron-Bridge passes the turn to the template unchanged and chat
    templates render the calls from ``tool_calls``; a null content elsewhere is refused, since a template renders it
    as the text "None"."""
    name = next((key for key in CHAT_KEYS if record.get(key) is not None), None)
    if name is None:
        raise InputError(
            f"{path}:{number}: a chat record needs a non-empty 'messages' list of {{role, content}} objects "
            f"(or ShareGPT 'conversations' of {{from, value}})"
        )
    turns = record[name]
    if not isinstance(turns, list) or not turns:
        later = [key for key in CHAT_KEYS[CHAT_KEYS.index(name) + 1 :] if record.get(key)]
        also = (
            f" ({later[0]!r} beside it is not read: Megatron-Bridge reads {name!r} first; drop {name!r})"
            if later
            else ""
        )
        raise InputError(
            f"{path}:{number}: a chat record needs a non-empty {name!r} list of {{role, content}} objects, got "
            f"{json.dumps(turns)[:60]}{also}"
        )
    for i, turn in enumerate(turns):
        pairs = [("role", "content"), ("from", "value")]  # Megatron-Bridge reads either in any schema
        expected = pairs[1] if name == "conversations" else pairs[0]
        role, content = next((p for p in pairs if isinstance(turn, dict) and p[0] in turn and p[1] in turn), expected)
        if not isinstance(turn, dict) or role not in turn or content not in turn:
            raise InputError(f"{path}:{number}: {name}[{i}] must be an object with {role!r} and {content!r}")
        calls = turn.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise InputError(
                f"{path}:{number}: field '{name}[{i}].tool_calls' must be a list, got {type(calls).__name__}"
            )
        if not (turn[content] is None and calls):  # a tool-call turn's content may be null
            _check_text(path, number, f"{name}[{i}].{content}", turn[content], "the data")
        _check_text(path, number, f"{name}[{i}].{role}", turn[role], "the data")
    tools = record.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise InputError(
            f"{path}:{number}: field 'tools' must be a list of tool schemas (handed to the chat template), got "
            f"{type(tools).__name__} {json.dumps(tools)[:60]}"
        )


def _check_text(path: Path, number: int, name: str, value: Any, flag: str) -> None:
    if not isinstance(value, str):
        raise InputError(
            f"{path}:{number}: field {name!r} must be a string, got {type(value).__name__} "
            f"{json.dumps(value)[:60]}; fix the data, or point {flag} at the right field"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            f"{path}:{number}: field {name!r} holds a lone surrogate (invalid Unicode); fix the data"
        ) from None


def check_jsonl(
    path: str | Path,
    dataset_kwargs: dict[str, Any],
    *,
    first_line: int = 1,
    shown: Any = None,
    shard: bool = False,
    limit: int | None = None,
) -> int:
    """Validate every record before tokenizing; returns the record count. Prompt/answer records need string
    template fields; chat records (``chat: true``) need a ``messages`` list of {role, content} strings. A shard of
    a larger file passes its ``first_line`` and the file's name (``shown``) for the messages, and ``shard`` (it may
    hold no record). A line longer than ``limit`` bytes (default :func:`max_record_bytes`) is refused by its number
    before it is read whole."""
    path = Path(path)
    shown = path if shown is None else shown
    chat = bool(dataset_kwargs.get("chat", False))
    completion = dataset_kwargs.get("prompt_completion_config")  # Megatron-Bridge's dataset.preprocessing
    fields = template_fields(dataset_kwargs)
    count = 0
    for number, record in _iter_records(path, first_line, shown, limit):
        if not isinstance(record, dict):
            raise InputError(f"{shown}:{number}: each line must be a JSON object, got {type(record).__name__}")
        if chat:
            _check_chat(shown, number, record)
        elif any(record.get(key) for key in CHAT_KEYS):
            raise InputError(chat_record_message(shown, number, record))
        elif completion is not None:
            for name in (completion.prompt_column, completion.completion_column):
                if name not in record:
                    raise InputError(
                        f"{shown}:{number}: missing field {name!r} (dataset.preprocessing reads prompt_column="
                        f"{completion.prompt_column!r}, completion_column={completion.completion_column!r})"
                    )
                _check_text(shown, number, name, record[name], "dataset.preprocessing's prompt/completion columns")
        else:
            for name in fields:
                if name not in record:
                    raise InputError(
                        f"{shown}:{number}: missing field {name!r} (the prompt template "
                        f"{dataset_kwargs.get('prompt_template', '{input} {output}')!r} reads it); "
                        f"pass --prompt-key/--answer-key to name your fields"
                    )
                _check_text(shown, number, name, record[name], "--prompt-key/--answer-key")
        count += 1
    if count == 0 and not shard:
        raise InputError(f"{shown}: no records; pass a JSONL file with one example per line")
    return count


def load_megatron_tokenizer(directory: str | Path, config: Any = None) -> Any:
    """The tokenizer Megatron-Bridge's launch builds (``build_tokenizer``) over ``directory``: from ``config`` (the
    recipe's ``TokenizerConfig``: its type, chat template, HF kwargs, special tokens, ...) or, without one,
    Megatron-Bridge's defaults for a Hugging Face directory."""
    import warnings

    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    from mbridge_seqpack.tokenization.tokenizer_settings import default_tokenizer_config, for_directory

    tokenizer_files_sha256(directory)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built = default_tokenizer_config(directory) if config is None else for_directory(config, directory)
            return build_tokenizer(built)
    except Exception as exc:  # noqa: BLE001  (transformers raises many kinds for a broken tokenizer)
        fix = (
            "fix the recipe's tokenizer settings (tokenizer.*)"
            if config is not None
            else "pass a working Hugging Face tokenizer directory with --tokenizer"
        )
        raise InputError(
            f"tokenizer {directory}: Megatron-Bridge cannot load it ({type(exc).__name__}: {str(exc)[:200]}); {fix}"
        ) from None


class SequenceOffsets:
    """``count`` and runtime ``lengths`` (tokens - 1) of sequences laid end to end at ``offsets`` (n+1 entries)."""

    offsets: np.ndarray

    @property
    def count(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets) - 1


@dataclass
class TokenizedSequences(SequenceOffsets):
    """Concatenated tokens of all sequences with offsets, and the label-aligned loss mask as stored.

    ``loss_mask[j]`` says whether position j's prediction (of token j+1) trains, exactly as
    Megatron-Bridge's ``fill_packing_strategy`` writes it; ``lengths`` are runtime lengths (tokens - 1). Data only:
    the artifact's writer reads the placed rows back from these arrays (artifact/row_tokens.py).
    """

    tokens: np.ndarray  # int64 (in memory or memory-mapped)
    loss_mask: np.ndarray  # int8 (in memory or memory-mapped)
    offsets: np.ndarray  # int64, len n+1
    truncated_sequences: int = 0  # examples Megatron-Bridge's truncation shortened (tokenization/truncation.py)
    truncated_tokens: int = 0  # tokens it removed from them
    # "batched" (tokenization/batched_tokens.py) or why Megatron-Bridge's per-example path ran
    tokenization: str = "per example"


@dataclass(frozen=True)
class _Chunk:
    """A JSONL file of consecutive records of the input and their line numbers there."""

    path: Path
    numbers: list[int]


def _chunks(
    path: Path, lines_per_chunk: int, directory: Path, first_line: int = 1, shown: Any = None, limit: int | None = None
) -> Iterator[_Chunk]:
    """The non-empty lines of ``path`` as JSONL files of at most ``lines_per_chunk`` lines, one at a time, no line
    read past ``limit`` bytes (:func:`max_record_bytes`)."""
    chunk: list[bytes] = []
    numbers: list[int] = []
    index = 0

    def flush() -> _Chunk:
        target = directory / f"chunk_{index:06d}.jsonl"
        target.write_bytes(b"".join(line if line.endswith(b"\n") else line + b"\n" for line in chunk))
        return _Chunk(target, numbers)

    limit = max_record_bytes() if limit is None else limit
    with open(path, "rb") as handle:
        for number, raw in _bounded_lines(handle, first_line, path if shown is None else shown, limit):
            if raw.strip():
                chunk.append(raw)
                numbers.append(number)
            if len(chunk) == lines_per_chunk:
                yield flush()
                chunk, numbers, index = [], [], index + 1
    if chunk:
        yield flush()


def _failing_record(chunk: _Chunk, fails: Callable[[Path], bool]) -> int | None:
    """The line number of the one record of ``chunk`` on which Megatron-Bridge's prep fails alone (bisected: each
    half is prepared on its own), or None when no single record does (then the failure is not the data's)."""
    lines = chunk.path.read_bytes().splitlines(keepends=True)
    probes: list[Path] = []

    def failing(lo: int, hi: int) -> bool:
        # a new name each time: Megatron-Bridge's dataset keeps an index of a file's lines by its path
        probe = chunk.path.with_name(f"{chunk.path.stem}_probe{len(probes)}.jsonl")
        probes.append(probe)
        probe.write_bytes(b"".join(lines[lo:hi]))
        return fails(probe)

    lo, hi = 0, len(lines)
    try:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if failing(lo, mid):
                hi = mid
            elif failing(mid, hi):
                lo = mid
            else:
                return None
        return chunk.numbers[lo] if failing(lo, hi) else None
    finally:
        for probe in probes:
            probe.unlink(missing_ok=True)


def tokenize_split(
    path: str | Path,
    tokenizer: Any,
    *,
    max_seq_length: int,
    pad_seq_to_mult: int,
    dataset_kwargs: dict[str, Any],
    seed: int,
    workers: int = 1,
    lines_per_chunk: int = 50_000,
    progress: bool | None = None,
    records: int | None = None,
    spill_dir: str | Path | None = None,
    batched: bool = True,
    first_line: int = 1,
    shown: Any = None,
    record_limit: int | None = None,
) -> TokenizedSequences:
    """Tokenize one JSONL split with Megatron-Bridge's ``tokenize_dataset`` (its GPT SFT dataset classes) with
    ``workers`` processes (``pack`` passes every core; Megatron-Bridge's own default, -1, runs serially); batched
    tokenization runs in one process, its encoding using every core.

    The file is streamed in chunks of ``lines_per_chunk`` records: Megatron-Bridge's Python objects exist for one
    chunk at a time. Each chunk's tokens and loss mask are appended to flat files in ``spill_dir`` (9 bytes per
    token on disk) and come back memory-mapped, so memory holds one chunk plus 8 bytes per sequence and an input
    larger than memory still packs; without ``spill_dir`` they are kept in memory. A progress bar (records,
    tokens/s) shows on a terminal (``progress=None``), always (True) or never (False); ``records`` (the count
    ``check_jsonl`` returned) sizes it without reading the file once more. ``batched``: prompt-template pieces are
    encoded a chunk at a time (tokenization/batched_tokens.py, the same ids); where that does not apply, or when False,
    Megatron-Bridge's per-example path runs, and ``tokenization`` says which and why. A record Megatron-Bridge's
    prep fails on (a chat template that raises, say) is found by bisecting its chunk and refused by its line
    (numbered from ``first_line``, the file named ``shown``: a shard of a larger file), an ``InputError``.
    """
    import functools
    import io
    import logging
    import tempfile
    import time

    from megatron.bridge.data.packing.offline import tokenize_dataset

    from mbridge_seqpack.textout import progress_bar
    from mbridge_seqpack.tokenization.assembly import AssemblyRequest, from_items
    from mbridge_seqpack.tokenization.batched_tokens import expected_refusal
    from mbridge_seqpack.tokenization.truncation import counting_gpt_sft_split

    if batched and expected_refusal(tokenizer, dataset_kwargs) is None:
        workers = 1  # the encoding runs on every core; a pool would only pickle the examples back

    path = Path(path)
    if records is None:
        with open(path, "rb") as handle:
            records = sum(1 for raw in handle if raw.strip())
    sink = _TokenSink(Path(spill_dir) if spill_dir is not None else None)
    sizes: list[np.ndarray] = []
    start, tokens = time.perf_counter(), 0
    cut_sequences = cut_tokens = 0
    refusals: list[str] = []
    assembly_refusals: list[str] = []
    bar = progress_bar(total=records, unit="rec", desc=f"tokenize {path.name}", enabled=progress)
    # input chunks and index files go next to the spilled tokens (inside the pack's staging directory, removed with
    # it, so a killed pack leaves nothing in the system temporary directory)
    work_parent = Path(spill_dir) if spill_dir is not None else None
    if work_parent is not None:
        work_parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="mbridge_seqpack_tokenize_", dir=work_parent) as work,
        contextlib.ExitStack() as stack,
        bar,  # closed first: the folded warnings' line comes after the finished bar, not inside it
    ):
        index_dir = Path(work) / "index"
        index_dir.mkdir()
        kwargs = {**dataset_kwargs, "index_mapping_dir": str(index_dir)}  # never write index files by the input
        logging.getLogger("megatron.bridge").setLevel(logging.WARNING)
        folded = FoldedWarning(r".* is not long enough to truncate\.$")  # once per example: one line at the end
        dataset_logger = logging.getLogger("megatron.bridge.data.datasets.gpt_sft")
        dataset_logger.addFilter(folded)
        stack.callback(dataset_logger.removeFilter, folded)
        stack.callback(folded.report, path)

        def prepare(chunk: Path, request: Any, refused: list[str], workers: int) -> Any:
            builder = functools.partial(counting_gpt_sft_split, batched=batched, refusals=refused, assembly=request)
            with (
                contextlib.redirect_stderr(io.StringIO()),
                contextlib.redirect_stdout(io.StringIO()),
                chat_template_refusals(path),
            ):
                return tokenize_dataset(
                    chunk,
                    tokenizer,
                    max_seq_length,
                    seed,
                    kwargs,
                    pad_seq_to_mult=pad_seq_to_mult,
                    num_tokenizer_workers=workers,
                    dataset_builder=builder,
                )

        def fails(probe: Path) -> bool:
            try:
                prepare(probe, AssemblyRequest(max_seq_length, pad_seq_to_mult) if batched else None, [], 1)
            except Exception:  # noqa: BLE001  (whatever the prep raises on this record alone)
                return True
            return False

        for chunk in _chunks(path, lines_per_chunk, Path(work), first_line, shown, record_limit):
            request = AssemblyRequest(max_seq_length, pad_seq_to_mult) if batched else None
            try:
                items = prepare(chunk.path, request, refusals, workers)
            except SeqpackError:
                raise
            except Exception as exc:  # a record the user's data or chat template makes Megatron-Bridge's prep fail on
                number = _failing_record(chunk, fails)
                if number is None:
                    raise  # no single record fails alone: not the data's (exit 3, a plugin bug)
                raise InputError(
                    _tokenizer_refusal(tokenizer, max_seq_length, pad_seq_to_mult, dataset_kwargs, seed, exc)
                    or _prep_failure(shown if shown is not None else path, number, dataset_kwargs, exc)
                ) from None
            count = len(chunk.numbers)
            chunk.path.unlink()
            bar.update(count)
            arrays = request.chunk(items) if request is not None else from_items(items)
            del items
            if request is not None and request.refusal is not None:
                assembly_refusals.append(request.refusal)
            if arrays.sizes.size == 0:
                continue
            cut_sequences += int((arrays.truncated > 0).sum())
            cut_tokens += int(arrays.truncated.sum())
            sink.append(arrays.ids, arrays.mask)
            sizes.append(arrays.sizes)
            tokens += int(arrays.sizes.sum())
            del arrays
            bar.set_postfix_str(f"{tokens / max(time.perf_counter() - start, 1e-9):,.0f} tokens/s")
    offsets = np.zeros(sum(s.size for s in sizes) + 1, dtype=np.int64)
    if sizes:
        np.cumsum(np.concatenate(sizes), out=offsets[1:])
    tokens, loss_mask = sink.finish()
    if not batched:
        how = "per example (batching off)"
    elif refusals:
        how = f"per example ({refusals[0]})"
    elif assembly_refusals:
        how = f"batched, assembled per example ({assembly_refusals[0]})"
    else:
        how = "batched"
    return TokenizedSequences(tokens, loss_mask, offsets, cut_sequences, cut_tokens, how)


class FoldedWarning(logging.Filter):
    """Drops the log records of Megatron-Bridge's prep that match ``pattern`` (a per-example warning) and counts
    them; :meth:`report` says them once, with the count."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)
        self.count = 0
        self.first = ""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.pattern.match(message) is None:
            return True
        self.count += 1
        self.first = self.first or message
        return False

    def report(self, path: Any) -> None:
        if self.count:
            import textwrap

            said = (
                f"Megatron-Bridge's prep of {Path(str(path)).name} warned {self.count} time(s) like "
                f"'{self.first}' (a truncation field shorter than its share of the cut: the others are cut "
                "more); folded into this line"
            )
            lines = textwrap.wrap(said, 100, initial_indent="note: ", subsequent_indent="  ", break_long_words=False)
            print("\n".join(lines), file=sys.stderr)


class _TokenSink:
    """Where tokenized chunks go: appended to two flat files (read back memory-mapped), or kept in memory."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.ids: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []
        self.count = 0
        if directory is not None:
            self.paths = (directory / "tokens.int64", directory / "loss_mask.int8")
            for path in self.paths:
                self._write(path, "wb", None)

    def append(self, ids: np.ndarray, mask: np.ndarray) -> None:
        self.count += ids.size
        if self.directory is None:
            self.ids.append(ids)
            self.masks.append(mask)
            return
        for path, values in zip(self.paths, (ids, mask)):
            self._write(path, "ab", values)

    @staticmethod
    def _write(path: Path, mode: str, values: np.ndarray | None) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, mode) as handle:
                if values is not None:
                    values.tofile(handle)
        except OSError as exc:
            raise InputError(
                f"{path}: cannot spill tokenized data ({os_reason(exc)}); free space or choose another --output"
            ) from None

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        if self.directory is None:
            return (
                np.concatenate(self.ids) if self.ids else np.zeros(0, np.int64),
                np.concatenate(self.masks) if self.masks else np.zeros(0, np.int8),
            )
        if self.count == 0:  # np.memmap refuses an empty file
            return np.zeros(0, np.int64), np.zeros(0, np.int8)
        return (
            np.memmap(self.paths[0], dtype=np.int64, mode="r", shape=(self.count,)),
            np.memmap(self.paths[1], dtype=np.int8, mode="r", shape=(self.count,)),
        )
