"""Issue #53: a user's chat JSONL through a packaged recipe and through a Megatron-Bridge SFT recipe, offline, as
docs/own-data.md shows it (its commands run as written): the pack is written where Megatron-Bridge's builder looks,
and the launch check (``check``, then the hook inside Megatron-Bridge's own ``runtime_config_update``) accepts it
there. Every refusal on that way is exit 2 with one line naming the field."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.cli.main import main
from tests.support.stderr_text import unwrap

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "own-data.md").read_text()
MB_RECIPE = "llama32_1b_sft_1gpu_h100_bf16_config"
CHAT = "{_target_:megatron.bridge.data.builders.ChatSFTPreprocessingConfig}"
ERR = "mbridge-seqpack: error: "


def _sh_lines() -> list[str]:
    """The page's shell commands, continuation lines joined."""
    blocks = re.findall(r"```sh\n(.*?)```", PAGE, flags=re.S)
    return [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def _argv(line: str, root: Path) -> list[str]:
    words = shlex.split(line.replace("/tmp/chat", str(root)))
    return words[words.index("mbridge-seqpack") + 1 :]


def _notes(err: str) -> list[str]:
    """The ``note:`` lines of stderr, each joined with the lines it wraps onto."""
    joined: list[str] = []
    for line in err.splitlines():
        if line.startswith("  ") and joined:
            joined[-1] += " " + line.strip()
        else:
            joined.append(line)
    return [line for line in joined if line.startswith("note: ")]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory, megatron_bridge: Any) -> Path:
    """The page's first command: scripts/make_chat_example.py, into a temporary folder."""
    line = _sh_lines()[0]
    assert line == "python scripts/make_chat_example.py /tmp/chat"
    spec = importlib.util.spec_from_file_location("make_chat_example", ROOT / "scripts" / "make_chat_example.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    root = tmp_path_factory.mktemp("chat")
    assert script.main([str(root)]) == 0
    return root


def _hook_accepts(recipe: str, overrides: list[str]) -> None:
    """The launch's own check: the rules installed in Megatron-Bridge's runtime_config_update, at the recipe's
    world size."""
    import copy
    import os

    from megatron.bridge.training.config import runtime_config_update

    import mbridge_seqpack
    from mbridge_seqpack.recipes.targets import build_launch, resolve_world

    launch = build_launch(recipe, overrides)
    os.environ["WORLD_SIZE"] = str(resolve_world(None, launch))  # the conftest fixture restores the environment
    with mbridge_seqpack.install(mode="error"):
        runtime_config_update(copy.deepcopy(launch.cfg))


def test_a_chat_jsonl_packs_through_a_packaged_recipe_and_check_and_the_hook_accept_it(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pack, check = (line for line in _sh_lines() if "small_gpt_smoke_4k" in line)
    assert main(_argv(pack, example)) == 0
    out = capsys.readouterr().out
    (folder,) = [path for path in (example / "packed").iterdir() if path.is_dir()]
    assert out.split()[:3] == ["packed", "into", str(folder)]
    assert "Megatron-Bridge's dataset builder reads it from there (its default_pack_path)" in out
    assert "warning:" not in out  # the splits hold a batch each: nothing check will refuse
    assert main(_argv(check, example)) == 0
    out = capsys.readouterr().out
    assert out.startswith("result: OK (1 assumed)\n") and "no sealed pack" not in out
    assert "megatron-bridge validate(): ok" in out
    _hook_accepts("small_gpt_smoke_4k", _argv(check, example)[2:])


def test_a_chat_jsonl_replaces_a_megatron_bridge_recipes_hub_dataset(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Megatron-Bridge's SFT recipe reads SQuAD from the hub; the user's dataset_root replaces it, said in one line
    (the page's note), and the launch with that line's overrides finds the pack."""
    from tests.zoo.harness import offline

    (line,) = (line for line in _sh_lines() if MB_RECIPE in line)
    argv = _argv(line, example)
    with offline():
        assert main(argv) == 0
        err = capsys.readouterr().err
        (shown,) = re.findall(r"```\n(note: .*?)```", PAGE, flags=re.S)
        note = " ".join(part.strip() for part in shown.replace("/tmp/chat", str(example)).splitlines())
        assert note in _notes(err)
        world = "rows laid out for world size 1 (DP 1) from the GPU count in the recipe name; pass --world-size N"
        assert f"note: {world} for another" in _notes(err)  # the layout's world size, and where it came from
        launch = ["dataset.hf_dataset=null", "dataset.hf_validation_proportion=null", *argv[3:]]
        assert main(["check", MB_RECIPE, *launch]) == 0
        out = capsys.readouterr().out
        assert out.startswith("result: OK (1 assumed)\n") and "no sealed pack" not in out
        assert main(["pack", "--recipe", MB_RECIPE, f"dataset.dataset_root={example}", "dataset.hf_rewrite=true"]) == 2
    assert unwrap(capsys.readouterr().err).splitlines()[-1] == (
        f"{ERR}two data sources: dataset.dataset_root={example} and dataset.hf_rewrite=true; Megatron-Bridge's "
        "GPTSFTDatasetConfig takes exactly one (dataset_root or hf_dataset): drop one of them"
    )


def _last_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = unwrap(capsys.readouterr().err)
    assert "Traceback" not in err
    return err.splitlines()[-1]


def test_chat_records_read_as_prompt_answer_records_are_told_the_overrides(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["pack", "--recipe", "small_gpt_smoke_4k", f"dataset.dataset_root={example}"]
    assert main([*argv, f"tokenizer.tokenizer_model={example / 'tokenizer'}", "--output", str(example / "o")]) == 2
    assert _last_error(capsys) == (
        f"{ERR}{example / 'training.jsonl'}:1: a chat record ('messages'), but prompt/answer records are read; to "
        "pack chat records through the tokenizer's chat template add --chat, or with --recipe the overrides "
        f"dataset.preprocessing=null 'dataset.preprocessing={CHAT}' (and launch with them)"
    )


def test_a_chat_template_without_generation_marks_is_refused_in_one_line(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import shutil

    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(example / "tokenizer", tokenizer)
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config))
    argv = ["pack", str(example / "validation.jsonl"), "--chat", "--tokenizer", str(tokenizer), "--pack-size", "4096"]
    assert main([*argv, "--output", str(tmp_path / "o")]) == 2
    assert _last_error(capsys) == (
        f"{ERR}{example / 'validation.jsonl'}: Megatron-Bridge cannot tokenize these chat records with the "
        "tokenizer's chat template (The tokenizer's chat_template does not contain a {% generation %} block and "
        "Bridge could not infer assistant boundary markers for an assistant-only loss mask); wrap each assistant "
        "turn of the template in {% generation %}...{% endgeneration %} (the recipe's tokenizer.chat_template, or "
        "chat_template in the tokenizer's tokenizer_config.json), or train on every token "
        "(ChatSFTPreprocessingConfig loss_mode full)"
    )
    # the way out the line gives: every token trained, the same template
    full = "{_target_:megatron.bridge.data.builders.ChatSFTPreprocessingConfig,loss_mode:full}"
    recipe = ["pack", "--recipe", "small_gpt_smoke_4k", f"dataset.dataset_root={example}"]
    overrides = [
        f"tokenizer.tokenizer_model={tokenizer}",
        "dataset.preprocessing=null",
        f"dataset.preprocessing={full}",
    ]
    assert main([*recipe, *overrides, "--output", str(tmp_path / "full")]) == 0


def test_a_dataset_config_megatron_bridge_refuses_is_exit_2_with_its_field(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = "{_target_:megatron.bridge.data.sources.hf.HFDatasetSourceConfig,dataset_name:squad}"
    assert main(["pack", "--recipe", "small_gpt_smoke_4k", f"dataset.hf_dataset={source}"]) == 2
    assert _last_error(capsys) == (
        f"{ERR}recipe small_gpt_smoke_4k: Megatron-Bridge's dataset config refuses it (dataset: Exactly one "
        "text-only SFT source must be set: dataset_root or hf_dataset.); fix that dataset.* field with an override "
        "after the recipe name, and launch with the same"
    )


def test_a_preprocessing_mapping_over_a_set_one_is_told_to_set_it_to_null_first(
    megatron_bridge: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Megatron-Bridge's parser refuses a mapping over the recipe's PromptCompletionSFTPreprocessingConfig (it would
    merge into it); the line says what does (its own message once suggested the field it names)."""
    from tests.zoo.harness import offline

    with offline():
        assert main(["check", MB_RECIPE, f"dataset.preprocessing={CHAT}", "--rules-only"]) == 2
    assert _last_error(capsys) == (
        f"{ERR}Megatron-Bridge rejected the overrides: Failed to parse Hydra overrides: Could not override "
        "'dataset.preprocessing'. (dataset.preprocessing holds a PromptCompletionSFTPreprocessingConfig: a mapping "
        "is merged into it, so set dataset.preprocessing=null first, then dataset.preprocessing={_target_:...})"
    )
