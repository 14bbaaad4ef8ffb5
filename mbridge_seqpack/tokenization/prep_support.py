"""Whether Megatron-Bridge's SFT prep can prepare any record at all with a tokenizer, asked by running that prep on
one neutral record (every field ``"1"``, or a one-turn conversation).

A record the prep fails on is normally the record's fault, and ``pack`` names its line. But some tokenizer types fail
on every record: Megatron-Bridge 0.6.2's prompt-template prep reads ``tokenizer.space_sensitive``, which
Megatron-Core's ``tiktoken`` and ``null-text`` tokenizers raise ``NotImplementedError`` for, and its chat prep calls
``apply_chat_template`` with transformers' keywords, which Megatron-Core's own chat template does not take. The launch
prepares its data with the same prep (``GPTSFTDatasetBuilder``) and fails the same way, so such a config is refused
as the tokenizer's, not blamed on line 1. The verdict is computed, never listed by type: a later Megatron-Bridge
whose prep takes these tokenizers packs with them unchanged.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

from mbridge_seqpack.frames import traceback_site

__all__ = ["neutral_record", "prep_refusal", "refusal_message", "fileless_tokenizer_problem"]


def neutral_record(dataset_kwargs: dict[str, Any]) -> dict[str, Any]:
    """A record any tokenizer the prep supports prepares: a user turn and an answer for chat data, else ``"1"`` in
    every field the prompt template reads."""
    from mbridge_seqpack.tokenization.dataset_kwargs import template_fields

    if dataset_kwargs.get("chat"):
        return {"messages": [{"role": "user", "content": "1"}, {"role": "assistant", "content": "1"}]}
    fields = {name: "1" for name in template_fields(dataset_kwargs)}
    label = str(dataset_kwargs.get("label_key", "output"))
    return {**fields, label: "1"}


def prep_refusal(
    tokenizer: Any, *, dataset_kwargs: dict[str, Any], max_seq_length: int, seed: int, pad_seq_to_mult: int
) -> Exception | None:
    """What Megatron-Bridge's own ``tokenize_dataset`` raises preparing :func:`neutral_record` with ``tokenizer``
    (the launch's ``build_tokenizer`` result), or None when it prepares it."""
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split
    from megatron.bridge.data.packing.offline import tokenize_dataset

    with tempfile.TemporaryDirectory(prefix="mbridge_seqpack_probe_") as work:
        record = Path(work) / "neutral.jsonl"
        record.write_text(json.dumps(neutral_record(dataset_kwargs)) + "\n")
        kwargs = {**dataset_kwargs, "index_mapping_dir": work}
        try:
            with (
                contextlib.redirect_stderr(io.StringIO()),
                contextlib.redirect_stdout(io.StringIO()),
                warnings.catch_warnings(),
            ):
                warnings.simplefilter("ignore")
                tokenize_dataset(
                    record,
                    tokenizer,
                    max_seq_length,
                    seed,
                    kwargs,
                    pad_seq_to_mult=pad_seq_to_mult,
                    dataset_builder=build_gpt_sft_split,  # what its builder's prepare_packed_data passes
                )
        except Exception as exc:  # noqa: BLE001  (whatever the prep raises: the verdict is that it raised)
            if traceback_site(exc, ("megatron/",)) is None:
                raise  # the call itself failed, before reaching Megatron: a bug here, not the tokenizer's
            return exc
    return None


def _said(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200].rstrip(".")
    return f"{type(exc).__name__}: {text or '(no message)'}"


def refusal_message(tokenizer: Any, dataset_kwargs: dict[str, Any], exc: BaseException) -> str:
    """The refusal of a tokenizer Megatron-Bridge's prep fails with on any record."""
    library = getattr(tokenizer, "library", None) or type(tokenizer).__name__
    prep = "chat prep" if dataset_kwargs.get("chat") else "SFT prep"
    return (
        f"Megatron-Bridge's {prep} cannot prepare any record with this tokenizer (Megatron-Core's {library!r} "
        f"library): even a one-token record raises {_said(exc)}. Its launch prepares the data with that prep and "
        "would fail the same way; set tokenizer.tokenizer_type to one its prep takes (HuggingFaceTokenizer over a "
        "tokenizer folder, SentencePieceTokenizer over a .model file) and tokenizer.tokenizer_model to its files"
    )


def fileless_tokenizer_problem(
    config: Any, *, dataset_kwargs: dict[str, Any], max_seq_length: int, seed: int, pad_seq_to_mult: int
) -> str:
    """Why a recipe whose tokenizer names no files (``tokenizer.tokenizer_model`` is None: a ``NullTokenizer``, say)
    cannot be packed: Megatron-Bridge cannot build it, its prep refuses it, or else the seal has no files to hash."""
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    kind = getattr(config, "tokenizer_type", None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tokenizer = build_tokenizer(config)
    except Exception as exc:  # noqa: BLE001  (Megatron-Core raises many kinds for a tokenizer it cannot build)
        return (
            f"tokenizer.tokenizer_model is None and Megatron-Bridge cannot build tokenizer_type={kind} without it "
            f"({_said(exc)}); set tokenizer.tokenizer_model to the tokenizer's folder or file"
        )
    refused = prep_refusal(
        tokenizer,
        dataset_kwargs=dataset_kwargs,
        max_seq_length=max_seq_length,
        seed=seed,
        pad_seq_to_mult=pad_seq_to_mult,
    )
    if refused is not None:
        return f"tokenizer_type={kind}: " + refusal_message(tokenizer, dataset_kwargs, refused)
    return (
        f"tokenizer_type={kind} reads no files (tokenizer.tokenizer_model is None), and a pack seals the files of "
        "the tokenizer it was made with, so the launch could not tell it from another; pack with a tokenizer that "
        "has files (tokenizer.tokenizer_model)"
    )
