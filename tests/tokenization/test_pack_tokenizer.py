"""#43 item 1: a pack is tokenized with the launch's own tokenizer. Every field Megatron-Bridge's tokenizer build
reads (found in its source) and every argument its builder passes to the packing prep is sealed; ``pack --recipe``
takes them all from the recipe (a chat template given as ``chat_template`` or ``chat_template_path`` included), its
pack is the rows Megatron-Bridge's own prep makes of that recipe, and ``check`` refuses a pack made with any other
value of any of those fields."""

from __future__ import annotations

import ast
import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.artifact.store import PREP_ARGUMENTS, Fingerprint
from mbridge_seqpack.tokenization.tokenizer_settings import NOT_COMPARED, build_reads, token_fields

#: read from Megatron-Bridge 0.6.2's training/tokenizers/tokenizer.py build_tokenizer, _resolve_chat_template,
#: _resolve_hf_tokenizer_revision, training/tokenizers/config.py TokenizerConfig.__post_init__ and Megatron-Core
#: 0.19.2's tokenizers/utils/build_tokenizer.py build_tokenizer, _set_padded_vocab_size, vocab_size_with_padding
BUILD_READS = {
    "chat_template",
    "chat_template_path",
    "force_system_message",
    "hf_tokenizer_kwargs",
    "image_tag_type",
    "make_vocab_size_divisible_by",
    "merge_file",
    "metadata_path",
    "null_tokenizer_eod_id",
    "null_tokenizer_pad_id",
    "pad_vocab_size",
    "padded_vocab_size",
    "rank",
    "sft_tokenizer_prompt_format",
    "sp_tokenizer_kwargs",
    "special_tokens",
    "tensor_model_parallel_size",
    "tiktoken_num_special_tokens",
    "tiktoken_pattern",
    "tokenizer_hf_no_include_special_tokens",
    "tokenizer_hf_no_use_fast",
    "tokenizer_model",
    "tokenizer_prompt_format",
    "tokenizer_sentencepiece_ignore_extra_whitespaces",
    "tokenizer_sentencepiece_legacy",
    "tokenizer_type",
    "trust_remote_code",
    "vocab_file",
    "vocab_size",
}
PADDING = {"make_vocab_size_divisible_by", "pad_vocab_size", "padded_vocab_size", "rank", "tensor_model_parallel_size"}

TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<user> {{ m['content'] }}\n{% else %}"
    "{% generation %}<assistant> {{ m['content'] }}{{ eos_token }}{% endgeneration %}\n{% endif %}"
    "{% endfor %}"
)
OTHER_TEMPLATE = TEMPLATE.replace("<user> ", "User: ").replace("<assistant> ", "Assistant: ")


def _megatron_source(module: str) -> ast.Module:
    import importlib.util

    spec = importlib.util.find_spec("megatron")
    assert spec is not None and spec.submodule_search_locations
    base = next(Path(p) for p in spec.submodule_search_locations if (Path(p) / "bridge").is_dir())
    return ast.parse((base / module).read_text())


def test_the_tokenizer_build_reads_are_found_in_its_source() -> None:
    assert set(build_reads()) == BUILD_READS
    assert set(token_fields()) == BUILD_READS - PADDING


def test_every_argument_of_the_builders_prep_is_sealed() -> None:
    """The keywords ``_prepare_packed_split`` passes to ``prepare_gpt_sft_packed_data``, read from its source, are
    exactly those the plugin seals (or says do not change the rows), and each names fingerprint fields."""
    tree = _megatron_source("bridge/data/builders/gpt_sft.py")
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "prepare_gpt_sft_packed_data"
    ]
    assert len(calls) == 1
    assert {k.arg for k in calls[0].keywords} == set(PREP_ARGUMENTS)
    sealed = {f for fields in PREP_ARGUMENTS.values() for f in fields}
    assert sealed <= set(Fingerprint.__dataclass_fields__)
    assert "tokenizer_settings" in PREP_ARGUMENTS["tokenizer"]


# ---------------------------------------------------------------------------------------------------- with packs
@pytest.fixture(scope="module")
def plain_pack(tmp_path_factory: pytest.TempPathFactory, megatron_bridge: Any) -> Path:
    """A pack of 40 embedded records with Megatron-Bridge's default tokenizer settings, at 4096."""
    from tests.support.packs import run_pack, small_jsonl

    where = tmp_path_factory.mktemp("plain")
    (where / "root").mkdir()
    source = small_jsonl(where / "root" / "training.jsonl")
    run_pack({"training": source}, where / "pack")
    return where


def _fingerprint(pack: Path, size: int = 4096) -> Fingerprint:
    entries = json.loads((pack / f"{size}_metadata.jsonl").read_text())
    return Fingerprint.from_dict(entries[0]["fingerprint"])


@pytest.mark.slow
def test_a_pack_seals_every_field_the_build_reads(plain_pack: Path) -> None:
    settings = json.loads(_fingerprint(plain_pack / "pack").tokenizer_settings or "{}")
    assert set(settings) == set(token_fields())
    assert settings["tokenizer_type"] == "HuggingFaceTokenizer"
    assert settings["chat_template"] is None and settings["hf_tokenizer_kwargs"] == {}


