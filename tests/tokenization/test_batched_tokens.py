"""#23: prompt-template pieces encoded a chunk per tokenizer call give exactly the tokens and loss masks of
Megatron-Bridge's per-example path (its own ``GPTSFTDataset`` on its own tokenizer, ``batched=False``), across
templates, BOS/SEP/EOS, ``answer_only_loss``, truncation, examples longer than the pack, empty answers, unicode,
pack sizes and ``pad_seq_to_mult``, serially and in Megatron-Bridge's worker pool; the cases it cannot batch say
why and run Megatron-Bridge's path."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.packs import DATA, TOKENIZER

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tokenizer(megatron_bridge: Any) -> Any:
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    return load_megatron_tokenizer(TOKENIZER)


def _both(path: Path, tokenizer: Any, **kwargs: Any) -> tuple[Any, Any]:
    from mbridge_seqpack.tokenization.sequences import tokenize_split

    base = {"max_seq_length": 4096, "pad_seq_to_mult": 1, "dataset_kwargs": {}, "seed": 0, "progress": False}
    base.update(kwargs)
    return tuple(tokenize_split(path, tokenizer, batched=batched, **base) for batched in (False, True))


def _assert_identical(megatron: Any, batched: Any) -> None:
    assert np.array_equal(megatron.offsets, batched.offsets)
    assert np.array_equal(megatron.tokens, batched.tokens)
    assert np.array_equal(megatron.loss_mask, batched.loss_mask)
    assert (megatron.truncated_sequences, megatron.truncated_tokens) == (
        batched.truncated_sequences,
        batched.truncated_tokens,
    )
    assert megatron.tokenization == "per example (batching off)"


@pytest.mark.parametrize(
    "dataset_kwargs, max_seq_length, mult",
    [
        ({}, 4096, 1),
        ({"prompt_template": "Q: {input}\nA: {output}"}, 512, 4),
        ({"add_bos": True, "add_sep": True, "sep_id": 7, "answer_only_loss": False}, 2048, 8),
        ({"add_eos": False, "truncation_method": "left"}, 64, 1),  # most examples cut
    ],
)
def test_the_embedded_corpus_tokenizes_identically(
    tokenizer: Any, dataset_kwargs: dict[str, Any], max_seq_length: int, mult: int
) -> None:
    megatron, batched = _both(
        DATA / "training.jsonl",
        tokenizer,
        max_seq_length=max_seq_length,
        pad_seq_to_mult=mult,
        dataset_kwargs=dataset_kwargs,
        workers=1,
    )
    _assert_identical(megatron, batched)
    assert batched.tokenization == "batched"
    assert batched.count == 1799


def test_identical_to_megatron_bridges_worker_pool(tokenizer: Any) -> None:
    """Megatron-Bridge's path in its pool of two workers against the batched path, which runs in one process (its
    encoding is multi-threaded), chunk by chunk."""
    megatron, batched = _both(DATA / "training.jsonl", tokenizer, workers=2, lines_per_chunk=700)
    _assert_identical(megatron, batched)
    assert batched.tokenization == "batched"


_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=0, max_size=120
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(st.tuples(_TEXT, _TEXT), min_size=1, max_size=40),
    max_seq_length=st.sampled_from([16, 48, 50, 256]),  # 50: its pad cap (48 for 4) cuts examples of 50 tokens
    mult=st.sampled_from([1, 2, 4]),
    answer_only_loss=st.booleans(),
)
def test_random_unicode_examples_tokenize_identically(
    tmp_path_factory: pytest.TempPathFactory,
    tokenizer: Any,
    rows: list[tuple[str, str]],
    max_seq_length: int,
    mult: int,
    answer_only_loss: bool,
) -> None:
    """Empty answers and prompts, spaces at the ends (which Megatron-Bridge strips), unicode, repeated texts,
    examples longer than the pack (truncated by its prep)."""
    path = tmp_path_factory.mktemp("rows") / "training.jsonl"
    path.write_text("".join(json.dumps({"input": q, "output": a}) + "\n" for q, a in rows))
    megatron, batched = _both(
        path,
        tokenizer,
        max_seq_length=max_seq_length,
        pad_seq_to_mult=mult,
        dataset_kwargs={"answer_only_loss": answer_only_loss},
        workers=1,
    )
    _assert_identical(megatron, batched)


def test_what_cannot_be_batched_says_why_and_runs_megatron_bridges_path(tmp_path: Path, megatron_bridge: Any) -> None:
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer, tokenize_split
    from tests.support.packs import chat_corpus, chat_tokenizer

    tokenizer = load_megatron_tokenizer(chat_tokenizer(tmp_path))
    kwargs = {"chat": True, "use_hf_tokenizer_chat_template": True}
    seqs = tokenize_split(
        chat_corpus(tmp_path / "chat.jsonl", 5),
        tokenizer,
        max_seq_length=256,
        pad_seq_to_mult=1,
        dataset_kwargs=kwargs,
        seed=0,
        progress=False,
    )
    assert seqs.tokenization == "per example (a chat dataset (one chat template per conversation))"
    assert seqs.count == 5


def test_pack_reports_the_tokenization(tmp_path: Path, megatron_bridge: Any, capsys: pytest.CaptureFixture) -> None:
    from mbridge_seqpack.cli.main import main

    assert main(["pack", str(DATA / "validation.jsonl"), "--pack-size", "2048", "--output", str(tmp_path / "p")]) == 0
    assert ", tokenized batched" in " ".join(capsys.readouterr().out.split())
    (entry,) = json.loads((tmp_path / "p" / "2048_metadata.jsonl").read_text())
    assert entry["tokenization"] == "batched"


def test_every_piece_megatron_bridge_tokenizes_comes_from_the_batch(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shortcut is taken, not only harmless: while Megatron-Bridge's ``_process_example`` runs over the corpus
    (templates, BOS/SEP, truncation), no piece misses the chunk's ids and falls back to a tokenizer call."""
    from mbridge_seqpack.tokenization import batched_tokens

    misses: list[str] = []
    lookup = batched_tokens.BatchedTokenizer.tokenize

    def counted(self: Any, text: str) -> list[int]:
        if text not in self._ids:
            misses.append(text)
        return lookup(self, text)

    monkeypatch.setattr(batched_tokens.BatchedTokenizer, "tokenize", counted)
    for kwargs in ({}, {"prompt_template": "Q: {input}\nA: {output}", "add_bos": True}):
        _, batched = _both(DATA / "training.jsonl", tokenizer, max_seq_length=256, dataset_kwargs=kwargs, workers=1)
        assert batched.tokenization == "batched" and batched.count == 1799
    assert misses == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(
        st.one_of(
            st.text(max_size=40),
            st.sampled_from(["<|endoftext|>", "<|pad|>", " <|endoftext|> x", "  ", "", "\n\n", "a<|pad|>b"]),
        ),
        min_size=1,
        max_size=12,
    ),
    truncating=st.booleans(),
)
def test_the_fast_batch_encoding_gives_the_transformers_ids(texts: list[str], truncating: bool) -> None:
    """``_encode_batch`` (``encode_batch_fast`` after one ``transformers`` call) = ``hf(texts).input_ids``: special
    tokens written in the text, empty and blank strings, any unicode; also when the Rust tokenizer was left with
    truncation on (``transformers`` turns it off for its call, and so the fast path must find it off)."""
    from mbridge_seqpack.tokenization.batched_tokens import _encode_batch

    hf, reference = _hf_tokenizers()
    if truncating:
        hf._tokenizer.enable_truncation(max_length=2)
    assert _encode_batch(hf, texts) == reference(texts).input_ids


