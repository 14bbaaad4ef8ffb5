"""``--dataset-kwargs`` and input files are refused with a message before Megatron-Bridge's prep sees them; the
accepted keys are exactly what the installed prep reads."""

from __future__ import annotations

import inspect
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.cli.main import main
from mbridge_seqpack.tokenization.dataset_kwargs import (
    DATASET_KWARGS,
    MANAGED,
    check_config_dataset_kwargs,
    check_dataset_kwargs,
)
from mbridge_seqpack.tokenization.sequences import InputError, check_jsonl


def test_the_table_is_what_megatron_bridges_prep_reads(megatron_bridge: Any) -> None:
    from megatron.bridge.data.builders import gpt_sft as builder
    from megatron.bridge.data.datasets.gpt_sft import GPTSFTDataset
    from megatron.bridge.data.packing import offline

    popped = set(re.findall(r'options\.pop\("(\w+)"', inspect.getsource(builder.build_gpt_sft_split)))
    taken = set(inspect.signature(GPTSFTDataset.__init__).parameters) - {"self"}
    popped_by_prep = set(re.findall(r'dataset_kwargs\.pop\("(\w+)"', inspect.getsource(offline.tokenize_dataset)))
    assert set(DATASET_KWARGS) | set(MANAGED) == popped | taken | popped_by_prep
    assert not set(DATASET_KWARGS) & set(MANAGED)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"add_eso": True}, "unknown key 'add_eso' (did you mean 'add_eos'?)"),
        ({"add_eos": "yes"}, "'add_eos' must be a boolean, got str 'yes'"),
        ({"pad_seq_length_to_mult": 0}, "'pad_seq_length_to_mult' must be an integer >= 1, got 0"),
        ({"pad_seq_length_to_mult": True}, "'pad_seq_length_to_mult' must be an integer, got bool True"),
        ({"truncation_method": "middle"}, "'truncation_method' must be one of left, right, got 'middle'"),
        ({"special_tokens": {"system": 1}}, "'special_tokens' must be an object, got dict"),
        ({"seed": 3}, "'seed' is set by --seed; remove it from --dataset-kwargs"),
        ({"prompt_completion_config": {}}, "'prompt_completion_config' is set by dataset.preprocessing"),
        # GPTSFTDataset appends sep_id (None unless given) after the prompt: None token ids crash the prep
        (
            {"add_sep": True},
            "--dataset-kwargs: 'add_sep' is true but no 'sep_id' is given; add \"sep_id\": <token id>",
        ),
    ],
)
def test_bad_dataset_kwargs_are_refused_with_the_key(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as info:
        check_dataset_kwargs(kwargs)
    assert message in str(info.value)


def test_good_dataset_kwargs_pass() -> None:
    check_dataset_kwargs({"add_eos": False, "prompt_template": "{q} {a}", "sep_id": 0, "tool_schemas": {}})


@pytest.mark.parametrize("key", sorted(MANAGED))
def test_a_recipes_managed_key_is_refused_where_megatron_bridges_builder_fails_on_it(
    megatron_bridge: Any, tmp_path: Path, key: str
) -> None:
    # build_gpt_sft_split pops index_mapping_dir and prompt_completion_config from dataset_kwargs; every other key
    # the prep manages it also passes itself, so the recipe's value is a second one for the same keyword
    from megatron.bridge.data.builders.gpt_sft import build_gpt_sft_split

    from mbridge_seqpack.recipes.building_blocks import embedded_tokenizer_dir
    from mbridge_seqpack.tokenization.sequences import load_megatron_tokenizer

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"input": "a", "output": "b"}) + "\n")
    value = {"index_mapping_dir": str(tmp_path / "index"), "prompt_completion_config": None}.get(key, 1)
    try:
        build_gpt_sft_split(
            data,
            tokenizer=load_megatron_tokenizer(embedded_tokenizer_dir()),
            seq_length=64,
            memmap_workers=1,
            seed=0,
            packed_sequence_size=-1,
            dataset_kwargs={key: value},
        )
        megatron_bridge_fails = False
    except TypeError as exc:
        assert "multiple values for keyword argument" in str(exc)
        megatron_bridge_fails = True
    assert megatron_bridge_fails == (key not in ("index_mapping_dir", "prompt_completion_config"))
    if megatron_bridge_fails:
        with pytest.raises(InputError) as info:
            check_config_dataset_kwargs({key: value})
        assert str(info.value) == (
            f"dataset.dataset_kwargs: {key!r} is passed by Megatron-Bridge's build_gpt_sft_split itself, so a "
            f"second value is a TypeError there; remove it: ~dataset.dataset_kwargs.{key}"
        )
    else:
        check_config_dataset_kwargs({key: value})


def test_cli_pack_recipe_refuses_a_recipes_unknown_key_without_a_traceback(
    megatron_bridge: Any, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Megatron-Bridge's own prep fails on it with "GPTSFTDataset.__init__() got an unexpected keyword argument"
    code = main(
        ["pack", "--recipe", "small_gpt_smoke_4k", "+dataset.dataset_kwargs.add_sepp=true", "--output", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "mbridge-seqpack: error: dataset.dataset_kwargs: unknown key 'add_sepp' (did you mean 'add_sep'?)" in err
    assert "Traceback" not in err
    with pytest.raises(InputError, match=r"no 'sep_id' is given; add \+\+dataset\.dataset_kwargs\.sep_id=<token id>$"):
        check_config_dataset_kwargs({"add_sep": True})


def test_cli_pack_refuses_bad_kwargs_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"input": "a", "output": "b"}) + "\n")
    code = main(
        [
            "pack",
            str(data),
            "--pack-size",
            "4096",
            "--output",
            str(tmp_path / "o"),
            "--dataset-kwargs",
            '{"lable_key": "x"}',
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "mbridge-seqpack: error: --dataset-kwargs: unknown key 'lable_key' (did you mean 'label_key'?)" in err
    assert "Traceback" not in err


def test_a_pipe_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)  # opening it for reading would block until a writer came
    with pytest.raises(InputError, match=r"in\.jsonl: is a pipe, not a regular file"):
        check_jsonl(fifo, {})


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory, not a regular file"):
        check_jsonl(tmp_path, {})


def test_a_deeply_nested_line_is_refused_with_its_line(tmp_path: Path) -> None:
    data = tmp_path / "deep.jsonl"
    data.write_text(json.dumps({"input": "a", "output": "b"}) + "\n" + "[" * 200_000 + "\n")
    with pytest.raises(InputError, match=r"deep\.jsonl:2: JSON nested too deeply"):
        check_jsonl(data, {})
