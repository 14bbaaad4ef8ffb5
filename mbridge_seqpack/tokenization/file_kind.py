"""What an input that is not JSONL is, said by its first bytes: a compressed file or a JSON array is a common
first mistake, and "not UTF-8" or "not valid JSON" at line 1 would name the symptom, not the cause."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from mbridge_seqpack.errors import InputError

__all__ = [
    "CHAT_KEYS",
    "COMPRESSED",
    "chat_record_message",
    "chat_template_refusals",
    "compressed_kind",
    "not_jsonl_message",
    "json_array_message",
]

#: the fields of a conversation Megatron-Bridge's chat dataset reads (data/sft_processing.py _CONVERSATION_KEYS)
CHAT_KEYS = ("messages", "conversation", "conversations")

#: (leading bytes, format, the command that decompresses ``FILE`` to ``OUT``)
COMPRESSED: tuple[tuple[bytes, str, str], ...] = (
    (b"\x1f\x8b", "gzip", "gunzip -c FILE > OUT"),
    (b"\x28\xb5\x2f\xfd", "zstd", "zstd -dc FILE > OUT"),
    (b"BZh", "bzip2", "bunzip2 -c FILE > OUT"),
    (b"\xfd7zXZ\x00", "xz", "xz -dc FILE > OUT"),
    (b"PK\x03\x04", "zip", "unzip -p FILE > OUT"),
)


def _plain_name(path: Path) -> str:
    """``data.jsonl.gz`` -> ``data.jsonl``; ``data.gz`` -> ``data.jsonl``."""
    stem = path.name
    for suffix in (".gz", ".gzip", ".zst", ".zstd", ".bz2", ".xz", ".zip"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return stem if stem.endswith(".jsonl") else f"{stem}.jsonl"


def compressed_kind(head: bytes) -> tuple[str, str] | None:
    """(format, decompress command with FILE/OUT) when ``head`` (a file's first bytes) starts a compressed file."""
    for magic, kind, command in COMPRESSED:
        if head.startswith(magic):
            return kind, command
    return None


def not_jsonl_message(path: Path, shown: object, head: bytes) -> str | None:
    """The one line for a compressed input (None when ``head`` is not one)."""
    found = compressed_kind(head)
    if found is None:
        return None
    kind, command = found
    out = path.with_name(_plain_name(path))
    fix = command.replace("FILE", str(path)).replace("OUT", str(out))
    return f"{shown}: is a {kind}-compressed file, not JSONL text; decompress it first ({fix}) and pass {out}"


def json_array_message(shown: object) -> str:
    """The one line for a JSON array (pretty-printed or on one line) where JSONL is needed."""
    return (
        f"{shown}: is a JSON array ('[' first), not JSONL; pack needs one JSON object per line: convert it, e.g. "
        f"jq -c '.[]' {shown} > {_lines_name(Path(str(shown)))}"
    )


def _lines_name(path: Path) -> str:
    """Where the converted lines go: never the array's own name (the shell would truncate it first)."""
    return f"{path.stem}_lines.jsonl" if path.suffix == ".jsonl" else f"{path.stem}.jsonl"


def chat_record_message(shown: object, number: int, record: dict) -> str:
    """A chat record where prompt/answer records are read: say which setting reads chat records."""
    import shlex

    from mbridge_seqpack.tokenization.dataset_kwargs import chat_preprocessing_overrides

    key = next(key for key in CHAT_KEYS if record.get(key))
    overrides = " ".join(map(shlex.quote, chat_preprocessing_overrides()))
    return (
        f"{shown}:{number}: a chat record ({key!r}), but prompt/answer records are read; to pack chat records "
        f"through the tokenizer's chat template add --chat, or with --recipe the overrides {overrides} (and launch "
        "with them)"
    )


#: the starts of Megatron-Bridge's chat-template refusals (data/datasets/utils.py _chat_preprocess): the template,
#: the user's, cannot give what its chat dataset needs
TEMPLATE_REFUSALS = ("The tokenizer's chat_template does not contain", "Cannot apply chat template with tokenizer")


@contextlib.contextmanager
def chat_template_refusals(shown: object) -> Iterator[None]:
    """Megatron-Bridge refusing the tokenizer's chat template (raised in each tokenizer worker) as one line, exit 2."""
    try:
        yield
    except ValueError as exc:
        text = str(exc)
        if not text.startswith(TEMPLATE_REFUSALS):
            raise
        raise InputError(
            f"{shown}: Megatron-Bridge cannot tokenize these chat records with the tokenizer's chat template "
            f"({text.split('. ')[0]}); wrap each assistant turn of the template in {{% generation %}}...{{% "
            "endgeneration %} (the recipe's tokenizer.chat_template, or chat_template in the tokenizer's "
            "tokenizer_config.json), or train on every token (ChatSFTPreprocessingConfig loss_mode full)"
        ) from None
