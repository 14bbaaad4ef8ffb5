"""#52 item 2: the seal covers every file the tokenizer loads, for each tokenizer family (byte-level BPE, WordPiece,
SentencePiece, tiktoken-style), derived from the classes that load them (tokenization/tokenizer_files.py). The
reference is transformers itself: the files its ``AutoTokenizer`` opens from Python, and the ids it gives after a
vocabulary edit; an edit of any sealed file stops the launch (the content check, and ``validate()`` for a pack)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.artifact.content_check import TokenizerFiles
from mbridge_seqpack.tokenization.sequences import sealed_tokenizer_files, tokenizer_files_sha256
from tests.support.tokenizers import FAMILIES

_OPENED: list[str] | None = None


def _record_open(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _OPENED is not None and isinstance(args[0], (str, os.PathLike)):
        _OPENED.append(os.fspath(args[0]))


sys.addaudithook(_record_open)


def _auto_tokenizer(directory: Path) -> tuple[Any, set[str]]:
    """transformers' AutoTokenizer over ``directory`` and the files under it that Python opened while loading."""
    global _OPENED
    from transformers import AutoTokenizer

    _OPENED = []
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    finally:
        opened, _OPENED = _OPENED, None
    root = str(directory.resolve())
    return tokenizer, {os.path.relpath(path, root) for path in map(os.path.realpath, opened) if path.startswith(root)}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    build, vocabulary = FAMILIES[request.param]
    directory = build(tmp_path_factory.mktemp(request.param.split()[0].replace("-", "")))
    return directory, vocabulary


def _stops(directory: Path, sealed: str) -> str | None:
    return TokenizerFiles(directory, sealed).check(lambda n: None)


def test_the_seal_names_every_file_the_tokenizer_loads(family: tuple[Path, str]) -> None:
    directory, vocabulary = family
    tokenizer, opened = _auto_tokenizer(directory)
    names = sealed_tokenizer_files(directory)
    assert vocabulary in names
    assert opened <= set(names), f"loaded but not sealed: {sorted(opened - set(names))}"
    assert tokenizer("the quick brown fox")["input_ids"]


def test_an_edit_of_any_sealed_file_stops_the_launch(family: tuple[Path, str]) -> None:
    directory, _ = family
    sealed = tokenizer_files_sha256(directory)
    assert _stops(directory, sealed) is None
    for name in sealed_tokenizer_files(directory):
        path = directory / name
        original = path.read_bytes()
        path.write_bytes(original + b"\n")
        try:
            assert _stops(directory, sealed) == (
                f"tokenizer {directory}: its files differ from those the pack was tokenized with (sha256, their "
                "sizes and modification times notwithstanding) - re-pack with this tokenizer"
            ), name
        finally:
            path.write_bytes(original)
    assert _stops(directory, sealed) is None


def _swap_two_tokens(path: Path, first: str, second: str) -> None:
    """Swap two tokens of the vocabulary (the #52 red-team edit): other ids, the same tokens."""
    text = path.read_text()
    if path.suffix == ".json":
        vocab = json.loads(text)
        vocab[first], vocab[second] = vocab[second], vocab[first]
        path.write_text(json.dumps(vocab))
        return
    lines = text.split("\n")
    a, b = lines.index(first), lines.index(second)
    lines[a], lines[b] = lines[b], lines[a]
    path.write_text("\n".join(lines))


@pytest.mark.parametrize("name", ["byte-level BPE", "WordPiece"])
def test_two_tokens_swapped_in_the_vocabulary_change_the_ids_and_stop_the_launch(name: str, tmp_path: Path) -> None:
    build, vocabulary = FAMILIES[name]
    directory = build(tmp_path / "tok")
    sealed = tokenizer_files_sha256(directory)
    tokenizer = _auto_tokenizer(directory)[0]
    before = tokenizer("the fox", add_special_tokens=False)["input_ids"]
    first, second = tokenizer.convert_ids_to_tokens(before)[:2]
    _swap_two_tokens(directory / vocabulary, first, second)
    after = _auto_tokenizer(directory)[0]("the fox", add_special_tokens=False)["input_ids"]
    assert after != before  # the edit trains other tokens
    assert _stops(directory, sealed) is not None


def test_config_json_is_sealed_by_the_fields_that_choose_the_class(tmp_path: Path) -> None:
    """AutoTokenizer reads config.json to choose the class (model_type, tokenizer_class): those fields are sealed,
    the model's other fields are not (an edit of the model's width does not change the tokens)."""
    directory = FAMILIES["WordPiece"][0](tmp_path / "tok")
    (directory / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    sealed = tokenizer_files_sha256(directory)
    (directory / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 16}))
    assert _stops(directory, sealed) is None
    (directory / "config.json").write_text(json.dumps({"model_type": "gpt2", "hidden_size": 16}))
    assert _stops(directory, sealed) is not None


def test_a_file_added_that_the_tokenizer_would_load_stops_the_launch(tmp_path: Path) -> None:
    """A chat template or added-tokens file put beside a sealed tokenizer changes what it loads."""
    directory = FAMILIES["byte-level BPE"][0](tmp_path / "tok")
    sealed = tokenizer_files_sha256(directory)
    (directory / "notes.txt").write_text("not read by any tokenizer")
    assert _stops(directory, sealed) is None
    (directory / "chat_template.jinja").write_text("{{ messages }}")
    assert _stops(directory, sealed) is not None


def test_a_single_file_sentencepiece_tokenizer_is_sealed_by_its_bytes(tmp_path: Path) -> None:
    from tests.support.tokenizers import sentencepiece_model

    model = sentencepiece_model(tmp_path / "spm.model")
    assert sealed_tokenizer_files(model) == [""]
    sealed = tokenizer_files_sha256(model)
    copy = tmp_path / "copy.model"
    shutil.copy(model, copy)
    assert tokenizer_files_sha256(copy) == sealed  # the name of the file is not sealed, its bytes are
    model.write_bytes(model.read_bytes()[:-1] + bytes([model.read_bytes()[-1] ^ 1]))
    assert _stops(model, sealed) is not None


@pytest.mark.slow
def test_a_wordpiece_pack_whose_vocab_txt_is_edited_after_packing_is_refused(packed_cfg: Any, tmp_path: Path) -> None:
    """The #52 red-team case end to end: a pack tokenized with a WordPiece tokenizer whose vocabulary is only
    vocab.txt; two tokens swapped there after packing; validate() refuses the pack (and the launch's content check
    reads the edit)."""
    from mbridge_seqpack.artifact.pack_files import content_plan
    from tests.support.packs import pack_rule, run_pack, small_jsonl

    directory = FAMILIES["WordPiece"][0](tmp_path / "tok")
    source = small_jsonl(tmp_path / "training.jsonl", n=8)
    run_pack({"training": source}, tmp_path / "pack", tokenizer=directory)
    packed_cfg.tokenizer.tokenizer_model = str(directory)
    packed_cfg.dataset.offline_packing_specs.packed_train_data_path = str(
        tmp_path / "pack" / "training_4096.idx.parquet"
    )
    packed_cfg.dataset.do_validation = False
    assert pack_rule(packed_cfg) == []
    _swap_two_tokens(directory / "vocab.txt", "the", "fox")
    (v,) = pack_rule(packed_cfg)
    assert "the pack was tokenized with another tokenizer" in v.rule
    assert content_plan(packed_cfg).tokenizer.check(lambda n: None) is not None
