"""The held-out matrix of #24: for every input Megatron-Bridge's dataset build takes into account, a pack made with
another value is refused by ``check`` (naming the field, the pack's value and the config's) and by the hook inside
Megatron-Bridge's own ``runtime_config_update()``; the pack made with the config's own values is accepted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.packs import DATA, TOKENIZER, assert_the_hook_refuses, pack_rule, run_pack, small_jsonl

pytestmark = pytest.mark.slow

TEMPLATE = "Q: {input}\nA: {output}"

#: case -> (what the pack is made with, the split the path points at, a fragment of the rule, the fields it names)
CASES: dict[str, tuple[dict[str, Any], str, str, dict[str, Any]]] = {
    "pack size": (
        {"pack_size": 2048},
        "training",
        "the pack was built with pack_size=2048, the config asks for 4096",
        {"artifact pack_size": 2048, "dataset.offline_packing_specs.packed_sequence_size": 4096},
    ),
    "pad_seq_to_mult": (
        {"pad_seq_to_mult": 2},
        "training",
        "the pack was built with pad_seq_to_mult=2, the config asks for 1",
        {"artifact pad_seq_to_mult": 2, "dataset.offline_packing_specs.pad_seq_to_mult": 1},
    ),
    "max sequence length": (
        {"max_seq_length": 2048},
        "training",
        "the pack kept sequences up to 2048 tokens, the config's prep keeps up to 4096",
        {"artifact max_seq_length": 2048, "dataset.offline_packing_specs.max_single_sequence_length": 4096},
    ),
    "add_eos": (
        {"dataset_kwargs": {"add_eos": False}},
        "training",
        "(add_eos: pack false, config true)",
        {"dataset.dataset_kwargs.add_eos": "true"},
    ),
    "add_bos": (
        {"dataset_kwargs": {"add_bos": True}},
        "training",
        "(add_bos: pack true, config false)",
        {"dataset.dataset_kwargs.add_bos": "false"},
    ),
    "prompt_template": (
        {"dataset_kwargs": {"prompt_template": TEMPLATE}},
        "training",
        '(prompt_template: pack "Q: {input}\\nA: {output}", config "{input} {output}")',
        {"dataset.dataset_kwargs.prompt_template": '"{input} {output}"'},
    ),
    "truncation_method": (
        {"dataset_kwargs": {"truncation_method": "left"}},
        "training",
        '(truncation_method: pack "left", config "right")',
        {"dataset.dataset_kwargs.truncation_method": '"right"'},
    ),
    "dataset.preprocessing": (
        {"preprocessing": "full"},
        "training",
        "(prompt_completion_config: pack \"PromptCompletionSFTPreprocessingConfig(prompt_column='input'",
        {},
    ),
    "tokenizer files": (
        {"tokenizer": "edited"},
        "training",
        "the pack was tokenized with another tokenizer",
        {"tokenizer.tokenizer_model": str(TOKENIZER)},
    ),
    "split": (
        {},
        "validation",
        "resolves to 1 file(s) holding split(s) ['validation']; Megatron-Bridge would read all of them as training",
        {"artifact split": ["validation"], "read as": "training"},
    ),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The configured data (``dataset_root/training.jsonl``), other data, and a tokenizer with one file edited."""
    where = tmp_path_factory.mktemp("stale")
    (where / "root").mkdir()
    rows = [json.loads(line) for line in (DATA / "training.jsonl").read_text().splitlines()[100:140]]
    (where / "other.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenizer = where / "tokenizer"
    shutil.copytree(TOKENIZER, tokenizer)
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 12345}))
    return {
        "root": where / "root",
        "data": small_jsonl(where / "root" / "training.jsonl"),
        "other": where / "other.jsonl",
        "tokenizer": tokenizer,
    }