def _other(value: Any) -> Any:
    """A value of the same kind that differs."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, dict):
        return {**value, "revision": "other"}
    if isinstance(value, list):
        return [*value, "<other>"]
    return "other"


def _configured(cfg: Any, where: Path) -> Any:
    from tests.support.packs import TOKENIZER

    cfg.dataset.dataset_root = str(where / "root")
    cfg.tokenizer.tokenizer_model = str(TOKENIZER)
    cfg.dataset.offline_packing_specs.packed_train_data_path = str(where / "pack" / "training_4096.idx.parquet")
    return cfg


@pytest.mark.slow
def test_the_pack_made_with_the_configs_tokenizer_settings_is_accepted(plain_pack: Path, packed_cfg: Any) -> None:
    from tests.support.packs import pack_rule

    assert pack_rule(_configured(packed_cfg, plain_pack)) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", [f for f in token_fields() if f not in NOT_COMPARED])
def test_every_tokenizer_field_the_build_reads_is_compared(
    name: str, plain_pack: Path, packed_cfg: Any, tmp_path: Path
) -> None:
    """Derived from the build's source: a field the pack did not seal or ``check`` did not compare fails here."""
    from tests.support.packs import pack_rule

    cfg = _configured(packed_cfg, plain_pack)
    setattr(cfg.tokenizer, name, _other(getattr(cfg.tokenizer, name, None)))
    found = pack_rule(cfg)
    assert [v.rule.split(" (")[0] for v in found] == [
        "the pack was tokenized with other tokenizer settings than tokenizer.*"
    ]
    assert f"tokenizer.{name}" in found[0].fields


@pytest.mark.slow
def test_a_template_file_is_compared_by_the_template_it_holds(
    plain_pack: Path, packed_cfg: Any, tmp_path: Path
) -> None:
    from tests.support.packs import pack_rule

    cfg = _configured(packed_cfg, plain_pack)
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    cfg.tokenizer.chat_template_path = str(tmp_path / "t.jinja")
    (v,) = pack_rule(cfg)
    assert v.fields["tokenizer.chat_template_path"] == str(tmp_path / "t.jinja")
    assert 'chat_template: pack null, config "sha256:' in v.rule


# ------------------------------------------------------------------------- pack --recipe with a chat template
RECIPE = """
def chat_recipe():
    from mbridge_seqpack import apply
    from mbridge_seqpack.compose.mixins import OfflinePacking
    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider

    cfg = sft_base(
        small_gpt_provider(2048), seq_length=2048, global_batch_size=1, dataset_root={root!r}, tokenizer_model={tok!r}
    )
    cfg.dataset.dataset_kwargs = {{"chat": True, "use_hf_tokenizer_chat_template": True}}
    cfg.dataset.do_validation = False
    cfg.tokenizer.{field} = {value!r}
    return apply(cfg, OfflinePacking(pack_size=2048))
"""


def _chat_setup(tmp: Path, field: str) -> tuple[Path, Path]:
    """A recipe whose tokenizer carries ``TEMPLATE`` (as ``field``) over a tokenizer folder holding another
    template of its own, and 60 chat records at its dataset root."""
    from tests.support.packs import TOKENIZER, chat_corpus

    tok = tmp / "tok"
    shutil.copytree(TOKENIZER, tok)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": OTHER_TEMPLATE}))
    (tmp / "root").mkdir()
    chat_corpus(tmp / "root" / "training.jsonl", 60)
    value = TEMPLATE
    if field == "chat_template_path":
        value = str(tmp / "template.jinja")
        (tmp / "template.jinja").write_text(TEMPLATE)
    recipe = tmp / f"chat_recipe_{field}.py"  # one module name per case: a recipe file is imported by its name
    recipe.write_text(RECIPE.format(root=str(tmp / "root"), tok=str(tok), field=field, value=value))
    return recipe, tok


def _megatron_bridges_own_prep(cfg: Any, tmp: Path) -> Path:
    """Megatron-Bridge's builder preparing the recipe's pack itself (its tokenizer built by its own
    ``build_tokenizer(cfg.tokenizer)``, as the launch does), from a copy of the data root."""
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetBuilder
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    dataset = copy.deepcopy(cfg.dataset)
    shutil.copytree(Path(cfg.dataset.dataset_root), tmp / "mb_root", ignore=shutil.ignore_patterns("packed"))
    dataset.dataset_root = str(tmp / "mb_root")
    builder = GPTSFTDatasetBuilder(config=dataset, tokenizer=build_tokenizer(copy.copy(cfg.tokenizer)))
    builder.prepare_packed_data()
    return Path(builder.train_path_packed)


@pytest.mark.slow
@pytest.mark.parametrize("field", ["chat_template", "chat_template_path"])
def test_pack_recipe_is_megatron_bridges_own_prep_of_a_recipe_with_a_chat_template(
    field: str, tmp_path: Path, megatron_bridge: Any, capsys: pytest.CaptureFixture
) -> None:
    from mbridge_seqpack.cli.main import main
    from mbridge_seqpack.recipes.targets import build_launch
    from tests.support.packs import pack_rule, packed_sequences

    recipe, _ = _chat_setup(tmp_path, field)
    target = f"{recipe}:chat_recipe"
    assert main(["pack", "--recipe", target, "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["found_by_megatron_bridge"] is True
    cfg = build_launch(target, []).cfg
    ours = packed_sequences(Path(made["directory"]) / "training_2048.idx.parquet")
    assert sum(ours.values()) == 60
    assert ours == packed_sequences(_megatron_bridges_own_prep(cfg, tmp_path))
    assert pack_rule(cfg) == []  # check finds the pack where the builder looks, and accepts it
    if field == "chat_template":
        cfg.tokenizer.chat_template = OTHER_TEMPLATE
    else:
        Path(cfg.tokenizer.chat_template_path).write_text(OTHER_TEMPLATE)
    (v,) = pack_rule(cfg)
    assert "the pack was tokenized with other tokenizer settings than tokenizer.* (chat_template: pack" in v.rule
    if field == "chat_template_path":
        assert v.fields["tokenizer.chat_template_path"] == cfg.tokenizer.chat_template_path
    else:
        assert str(v.fields["tokenizer.chat_template"]).startswith("sha256:")