@functools.lru_cache(maxsize=None)
def _hf_tokenizers() -> tuple[Any, Any]:
    """The embedded tokenizer twice: the one under test (its Rust state changed by tests) and a reference."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER)), AutoTokenizer.from_pretrained(str(TOKENIZER))


def _chunk_request(path: Path, tokenizer: Any, max_seq_length: int, mult: int, **dataset_kwargs: Any) -> Any:
    """Megatron-Bridge's ``tokenize_dataset`` on ``path`` with the assembling builder; the request it filled."""
    from megatron.bridge.data.packing.offline import tokenize_dataset

    from mbridge_seqpack.tokenization.assembly import AssemblyRequest
    from mbridge_seqpack.tokenization.truncation import counting_gpt_sft_split

    request = AssemblyRequest(max_seq_length, mult)
    builder = functools.partial(counting_gpt_sft_split, batched=True, assembly=request)
    kwargs = {"index_mapping_dir": str(path.parent / "index"), **dataset_kwargs}
    items = tokenize_dataset(path, tokenizer, max_seq_length, 0, kwargs, pad_seq_to_mult=mult, dataset_builder=builder)
    return request, items


def test_examples_that_need_no_truncation_are_assembled_in_arrays(tmp_path: Path, tokenizer: Any) -> None:
    """The assembly is taken, not only harmless: at 4096 tokens no example of the embedded corpus reaches
    Megatron-Bridge's ``_process_example``; at 64 exactly those it truncates do (and a record without its answer,
    which its ``is_test`` prep reads as an empty one), and their items are what ``tokenize_dataset`` returned."""
    source = tmp_path / "training.jsonl"
    rows = (DATA / "training.jsonl").read_text().splitlines()
    source.write_text("\n".join(rows[:40] + [json.dumps({"input": "no answer here"})]) + "\n")
    request, items = _chunk_request(source, tokenizer, 4096, 1)
    assert request.refusal is None and request.done.remaining.tolist() == [40] and len(items) == 1
    assert request.chunk(items).sizes.size == 41

    whole, _ = _both(source, tokenizer, workers=1)  # at 4096 tokens: every example whole
    request, items = _chunk_request(source, tokenizer, 64, 4)
    cut = [j for j in range(40) if whole.lengths[j] + 1 > 65]  # more than the 64 + 1 stored tokens
    assert request.done.remaining.tolist() == [*cut, 40] and len(items) == len(cut) + 1 > 10