def _pack_for(case: dict[str, Any], split: str, corpus: dict[str, Path], out: Path) -> Path:
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetConfig
    from megatron.bridge.data.sft_processing import PromptCompletionSFTPreprocessingConfig

    from mbridge_seqpack.tokenization.dataset_kwargs import config_dataset_kwargs

    options = dict(case)
    source = corpus["other"] if options.pop("input", None) else corpus["data"]
    if options.pop("tokenizer", None):
        options["tokenizer"] = corpus["tokenizer"]
    if loss_mode := options.pop("preprocessing", None):
        preprocessing = PromptCompletionSFTPreprocessingConfig(
            prompt_column="input", completion_column="output", loss_mode=loss_mode
        )
        options["dataset_kwargs"] = config_dataset_kwargs(
            GPTSFTDatasetConfig(seq_length=4096, dataset_root=str(corpus["root"]), preprocessing=preprocessing)
        )
    inputs = {"training": source} if split == "training" else {"training": source, "validation": source}
    run_pack(inputs, out, **options)
    return out / f"{split}_{options.get('pack_size', 4096)}.idx.parquet"


def _configured(cfg: Any, corpus: dict[str, Path], pack: Path) -> Any:
    cfg.dataset.dataset_root = str(corpus["root"])
    cfg.tokenizer.tokenizer_model = str(TOKENIZER)
    cfg.dataset.offline_packing_specs.packed_train_data_path = str(pack)
    return cfg


def test_the_pack_made_with_the_configs_own_values_is_accepted(
    packed_cfg: Any, corpus: dict[str, Path], tmp_path: Path
) -> None:
    pack = _pack_for({}, "training", corpus, tmp_path / "same")
    assert pack_rule(_configured(packed_cfg, corpus, pack)) == []


def test_an_explicit_pack_of_another_file_is_what_the_launch_trains_on(
    packed_cfg: Any, corpus: dict[str, Path], tmp_path: Path
) -> None:
    """Packed from another file than dataset_root/training.jsonl, at an explicit path: the launch trains on the pack
    and never reads dataset_root (the builder's prep is skipped), so it is not refused for that file."""
    pack = _pack_for({"input": "other"}, "training", corpus, tmp_path / "other")
    assert pack_rule(_configured(packed_cfg, corpus, pack)) == []


def test_pack_recipe_input_then_its_printed_overrides_pass_check(
    corpus: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], megatron_bridge: Any
) -> None:
    """`pack --recipe R INPUT` and then `check R` with exactly the overrides it printed: exit 0 (no loop)."""
    from mbridge_seqpack.cli.main import main

    recipe = ["small_gpt_smoke_4k", "train.global_batch_size=1", "validation.eval_iters=0"]
    assert (
        main(["pack", "--recipe", recipe[0], str(corpus["other"]), *recipe[1:], "--output", str(tmp_path / "p")]) == 0
    )
    out = capsys.readouterr().out
    printed = [line.strip() for line in out.split("use (paste after the recipe's overrides):\n")[1].splitlines()]
    printed = [line for line in printed if line.startswith("dataset.offline_packing_specs.")]
    assert printed == [
        f"dataset.offline_packing_specs.packed_train_data_path={tmp_path / 'p' / 'training_4096.idx.parquet'}"
    ]
    assert main(["check", *recipe, *printed, "--rules-only"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("name", list(CASES))
def test_a_pack_made_with_another_value_is_refused_by_check_and_the_hook(
    name: str, packed_cfg: Any, corpus: dict[str, Path], tmp_path: Path
) -> None:
    case, split, fragment, fields = CASES[name]
    cfg = _configured(packed_cfg, corpus, _pack_for(case, split, corpus, tmp_path / "pack"))
    found = pack_rule(cfg)
    assert any(fragment in v.rule for v in found), [v.rule for v in found]
    named = {k: val for v in found for k, val in v.fields.items()}
    assert {k: named.get(k) for k in fields} == fields
    assert all(v.fix for v in found)  # the re-pack command
    assert_the_hook_refuses(cfg, violations=len(found))
