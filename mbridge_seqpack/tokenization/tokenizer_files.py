"""The files a tokenizer loads, derived from the classes that load them, not from a list of names.

The seal (fingerprint ``tokenizer_sha256``) must change whenever a file that changes the tokens changes. Which files
those are depends on the tokenizer: a WordPiece tokenizer's vocabulary is ``vocab.txt``, a SentencePiece model's
``tokenizer.model`` or ``spiece.model``, a byte-level BPE's ``vocab.json`` and ``merges.txt``. So the names come from
what transformers' ``AutoTokenizer`` (which Megatron-Bridge's ``HuggingFaceTokenizer`` calls) reads for the
directory (transformers' tokenization_auto.py ``AutoTokenizer.from_pretrained`` and tokenization_utils_base.py
``PreTrainedTokenizerBase.from_pretrained``):

- the ``vocab_files_names`` each candidate class declares: the class ``tokenizer_config.json`` names (with and
  without ``Fast``), the one ``config.json`` names, the one registered for ``config.json``'s ``model_type``, and the
  generic ``TokenizersBackend`` every resolution falls back to;
- the files every class reads in a directory: added tokens, special tokens map, ``tokenizer_config.json``, the full
  ``tokenizer.json`` (or the versioned ``fast_tokenizer_files`` it names), the chat template file(s) and
  ``additional_chat_templates/*.jinja``;
- the files transformers falls back to converting from when ``tokenizer.json`` is absent (any ``*.model``,
  ``tekken.json``, ``tiktoken.model``) and the module of a remote-code class (``auto_map``);
- of ``config.json``, the fields that choose the class (``model_type``, ``tokenizer_class``, ``model_name``), not the
  rest of the model's configuration.

A tokenizer that is one file (Megatron-Core's ``SentencePieceTokenizer`` over a ``.model`` file) is that file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

__all__ = ["CLASS_FIELDS", "tokenizer_files", "class_choice"]

#: the ``config.json`` fields AutoTokenizer chooses the tokenizer class by
CLASS_FIELDS = ("model_type", "tokenizer_class", "model_name")
#: files read by every class in a directory (transformers' ``additional_files_names``, and the processors' legacy
#: chat template file), and those it converts from without a ``tokenizer.json``
_EVERY_CLASS = (
    "added_tokens.json",
    "special_tokens_map.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "chat_template.jinja",
    "chat_template.json",
)
_CONVERTED_FROM = ("tekken.json", "tiktoken.model")


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _class_names(config: dict[str, Any], model: dict[str, Any]) -> Iterator[str]:
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    for name in (
        config.get("tokenizer_class"),
        model.get("tokenizer_class"),
        TOKENIZER_MAPPING_NAMES.get(str(model.get("model_type"))),
        "TokenizersBackend",
    ):
        if isinstance(name, str) and name:
            base = name.removesuffix("Fast")
            yield from (name, base, base + "Fast")


def _declared(config: dict[str, Any], model: dict[str, Any]) -> set[str]:
    """The ``vocab_files_names`` of every class AutoTokenizer may load the directory with."""
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    names: set[str] = set()
    for name in _class_names(config, model):
        try:
            cls = tokenizer_class_from_name(name)
        except Exception:  # noqa: BLE001  (a class whose module cannot import here: its files are found below)
            cls = None
        declared = getattr(cls, "vocab_files_names", None) or {}
        names.update(value for value in declared.values() if isinstance(value, str))
    return names


def _remote_modules(config: dict[str, Any]) -> set[str]:
    """The module files of a remote-code tokenizer class (``auto_map``), read when the class is loaded."""
    refs = config.get("auto_map")
    refs = refs.get("AutoTokenizer") if isinstance(refs, dict) else refs
    modules = set()
    for ref in refs if isinstance(refs, (list, tuple)) else []:
        if isinstance(ref, str) and "." in ref:
            modules.add(ref.split("--")[-1].rsplit(".", 1)[0].replace(".", "/") + ".py")
    return modules


def tokenizer_files(target: str | Path) -> list[str]:
    """The files (relative to ``target``, sorted) the tokenizer at ``target`` loads that exist there: a directory's
    as the module docstring derives them, or a single-file tokenizer itself (``[""]``: the path is the file)."""
    root = Path(target)
    if root.is_file():
        return [""]
    config = _json(root / "tokenizer_config.json")
    model = _json(root / "config.json")
    names = set(_EVERY_CLASS) | _declared(config, model) | set(_CONVERTED_FROM) | _remote_modules(config)
    fast = config.get("fast_tokenizer_files")
    names.update(name for name in fast if isinstance(name, str)) if isinstance(fast, list) else None
    names.update(path.name for path in root.glob("*.model"))
    names.update(f"additional_chat_templates/{path.name}" for path in root.glob("additional_chat_templates/*.jinja"))
    return sorted(name for name in names if (root / name).is_file())


def class_choice(target: str | Path) -> bytes | None:
    """The ``config.json`` fields that choose the tokenizer class (canonical JSON), None without a ``config.json``:
    sealed instead of the whole file, whose other fields do not change the tokens."""
    path = Path(target) / "config.json"
    if not path.is_file():
        return None
    model = _json(path)
    return json.dumps({key: model.get(key) for key in CLASS_FIELDS}, sort_keys=True).encode()
