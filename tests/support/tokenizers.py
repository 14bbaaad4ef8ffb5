"""Tiny tokenizers of each family transformers loads, built offline with the ``tokenizers``/``sentencepiece``
libraries (no hub): byte-level BPE (GPT-2's vocab.json + merges.txt), WordPiece (BERT's vocab.txt alone),
SentencePiece (Llama's tokenizer.model alone; T5's spiece.model) and a tiktoken-style rank file; and Megatron-Core's
own ``TikTokenizer`` vocabulary (a JSON list of ranks)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Callable

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "pack the data as megatron bridge would pack it",
    "what is two plus two? it is four.",
    "a user asks and the assistant answers in a few words",
] * 20
WORDS = sorted({word for line in CORPUS for word in line.replace("?", " ?").replace(".", " .").split()})


def _config(directory: Path, **fields: object) -> None:
    (directory / "tokenizer_config.json").write_text(json.dumps(fields, indent=1))


def byte_level_bpe(directory: Path) -> Path:
    """GPT-2's slow layout: vocab.json and merges.txt, no tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.model.save(str(directory))
    _config(directory, tokenizer_class="GPT2Tokenizer", eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    return directory


def wordpiece(directory: Path) -> Path:
    """BERT's layout: vocab.txt alone (the #52 red-team case: only vocab.txt holds the vocabulary)."""
    directory.mkdir(parents=True, exist_ok=True)
    letters = sorted({c for line in CORPUS for c in line if not c.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *letters, *(f"##{c}" for c in letters)]
    (directory / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    _config(directory, tokenizer_class="BertTokenizer", eos_token="[SEP]", do_lower_case=True)
    return directory


def sentencepiece_model(path: Path, vocab_size: int = 120) -> Path:
    """A SentencePiece BPE model file at ``path`` (ids 0-2: <unk>, <s>, </s>)."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        minloglevel=2,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.getvalue())
    return path


def sentencepiece(directory: Path) -> Path:
    """Llama's slow layout: tokenizer.model alone."""
    sentencepiece_model(directory / "tokenizer.model")
    _config(directory, tokenizer_class="LlamaTokenizer", eos_token="</s>", bos_token="<s>", unk_token="<unk>")
    return directory


def sentencepiece_t5(directory: Path) -> Path:
    """T5's slow layout: spiece.model alone (a name no fixed list held)."""
    sentencepiece_model(directory / "spiece.model")
    _config(directory, tokenizer_class="T5Tokenizer", eos_token="</s>", unk_token="<unk>", extra_ids=0)
    return directory


def tiktoken_style(directory: Path) -> Path:
    """A tiktoken rank file (base64 token, rank per line) as ``tiktoken.model``, which transformers converts
    (convert_slow_tokenizer.TikTokenConverter) when there is no tokenizer.json."""
    directory.mkdir(parents=True, exist_ok=True)
    tokens = [bytes([b]) for b in range(256)] + [w.encode() for w in WORDS if len(w) > 1]
    lines = [f"{base64.b64encode(token).decode()} {rank}" for rank, token in enumerate(dict.fromkeys(tokens))]
    (directory / "tiktoken.model").write_text("\n".join(lines) + "\n")
    _config(directory, tokenizer_class="PreTrainedTokenizerFast", eos_token="<|endoftext|>")
    return directory


def megatron_tiktoken_vocab(path: Path) -> Path:
    """Megatron-Core's ``TikTokenizer`` file (``reload_mergeable_ranks``): a JSON list of ``{rank, token_bytes,
    token_str}``, the 256 single bytes first, then the corpus's words."""
    tokens = [bytes([b]) for b in range(256)] + [w.encode() for w in WORDS if len(w) > 1]
    vocab = [
        {"rank": rank, "token_bytes": base64.b64encode(token).decode(), "token_str": token.decode("latin-1")}
        for rank, token in enumerate(dict.fromkeys(tokens))
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(vocab))
    return path


#: family -> (builder, the file holding its vocabulary)
FAMILIES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "byte-level BPE": (byte_level_bpe, "vocab.json"),
    "WordPiece": (wordpiece, "vocab.txt"),
    "SentencePiece": (sentencepiece, "tokenizer.model"),
    "SentencePiece (T5)": (sentencepiece_t5, "spiece.model"),
    "tiktoken": (tiktoken_style, "tiktoken.model"),
}
