"""#52 item 5: ``pack --recipe`` packs with every tokenizer type Megatron-Bridge's builder accepts for text SFT as
the builder would: Megatron-Core's ``SentencePieceTokenizer`` over a ``.model`` file, and ``HuggingFaceTokenizer``
over WordPiece, byte-level BPE and SentencePiece folders (tiny tokenizers built offline). The reference of each
is Megatron-Bridge's own builder preparing the same recipe's pack (``GPTSFTDatasetBuilder.prepare_packed_data``
with the tokenizer its ``build_tokenizer`` makes): the packed sequences are the same. Megatron-Core's ``TikTokenizer``
and ``NullTokenizer``, which that prep fails with on every record, are refused as the tokenizer's."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.tokenizers import FAMILIES, sentencepiece_model

pytestmark = pytest.mark.slow

RECIPE = """
def typed_recipe():
    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import OfflinePacking
    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

    cfg = sft_base(
        small_gpt_provider(2048), seq_length=2048, global_batch_size=1, dataset_root={root!r}, tokenizer_model={tok!r}
    )
    cfg.tokenizer.tokenizer_type = {kind!r}
    cfg.dataset.do_validation = False
    return apply(cfg, OfflinePacking(pack_size=2048))
"""


def _megatron_bridges_own_prep(cfg: Any, tmp: Path) -> Path:
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetBuilder
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    dataset = copy.deepcopy(cfg.dataset)
    shutil.copytree(Path(cfg.dataset.dataset_root), tmp / "mb_root", ignore=shutil.ignore_patterns("packed"))
    dataset.dataset_root = str(tmp / "mb_root")
    builder = GPTSFTDatasetBuilder(config=dataset, tokenizer=build_tokenizer(copy.copy(cfg.tokenizer)))
    builder.prepare_packed_data()
    return Path(builder.train_path_packed)


CASES = {
    "SentencePieceTokenizer over a .model file": (
        "SentencePieceTokenizer",
        lambda tmp: sentencepiece_model(tmp / "spm.model"),
    ),
    "HuggingFaceTokenizer, WordPiece": ("HuggingFaceTokenizer", lambda tmp: FAMILIES["WordPiece"][0](tmp / "tok")),
    "HuggingFaceTokenizer, byte-level BPE": (
        "HuggingFaceTokenizer",
        lambda tmp: FAMILIES["byte-level BPE"][0](tmp / "tok"),
    ),
    "HuggingFaceTokenizer, SentencePiece": (
        "HuggingFaceTokenizer",
        lambda tmp: FAMILIES["SentencePiece"][0](tmp / "tok"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_pack_recipe_is_megatron_bridges_own_prep_for_each_tokenizer_type(
    case: str, tmp_path: Path, megatron_bridge: Any, capsys: pytest.CaptureFixture
) -> None:
    from mbridge_seqpack.cli.main import main
    from mbridge_seqpack.recipes.targets import build_launch
    from tests.support.packs import pack_rule, packed_sequences, small_jsonl

    kind, build = CASES[case]
    tokenizer = build(tmp_path)
    (tmp_path / "root").mkdir()
    small_jsonl(tmp_path / "root" / "training.jsonl", n=30)
    recipe = tmp_path / "typed_recipe.py"
    recipe.write_text(RECIPE.format(root=str(tmp_path / "root"), tok=str(tokenizer), kind=kind))
    target = f"{recipe}:typed_recipe"
    out = tmp_path / "pack"
    assert main(["pack", "--recipe", target, "--output", str(out), "--json"]) == 0, capsys.readouterr().err
    made = json.loads(capsys.readouterr().out)
    cfg = build_launch(target, []).cfg
    ours = packed_sequences(Path(made["directory"]) / "training_2048.idx.parquet")
    assert sum(ours.values()) == 30
    assert ours == packed_sequences(_megatron_bridges_own_prep(cfg, tmp_path))
    cfg.dataset.offline_packing_specs.packed_train_data_path = str(out / "training_2048.idx.parquet")
    assert pack_rule(cfg) == []
    edited = tokenizer if tokenizer.is_file() else tokenizer / FAMILIES_VOCAB[case]
    edited.write_bytes(edited.read_bytes() + b"\n")  # a tokenizer file edited after packing: refused
    (v,) = pack_rule(cfg)
    assert "the pack was tokenized with another tokenizer" in v.rule


FAMILIES_VOCAB = {
    "HuggingFaceTokenizer, WordPiece": "vocab.txt",
    "HuggingFaceTokenizer, byte-level BPE": "vocab.json",
    "HuggingFaceTokenizer, SentencePiece": "tokenizer.model",
}


def test_an_override_longer_than_a_file_name_is_not_tried_as_a_path() -> None:
    """``pack --recipe R tokenizer.chat_template='<300 characters>'``: not "File name too long"."""
    import argparse

    from mbridge_seqpack.cli.data import _split_positionals

    template = "tokenizer.chat_template=" + "{% for m in messages %}{{ m['content'] }}{% endfor %}" * 8
    assert len(template) > 255
    args = argparse.Namespace(input=template, overrides=["dataset.seed=3"], recipe="r.py:f")
    _split_positionals(args)
    assert args.input is None and args.overrides == [template, "dataset.seed=3"]


TOOL_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<user> {{ m['content'] }}\n"
    "{% elif m['role'] == 'tool' %}<tool> {{ m['content'] }}\n{% else %}{% generation %}<assistant> "
    "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}<call> {{ c['function']['name'] }}({{ "
    "c['function']['arguments'] }}){% endfor %}{% else %}{{ m['content'] }}{% endif %}{{ eos_token }}"
    "{% endgeneration %}\n{% endif %}{% endfor %}"
)
CHAT_RECIPE = RECIPE.replace(
    "    cfg.dataset.do_validation = False\n",
    "    cfg.dataset.do_validation = False\n"
    '    cfg.dataset.dataset_kwargs = {{"chat": True, "use_hf_tokenizer_chat_template": True}}\n',
)


def test_openai_tool_call_turns_with_null_content_pack_as_megatron_bridge_prepares_them(
    tmp_path: Path, megatron_bridge: Any, capsys: pytest.CaptureFixture
) -> None:
    """An assistant turn that calls a tool carries ``"content": null`` (OpenAI's format): Megatron-Bridge's chat prep
    hands it to the template unchanged, the template renders its ``tool_calls``; ``pack`` packs the same rows."""
    from mbridge_seqpack.cli.main import main
    from mbridge_seqpack.recipes.targets import build_launch
    from tests.support.packs import TOKENIZER, packed_sequences

    (tmp_path / "root").mkdir()
    with open(tmp_path / "root" / "training.jsonl", "w") as out:
        for i in range(20):
            call = {"type": "function", "function": {"name": "add", "arguments": json.dumps({"a": i, "b": 2})}}
            turns = [
                {"role": "user", "content": f"what is {i} plus 2?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": str(i + 2)},
                {"role": "assistant", "content": f"it is {i + 2}"},
            ]
            out.write(json.dumps({"messages": turns}) + "\n")
    recipe = tmp_path / "tool_recipe.py"
    tokenizer = tmp_path / "tok"  # the template in the tokenizer's own config, as a chat model ships it
    shutil.copytree(TOKENIZER, tokenizer)
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TOOL_TEMPLATE}))
    recipe.write_text(CHAT_RECIPE.format(root=str(tmp_path / "root"), tok=str(tokenizer), kind="HuggingFaceTokenizer"))
    target = f"{recipe}:typed_recipe"
    out_dir = tmp_path / "pack"
    assert main(["pack", "--recipe", target, "--output", str(out_dir), "--json"]) == 0, capsys.readouterr().err
    cfg = build_launch(target, []).cfg
    ours = packed_sequences(out_dir / "training_2048.idx.parquet")
    assert sum(ours.values()) == 20
    assert ours == packed_sequences(_megatron_bridges_own_prep(cfg, tmp_path))


#: tokenizer types Megatron-Bridge 0.6.2's SFT prep fails with on every record: (type, chat data)
REFUSED = {
    "TikTokenizer, prompt template": ("TikTokenizer", False),
    "TikTokenizer, chat template": ("TikTokenizer", True),
    "NullTokenizer, no files": ("NullTokenizer", False),
}


def _refused_recipe(tmp: Path, kind: str, chat: bool) -> str:
    """A recipe over ``kind`` (Megatron-Core's TikTokenizer over its JSON ranks, sized as it requires; or a
    NullTokenizer with no files) and 30 records of prompt/answer or chat data."""
    from tests.support.packs import CHAT_TEMPLATE, small_jsonl
    from tests.support.tokenizers import megatron_tiktoken_vocab

    (tmp / "root").mkdir()
    if chat:
        turns = [{"role": "user", "content": "what is one plus two"}, {"role": "assistant", "content": "three"}]
        (tmp / "root" / "training.jsonl").write_text(
            "".join(json.dumps({"messages": turns}) + "\n" for _ in range(30))
        )
    else:
        small_jsonl(tmp / "root" / "training.jsonl", n=30)
    extra = []
    if kind == "TikTokenizer":
        tokenizer = megatron_tiktoken_vocab(tmp / "ranks.json")
        extra.append(f"cfg.tokenizer.vocab_size = {1000 + len(json.loads(tokenizer.read_text()))}")  # its assert
    else:
        tokenizer = tmp / "unused"
        extra += ["cfg.tokenizer.tokenizer_model = None", "cfg.tokenizer.vocab_size = 128"]
    if chat:
        extra.append("cfg.dataset.dataset_kwargs = {'chat': True, 'use_hf_tokenizer_chat_template': True}")
        extra.append(f"cfg.tokenizer.chat_template = {CHAT_TEMPLATE!r}")
    recipe = tmp / "typed_recipe.py"
    anchor = "    cfg.dataset.do_validation = False\n"
    text = RECIPE.format(root=str(tmp / "root"), tok=str(tokenizer), kind=kind)
    recipe.write_text(text.replace(anchor, anchor + "".join(f"    {line}\n" for line in extra)))
    return f"{recipe}:typed_recipe"


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_tokenizer_megatron_bridges_prep_fails_with_on_every_record_is_refused_as_the_tokenizers(
    case: str, tmp_path: Path, megatron_bridge: Any, capsys: pytest.CaptureFixture
) -> None:
    """Megatron-Bridge 0.6.2's own builder prep raises for these types on any record (the reference: its
    ``prepare_packed_data``); ``pack`` refuses them with exit 2 as the tokenizer's (never "line 1: fix it", never a
    traceback), naming what the prep raised."""
    from mbridge_seqpack.cli.main import main
    from mbridge_seqpack.recipes.targets import build_launch

    kind, chat = REFUSED[case]
    target = _refused_recipe(tmp_path, kind, chat)
    with pytest.raises(Exception) as raised:
        _megatron_bridges_own_prep(build_launch(target, []).cfg, tmp_path)
    capsys.readouterr()
    assert main(["pack", "--recipe", target, "--output", str(tmp_path / "pack")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    said = " ".join(str(raised.value).split()).rstrip(".")
    library = "tiktoken" if kind == "TikTokenizer" else "null-text"
    prep = "chat prep" if chat else "SFT prep"
    assert (
        f"Megatron-Bridge's {prep} cannot prepare any record with this tokenizer (Megatron-Core's '{library}' "
        f"library): even a one-token record raises {type(raised.value).__name__}: {said}. Its launch prepares"
    ) in err, err
    assert ("recipe " + target + ": tokenizer_type=NullTokenizer: ") in err if kind == "NullTokenizer" else True
    assert "Traceback" not in err and "training.jsonl:1" not in err