@pytest.mark.parametrize(
    "dataset_kwargs, max_seq_length, mult",
    [
        ({"virtual_tokens": 3, "add_bos": True, "tokens_to_generate": 40}, 128, 2),
        (
            {"prompt_template": "{system} [Q] {input}\n\n[A] {output}", "truncation_field": "system,input"},
            96,
            8,
        ),
        ({"prompt_template": "{input}{output}", "add_eos": False, "add_sep": True, "sep_id": 3}, 4096, 16),
        ({}, 100, 8),  # the pad cap, 96, cuts examples of 98 to 101 tokens
    ],
)
def test_virtual_tokens_several_fields_and_bare_templates_assemble_identically(
    tmp_path: Path, tokenizer: Any, dataset_kwargs: dict[str, Any], max_seq_length: int, mult: int
) -> None:
    rows = [json.loads(line) for line in (DATA / "training.jsonl").read_text().splitlines()[:300]]
    source = tmp_path / "training.jsonl"
    with open(source, "w") as out:
        for j, row in enumerate(rows):
            out.write(json.dumps({"system": " you are terse " * (j % 5), **row}) + "\n")
    megatron, batched = _both(
        source, tokenizer, max_seq_length=max_seq_length, pad_seq_to_mult=mult, dataset_kwargs=dataset_kwargs
    )
    _assert_identical(megatron, batched)
    assert batched.tokenization == "batched"


def test_a_field_megatron_bridge_cannot_read_raises_its_own_error(tmp_path: Path, tokenizer: Any) -> None:
    """A non-text answer goes to Megatron-Bridge's code, which raises as it does without the assembly; either way the
    record is refused by its line with Megatron-Bridge's own error (the user's data: exit 2, not a plugin bug)."""
    from mbridge_seqpack.errors import InputError

    source = tmp_path / "training.jsonl"
    source.write_text(
        json.dumps({"input": "a", "output": "b"}) + "\n" + json.dumps({"input": "c", "output": 7}) + "\n"
    )
    errors = []
    for batched in (False, True):
        with pytest.raises(InputError) as caught:
            _both(source, tokenizer)[int(batched)]
        errors.append(str(caught.value))
    assert (
        errors[0]
        == errors[1]
        == (
            f"{source}:2: Megatron-Bridge's prep fails on this record: AttributeError: 'int' object has no attribute "
            "'strip'; fix it"
        )
    )


def test_a_reader_other_than_the_jsonl_lines_says_so_and_assembles_per_example(tmp_path: Path, tokenizer: Any) -> None:
    source = tmp_path / "training.jsonl"
    source.write_text("".join(line + "\n" for line in (DATA / "training.jsonl").read_text().splitlines()[:50]))
    megatron, batched = _both(source, tokenizer, dataset_kwargs={"hf_dataset": True}, max_seq_length=128)
    _assert_identical(megatron, batched)
    assert batched.tokenization == "batched, assembled per example (records read through the dataset's own reader)"
