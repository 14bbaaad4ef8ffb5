"""Issue #39: the user's input, environment or code is never called a plugin bug. A table of bad inputs goes through
the command line (one subprocess, ``tests/cli/bad_inputs_driver.py``, running ``main`` row by row): each gives exit 2
(argparse's usage errors too), the message naming the cause and the fix, and no traceback. The rows before the
Megatron-Bridge ones fail before its 40-90 s import (asserted), so the table costs one import.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.stderr_text import unwrap

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_TOKENIZER = ROOT / "mbridge_seqpack" / "data" / "tokenizer"


@dataclass(frozen=True)
class Row:
    id: str
    argv: list[str]
    message: str  # a line of stderr, whole (exact), or with "..." the start of one
    env: dict | None = None
    megatron: bool = False  # the row needs Megatron-Bridge imported (else it must fail before the import)


RECIPE_FILES = {
    "syntax.py": "def config():\n    return (\n",
    "indent.py": "def config():\nreturn 1\n",
    "missing_import.py": "import nosuchmodule_xyz\n\ndef config():\n    return None\n",
    "raises_at_import.py": "x = 1\nraise RuntimeError('boom at import')\n",
    "name_error.py": "def config():\n    return 1\n\nundefined_name_xyz\n",
    "raises.py": "def config():\n    raise ValueError('the user code says no')\n",
    "returns_dict.py": "def config():\n    return {'model': {'seq_length': 4096}}\n",
    "returns_none.py": "def config():\n    pass\n",
    "returns_str.py": "def recipe():\n    return 'llama3_8b_sft_config'\n",
    "needs_arg.py": "def config(seq_length):\n    return seq_length\n",
    "inner_import.py": "def config():\n    import nosuchmodule_abc\n    return nosuchmodule_abc.cfg()\n",
    "no_function.py": "X = 1\n",
    "not_callable.py": "config = 3\n",
    "key_error.py": "def config():\n    return {}['model']\n",
    "hub.py": (
        "def config():\n"
        "    from transformers import AutoConfig\n\n"
        "    return AutoConfig.from_pretrained('meta-llama/Meta-Llama-3-8B')\n"
    ),
    "late_raise.py": (
        "def config():\n"
        "    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider\n\n"
        "    cfg = sft_base(small_gpt_provider(2048), seq_length=2048, global_batch_size=4)\n"
        "    raise KeyError('dataset_root')\n"
    ),
    "ok.py": (
        "def config():\n"
        "    from mbridge_seqpack.recipes.building_blocks import sft_base, small_gpt_provider\n\n"
        "    return sft_base(small_gpt_provider(2048), seq_length=2048, global_batch_size=4)\n"
    ),
}
YAML_FILES = {
    "unclosed.yaml": "model:\n  seq_length: [4096\ntrain:\n  global_batch_size: 8\n",
    "tab.yaml": "model:\n\tseq_length: 4096\n",
    "list.yaml": "- model\n- train\n",
    "typo.yaml": "train:\n  global_batch_size: 8\nmodel:\n  context_paralel_size: 2\n",
    "section.yaml": "modle:\n  seq_length: 4096\n",
    "deep.yaml": "dataset:\n  offline_packing_specs:\n    pad_seq_to_mul: 4\n",
    "free.yaml": "dataset:\n  dataset_kwargs:\n    any_key: 1\n",
}
ERR = "mbridge-seqpack: error: "
HUB = (
    "mbridge-seqpack: error: Megatron-Bridge recipe llama3_8b_sft_2gpu_h100_bf16_config reads the model config of "
    "'meta-llama/Meta-Llama-3-8B' from the Hugging Face hub: "
)
HUB_FIX = (
    "  fix: cache it once where the hub is reachable (then HF_HUB_OFFLINE=1 uses the cache), or check a packaged "
    "recipe or a recipe file that builds its model from a local config directory"
)


def _rows(tmp: Path) -> list[Row]:
    f = {name: str(tmp / name) for name in [*RECIPE_FILES, *YAML_FILES]}
    chat = tmp / "chat.jsonl"
    records = tmp / "records.jsonl"
    bad_json = tmp / "bad.jsonl"
    offline = {"HF_HUB_OFFLINE": "1"}
    # the hub's address made one that refuses at once, so the probe's answer is the same with or without a network
    online = {"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None, "HF_ENDPOINT": "http://127.0.0.1:9"}
    pack = ["pack", "--pack-size", "4096", "--output", str(tmp / "out")]
    rows = [
        # usage (argparse)
        Row("world-size-0", ["check", "--world-size", "0"], "...argument --world-size: expected a positive integer"),
        Row("world-size-text", ["check", "--world-size", "x"], "...argument --world-size: expected a positive"),
        Row("gpu-arch", ["check", "--gpu-arch", "tpu9"], "...argument --gpu-arch: "),
        Row(
            "unknown-option", ["check", "--frobnicate"], "mbridge-seqpack: error: unrecognized arguments: --frobnicate"
        ),
        Row("recipes-option", ["recipes", "--bogus"], "mbridge-seqpack: error: unrecognized arguments: --bogus"),
        Row("plan-lengths", ["plan", "--lengths", "abc"], "...argument --lengths: expected a positive integer"),
        Row("pack-size-0", ["pack", str(records), "--pack-size", "0"], "...argument --pack-size: expected a positive"),
        # overrides
        Row("override-text", ["check", "small_gpt_smoke_4k", "justtext"], ERR + "override 'justtext' is not valid..."),
        Row("override-bracket", ["check", "small_gpt_smoke_4k", "model.seq_length=["], ERR + "override 'model..."),
        # recipe names and files
        Row(
            "name-typo",
            ["check", "llama3_8b_sft_cofnig"],
            ERR + "recipe 'llama3_8b_sft_cofnig' not found in megatron.bridge.recipes (nor its <family>.h100 modules) "
            "or megatron.bridge.perf_recipes (did you mean 'llama3_8b_sft_config'?); packaged recipes: ...",
        ),
        Row("name-unknown", ["check", "zzz_no_recipe_config"], ERR + "recipe 'zzz_no_recipe_config' not found in..."),
        Row("name-chars", ["check", "bad-name!"], ERR + "unknown recipe 'bad-name!'; packaged recipes: ..."),
        Row("file-missing", ["check", str(tmp / "nope.py")], ERR + f"recipe file {tmp / 'nope.py'} does not exist"),
        Row("file-syntax", ["check", f["syntax.py"]], ERR + f"recipe file {f['syntax.py']}:2: SyntaxError: '(' ..."),
        Row(
            "file-indent",
            ["check", f["indent.py"]],
            ERR + f"recipe file {f['indent.py']}:2: IndentationError: expected an indented block after function...",
        ),
        Row(
            "file-import",
            ["check", f["missing_import.py"]],
            ERR + f"recipe file {f['missing_import.py']}:1: its import failed: ModuleNotFoundError: No module named "
            "'nosuchmodule_xyz'; install 'nosuchmodule_xyz' or fix the import",
        ),
        Row(
            "file-raises-at-import",
            ["check", f["raises_at_import.py"]],
            ERR + f"recipe file {f['raises_at_import.py']}:2: importing it raised RuntimeError: boom at import",
        ),
        Row(
            "file-name-error",
            ["check", f["name_error.py"]],
            ERR + f"recipe file {f['name_error.py']}:4: importing it raised NameError: name 'undefined_name_xyz' is "
            "not defined",
        ),
        Row(
            "file-raises",
            ["check", f"{f['raises.py']}:config"],
            ERR + f"recipe {f['raises.py']}:config raised ValueError: the user code says no at {f['raises.py']}:2",
        ),
        Row(
            "file-dict",
            ["check", f["returns_dict.py"]],
            ERR + f"recipe {f['returns_dict.py']} returned dict {{'model': {{'seq_length': 4096}}}}, not a "
            "ConfigContainer; return the ConfigContainer itself (a dict or YAML goes in --config-file or key=value "
            "overrides)",
        ),
        Row("file-none", ["check", f["returns_none.py"]], ERR + f"recipe {f['returns_none.py']} returned NoneType..."),
        Row(
            "file-str",
            ["check", f["returns_str.py"]],
            ERR + f"recipe {f['returns_str.py']} returned str 'llama3_8b_sft_config', not a ConfigContainer; ...",
        ),
        Row(
            "file-needs-arg",
            ["check", f["needs_arg.py"]],
            ERR + f"recipe {f['needs_arg.py']} raised TypeError: config() missing 1 required positional argument: "
            f"'seq_length' at {f['needs_arg.py']}:1",
        ),
        Row(
            "file-inner-import",
            ["check", f["inner_import.py"]],
            ERR + f"recipe {f['inner_import.py']} raised ModuleNotFoundError: No module named 'nosuchmodule_abc' at "
            f"{f['inner_import.py']}:2",
        ),
        Row("file-no-function", ["check", f"{f['no_function.py']}:build"], ERR + f"{f['no_function.py']} has no..."),
        Row("file-no-default", ["check", f["no_function.py"]], ERR + f"{f['no_function.py']} defines 0 marked ..."),
        Row("file-not-callable", ["check", f"{f['not_callable.py']}:config"], ERR + f"{f['not_callable.py']} has..."),
        Row(
            "file-key-error",
            ["check", f["key_error.py"]],
            ERR + f"recipe {f['key_error.py']} raised KeyError: 'model' at {f['key_error.py']}:2",
        ),
        Row("file-is-dir", ["check", str(tmp / "adir.py")], ERR + f"recipe file {tmp / 'adir.py'} does not exist"),
        # --config-file, before the import
        Row(
            "yaml-missing",
            ["check", "--config-file", str(tmp / "none.yaml")],
            ERR + f"--config-file {tmp / 'none.yaml'}: no such file",
        ),
        Row(
            "yaml-dir", ["check", "--config-file", str(tmp)], ERR + f"--config-file {tmp}: no such file (a directory)"
        ),
        Row(
            "yaml-unclosed",
            ["check", "--config-file", f["unclosed.yaml"]],
            ERR + f"--config-file {f['unclosed.yaml']}:3:6: YAML error: while parsing a flow sequence expected ',' "
            "or ']', but got ':'",
        ),
        Row(
            "yaml-tab",
            ["check", "--config-file", f["tab.yaml"]],
            ERR + f"--config-file {f['tab.yaml']}:2:1: YAML error: while scanning for the next token found character "
            "'\\t' that cannot start any token",
        ),
        Row(
            "yaml-list",
            ["check", "--config-file", f["list.yaml"]],
            ERR + f"--config-file {f['list.yaml']}:1: the file must be a mapping of config sections (model:, train:, "
            "dataset: ...), not a YAML list",
        ),
        Row(
            "yaml-and-name",
            ["check", "llama3_8b_sft_cofnig", "--config-file", str(tmp / "none.yaml")],
            ERR + f"--config-file {tmp / 'none.yaml'}: no such file",
        ),
        # pack
        Row("pack-no-size", ["pack", str(records)], ERR + "pack needs --pack-size N (or --recipe NAME to take it..."),
        Row("pack-missing", [*pack, str(tmp / "none.jsonl")], ERR + "..."),
        Row("pack-bad-json", [*pack, str(bad_json)], ERR + f"{bad_json}:2: ..."),
        Row("pack-chat-records", [*pack, str(records), "--chat"], ERR + f"{records}:1: a chat record needs a ..."),
        Row(
            "pack-chat-template",
            [*pack, str(chat), "--chat"],
            ERR + f"tokenizer {EMBEDDED_TOKENIZER}: no chat template (no chat_template in tokenizer_config.json, no "
            "chat_template.jinja), which --chat renders each conversation with; use a chat model's tokenizer "
            "(--tokenizer DIR), add its template, or pack prompt/answer records (--prompt-key/--answer-key)",
        ),
        Row("pack-tokenizer", [*pack, str(records), "--tokenizer", str(tmp / "tok")], ERR + f"tokenizer {tmp}..."),
        # issue #53: what the file is, not the symptom ("not UTF-8", "not valid JSON")
        Row(
            "pack-gzip",
            [*pack, str(tmp / "records.jsonl.gz")],
            ERR + f"{tmp / 'records.jsonl.gz'}: is a gzip-compressed file, not JSONL text; decompress it first "
            f"(gunzip -c {tmp / 'records.jsonl.gz'} > {tmp / 'records.jsonl'}) and pass {tmp / 'records.jsonl'}",
        ),
        Row(
            "pack-json-array",
            [*pack, str(tmp / "records.json")],
            ERR + f"{tmp / 'records.json'}: is a JSON array ('[' first), not JSONL; pack needs one JSON object per "
            f"line: convert it, e.g. jq -c '.[]' {tmp / 'records.json'} > records.jsonl",
        ),
        Row(
            "pack-json-array-one-line",
            [*pack, str(tmp / "array.jsonl")],
            ERR + f"{tmp / 'array.jsonl'}: is a JSON array ('[' first), not JSONL; pack needs one JSON object per "
            f"line: convert it, e.g. jq -c '.[]' {tmp / 'array.jsonl'} > array_lines.jsonl",
        ),
        Row(
            "pack-chat-as-records",
            [*pack, str(chat)],
            ERR + f"{chat}:1: a chat record ('messages'), but prompt/answer records are read; to pack chat records "
            "through the tokenizer's chat template add --chat, or with --recipe the overrides "
            "dataset.preprocessing=null "
            "'dataset.preprocessing={_target_:megatron.bridge.data.builders.ChatSFTPreprocessingConfig}' (and "
            "launch with them)",
        ),
        # a config section misspelt: named before the Megatron import, for check and pack alike
        Row(
            "override-section",
            ["check", "small_gpt_smoke_4k", "modle.seq_length=4096"],
            ERR + "override 'modle.seq_length=4096': 'modle' is not a section of Megatron-Bridge's ConfigContainer "
            "(did you mean 'model.seq_length'?)",
        ),
        Row(
            "pack-override-section",
            ["pack", "--recipe", "small_gpt_smoke_4k", "++tarin.global_batch_size=4"],
            ERR + "override '++tarin.global_batch_size=4': 'tarin' is not a section of Megatron-Bridge's "
            "ConfigContainer (did you mean 'train.global_batch_size'?)",
        ),
        Row("inspect-missing", ["inspect", str(tmp / "nopack")], ERR + "..."),
        Row("verify-missing", ["verify", str(tmp / "nopack")], ERR + "..."),
        # the hub, reached by the user's code (transformers only, no Megatron-Bridge)
        Row(
            "file-hub",
            ["check", f["hub.py"]],
            ERR + f"recipe {f['hub.py']} reads a model config from the Hugging Face hub: HF_HUB_OFFLINE=1 is set, "
            "and it is not in the local cache",
            env=offline,
        ),
        # with Megatron-Bridge imported (one import for all)
        Row("hub-probed", ["check", "llama3_8b_sft_2gpu_h100_bf16_config"], HUB + "...", env=online, megatron=True),
        Row(
            "hub-offline",
            ["check", "llama3_8b_sft_2gpu_h100_bf16_config"],
            HUB + "HF_HUB_OFFLINE=1 is set, and it is not in the local cache",
            env=offline,
            megatron=True,
        ),
        Row(
            "file-late-raise",
            ["check", f["late_raise.py"]],
            ERR + f"recipe {f['late_raise.py']} raised KeyError: 'dataset_root' at {f['late_raise.py']}:5",
            megatron=True,
        ),
        Row(
            "yaml-typo",
            ["check", f["ok.py"], "--config-file", f["typo.yaml"]],
            ERR + f"--config-file {f['typo.yaml']}:4: 'model.context_paralel_size' is not a config field (did you "
            "mean 'model.context_parallel_size'?)",
            megatron=True,
        ),
        Row(
            "yaml-section",
            ["check", "small_gpt_smoke_4k", "--config-file", f["section.yaml"]],
            ERR + f"--config-file {f['section.yaml']}:1: 'modle' is not a config field (did you mean 'model'?)",
            megatron=True,
        ),
        Row(
            "yaml-deep",
            ["check", "small_gpt_smoke_4k", "--config-file", f["deep.yaml"]],
            ERR + f"--config-file {f['deep.yaml']}:3: 'dataset.offline_packing_specs.pad_seq_to_mul' is not a config "
            "field (did you mean 'dataset.offline_packing_specs.pad_seq_to_mult'?)",
            megatron=True,
        ),
        Row(
            "runner-mode",
            ["check", "--recipe", "llama32_1b_sft_1gpu_h100_bf16_config", "--mode", "pretrain"],
            ERR + "Mode 'pretrain' is incompatible with recipe 'llama32_1b_sft_1gpu_h100_bf16_config' (run_recipe.py "
            "refuses it too)",
            megatron=True,
        ),
        Row(
            "runner-dataset",
            ["check", "small_gpt_smoke_4k", "--dataset", "mock"],
            ERR + "--dataset mock is for pretrain, not this finetune launch",
            megatron=True,
        ),
        Row(
            "override-typo",
            ["check", "small_gpt_smoke_4k", "model.context_paralel_size=2"],
            ERR + "Megatron-Bridge rejected the overrides: Failed to parse Hydra overrides: Could not override "
            "'model.context_paralel_size'. (did you mean 'model.context_parallel_size'?)",
            megatron=True,
        ),
    ]
    return rows


def _write_inputs(tmp: Path) -> None:
    for name, text in {**RECIPE_FILES, **YAML_FILES}.items():
        (tmp / name).write_text(text)
    (tmp / "adir.py").mkdir()
    message = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]
    (tmp / "chat.jsonl").write_text(json.dumps({"messages": message}) + "\n")
    (tmp / "records.jsonl").write_text(json.dumps({"input": "a question", "output": "an answer"}) + "\n")
    (tmp / "bad.jsonl").write_text('{"input": "a", "output": "b"}\n{"input": \n')
    record = {"input": "a question", "output": "an answer"}
    (tmp / "records.jsonl.gz").write_bytes(gzip.compress((json.dumps(record) + "\n").encode()))
    (tmp / "records.json").write_text(json.dumps([record, record], indent=2))
    (tmp / "array.jsonl").write_text(json.dumps([record, record]) + "\n")
    (tmp / "tok").mkdir()


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Row], dict[str, dict]]:
    tmp = tmp_path_factory.mktemp("bad_inputs")
    _write_inputs(tmp)
    rows = _rows(tmp)
    order = [r for r in rows if not r.megatron] + [r for r in rows if r.megatron]
    spec = tmp / "rows.json"
    spec.write_text(json.dumps([{"id": r.id, "argv": r.argv, "env": r.env or {}, "cwd": str(tmp)} for r in order]))
    env = {k: v for k, v in os.environ.items() if k not in ("MBRIDGE_SEQPACK_MODE", "WORLD_SIZE")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("bad_inputs_driver.py")), str(spec)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=900,
    )
    results = {r["id"]: r for r in map(json.loads, done.stdout.splitlines())}
    for result in results.values():  # messages are wrapped at 100 columns: compare them whole
        result["raw_err"], result["err"] = result["err"], unwrap(result["err"])
    assert len(results) == len(rows), done.stderr[-3000:]
    return rows, results


def test_the_table_is_big_enough(table: tuple[list[Row], dict[str, dict]]) -> None:
    rows, _ = table
    assert len(rows) >= 40 and len({r.id for r in rows}) == len(rows)


def _matches(line: str, expected: str) -> bool:
    if expected.startswith("..."):
        return expected[3:].rstrip(".") in line
    if expected.endswith("..."):
        return line.startswith(expected[:-3])
    return line == expected


def test_every_bad_input_exits_2_with_its_message_and_no_traceback(table: tuple[list[Row], dict[str, dict]]) -> None:
    rows, results = table
    wrong = []
    for row in rows:
        got = results[row.id]
        lines = got["err"].splitlines()
        problems = []
        if got["rc"] != 2:
            problems.append(f"exit {got['rc']}")
        if "Traceback" in got["err"] + got["out"]:
            problems.append("a traceback")
        if not any(_matches(line, row.message) for line in lines):
            problems.append("not the message")
        if not row.megatron and got["megatron"]:
            problems.append("Megatron-Bridge imported first")
        if problems:
            wrong.append((row.id, problems, got["err"][-1500:]))
    assert wrong == []


def test_every_line_written_fits_100_columns(table: tuple[list[Row], dict[str, dict]]) -> None:
    """The messages are wrapped at spaces; only a single word longer than the width (a path) may stand alone."""
    _, results = table
    long = [
        (name, line)
        for name, got in results.items()
        for line in (got["raw_err"] + got["out"]).splitlines()
        if len(line) > 100 and " " in line.strip()
    ]
    assert long == []


def test_the_hub_rows_fail_in_two_lines_with_the_fix(table: tuple[list[Row], dict[str, dict]]) -> None:
    _, results = table
    for name in ("hub-probed", "hub-offline"):
        lines: list[str] = []
        in_status = False  # the start-up status line and its indented why (none where the bytecode is cached)
        for line in results[name]["err"].splitlines():
            in_status = line.startswith("mbridge-seqpack: loading") or (in_status and line.startswith("  "))
            if not in_status:
                lines.append(line)
        assert len(lines) == 2 and lines[1] == HUB_FIX, lines
    assert (
        results["hub-probed"]["err"]
        .splitlines()[-2]
        .endswith("the hub did not answer within 3 s, and it is not in the local cache")
    )
