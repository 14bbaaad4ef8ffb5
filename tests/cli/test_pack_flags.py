"""#35: every ``pack`` flag in every mode either takes effect, with what it changed sealed in the pack, or exits 2
saying what to do instead (for a recipe, the override that sets the same thing). The table below is the test: a
flag the parser defines and the table does not cover in every mode fails ``test_the_table_covers_every_flag``.

Modes: ``recipe`` (a packaged recipe, data at ``dataset.dataset_root``, the pack where Megatron-Bridge's builder
looks), ``input`` (an explicit JSONL), ``hf`` (a recipe reading a local JSON file as a Hugging Face dataset,
materialized by Megatron-Bridge's own code), ``ray`` (``--ray local``). ``--overflow drop`` is not a mode: it acts on
chat records only (tests/artifact/test_artifacts.py), and prompt/answer inputs refuse it."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from mbridge_seqpack.cli.pack_flags import PACK_FLAGS
from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir
from tests.support.stderr_text import unwrap

pytestmark = pytest.mark.slow

DATA = embedded_data_dir()
TOKENIZER = embedded_tokenizer_dir()
HF_RECIPE = Path(__file__).resolve().parents[1] / "scripts" / "hf_recipe.py"
MODES = ("recipe", "input", "hf", "ray")
RECIPE_MODES = ("recipe", "hf")

#: each mode's command before the case's flags; {name} are the fixture's files
BASE = {
    "recipe": ["--recipe", "small_gpt_smoke_4k", "dataset.dataset_root={root}"],
    "input": ["{input}", "--pack-size", "1024"],
    "hf": [
        "--recipe",
        f"{HF_RECIPE}:hf_smoke",
        "++dataset.hf_dataset.load_kwargs.data_files={train}",
        "dataset.hf_output_root={hf_root}",
    ],
    "ray": ["{input}", "--pack-size", "1024", "--ray", "local"],
}
#: prompt/answer records are cut to max_seq_length by Megatron-Bridge's prep, so none can overflow
OVERFLOW_REFUSED = (
    "--overflow drop acts on chat records only (--chat, or a recipe's ChatSFTPreprocessingConfig): Megatron-Bridge's "
    "prep truncates prompt/answer records to --max-seq-length, so none is longer and none is dropped; leave "
    "--overflow out"
)
RECIPE_NAME = {"recipe": "small_gpt_smoke_4k", "hf": f"{HF_RECIPE}:hf_smoke"}


@dataclass(frozen=True)
class Sealed:
    """The pack is made and its training entry holds ``value`` at ``path`` (dotted; ``None``: the key is absent)."""

    path: str
    value: Any


@dataclass(frozen=True)
class Acts:
    """The pack is made; ``check(result)`` says the flag did what it says (for flags that change how, not what)."""

    what: str
    check: Callable[[Any], None] = lambda result: None


@dataclass(frozen=True)
class Refused:
    """Exit 2 with exactly this message (``{recipe}`` is the mode's recipe name)."""

    message: str


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    outcome: Sealed | Acts | Refused
    input: str = "{train}"  # the INPUT of the input modes
    files: dict[str, str] = field(default_factory=dict)


def _recipe_conflict(flag_text: str, has: str, instead: str) -> Refused:
    return Refused(
        f"pack --recipe {{recipe}} takes these from the recipe, as the launch does: {flag_text} conflicts with the "
        f"recipe ({has}); pass {instead} instead (after the recipe name; launch with the same overrides)"
    )


CHAT_PREPROCESSING = "{_target_:megatron.bridge.data.builders.ChatSFTPreprocessingConfig}"
CHAT_OVERRIDES = f"dataset.preprocessing=null 'dataset.preprocessing={CHAT_PREPROCESSING}'"
NO_RECIPE_WORLD = Refused(
    "--world-size sizes DP from a recipe's parallel layout (with --recipe); without one pass --data-parallel D"
)
NO_RAY_SHARDS = Refused("--ray-shard-mb sizes the tasks of a --ray pack; add --ray ADDRESS or drop it")
DEFAULT_KWARGS = json.dumps({}, sort_keys=True)
QA_KWARGS = json.dumps(
    {"label_key": "a", "prompt_template": "{q} {a}", "truncation_field": "q"}, sort_keys=True, default=str
)


#: what a metadata entry says of where its input lay (the cells copy their input into folders of their own), and
#: the entry's seals over it
_WHERE = ("input_path", "entry_sha256", "entry_hmac_sha256")


def _same_bytes_as_plain(result: Any) -> None:
    """The flag changed how the pack was made, not its bytes: the same files as the mode's pack without it (the
    metadata the same but for where the input lay)."""
    plain = result["plain"]()
    for name in sorted(p.name for p in plain.iterdir()):
        ours, theirs = (result["directory"] / name).read_bytes(), (plain / name).read_bytes()
        if name.endswith("_metadata.jsonl"):
            ours, theirs = (
                [{k: v for k, v in e.items() if k not in _WHERE} for e in json.loads(b)] for b in (ours, theirs)
            )
        assert ours == theirs, name


def _json_printed(result: Any) -> None:
    assert json.loads(result["stdout"])["directory"] == str(result["directory"])


def _validation_split(result: Any) -> None:
    assert "validation" in result["entries"]


def _replaced(result: Any) -> None:
    assert not (result["directory"] / "old.txt").exists()


def _into_output(result: Any) -> None:
    assert result["directory"].name == "chosen"


#: flag (parser dest) -> mode -> cases. Recipe modes pack at 4096 (seed 5678, batch sampler, DP 1, 8 rows per step)
TABLE: dict[str, dict[str, list[Case]]] = {
    "input": {
        "input": [Case((), Sealed("fingerprint.input_sha256", "{sha:train}"))],
        "recipe": [Case(("{train2}",), Sealed("fingerprint.input_sha256", "{sha:train2}"))],
    },
    "overrides": {
        "input": [Case(("x.y=1",), Refused("overrides ['x.y=1'] need --recipe NAME"))],
        "recipe": [
            Case(("dataset.offline_packing_specs.pad_seq_to_mult=4",), Sealed("fingerprint.pad_seq_to_mult", 4))
        ],
    },
    "recipe": {
        "input": [  # INPUT --pack-size 1024 --recipe R: the recipe's settings, and the pack size conflicts
            Case(
                ("--recipe", "small_gpt_smoke_4k"),
                Refused(
                    "pack --recipe small_gpt_smoke_4k takes these from the recipe, as the launch does: --pack-size "
                    "1024 conflicts with the recipe (dataset.offline_packing_specs.packed_sequence_size=4096); pass "
                    "the override dataset.offline_packing_specs.packed_sequence_size=1024 instead (after the recipe "
                    "name; launch with the same overrides)"
                ),
            )
        ],
        "recipe": [Case((), Sealed("fingerprint.pack_size", 4096))],
    },
    "runner": {
        "input": [
            Case(
                ("--no-runner",),
                Refused("--no-runner models Megatron-Bridge's recipe runner for --recipe; without --recipe drop it"),
            )
        ],
        "recipe": [Case(("--no-runner",), Sealed("fingerprint.pack_size", 4096))],
    },
    "validation": {
        "input": [Case(("--validation", "{val}"), Acts("a validation split", _validation_split))],
        "recipe": [Case(("--validation", "{val}"), Acts("a validation split", _validation_split))],
    },
    "tokenizer": {
        "input": [Case(("--tokenizer", "{tok2}"), Sealed("fingerprint.tokenizer", "{tok2}"))],
        "recipe": [
            Case(
                ("--tokenizer", "{tok2}"),
                _recipe_conflict(
                    "--tokenizer {tok2}",
                    f"tokenizer.tokenizer_model={TOKENIZER}",
                    "the override tokenizer.tokenizer_model={tok2} (Megatron-Bridge's builder names the pack's "
                    "folder after it)",
                ),
            ),
            Case(("--tokenizer", str(TOKENIZER)), Sealed("fingerprint.tokenizer", str(TOKENIZER))),
        ],
    },
    "pack_size": {
        "input": [Case(("--pack-size", "2048"), Sealed("fingerprint.pack_size", 2048))],
        "recipe": [
            Case(
                ("--pack-size", "2048"),
                _recipe_conflict(
                    "--pack-size 2048",
                    "dataset.offline_packing_specs.packed_sequence_size=4096",
                    "the override dataset.offline_packing_specs.packed_sequence_size=2048",
                ),
            ),
            Case(("--pack-size", "4096"), Sealed("fingerprint.pack_size", 4096)),
        ],
    },
    "pad_seq_to_mult": {
        "input": [Case(("--pad-seq-to-mult", "4"), Sealed("fingerprint.pad_seq_to_mult", 4))],
        "recipe": [
            Case(
                ("--pad-seq-to-mult", "4"),
                _recipe_conflict(
                    "--pad-seq-to-mult 4",
                    "dataset.offline_packing_specs.pad_seq_to_mult=1",
                    "the override dataset.offline_packing_specs.pad_seq_to_mult=4",
                ),
            )
        ],
    },
    "max_seq_length": {
        "input": [Case(("--max-seq-length", "512"), Sealed("fingerprint.max_seq_length", 512))],
        "recipe": [
            Case(
                ("--max-seq-length", "512"),
                _recipe_conflict(
                    "--max-seq-length 512",
                    "dataset.offline_packing_specs.max_single_sequence_length=None",
                    "the override dataset.offline_packing_specs.max_single_sequence_length=512",
                ),
            )
        ],
    },
    "output": {
        "input": [Case(("--output", "{tmp}/chosen"), Acts("the pack goes there", _into_output))],
        "recipe": [Case(("--output", "{tmp}/chosen"), Acts("the pack goes there", _into_output))],
    },
    "overwrite": {
        "input": [Case(("--output", "{full}", "--overwrite"), Acts("the old contents are replaced", _replaced))],
        "recipe": [Case(("--output", "{full}", "--overwrite"), Acts("the old contents are replaced", _replaced))],
    },
    "seal_key_file": {
        "input": [Case(("--seal-key-file", "{seal_key}"), Sealed("seal_keyed", "hmac-sha256"))],
        "recipe": [Case(("--seal-key-file", "{seal_key}"), Sealed("seal_keyed", "hmac-sha256"))],
    },
    "seed": {
        "input": [Case(("--seed", "3"), Sealed("fingerprint.seed", 3))],
        "recipe": [
            Case(("--seed", "3"), _recipe_conflict("--seed 3", "dataset.seed=5678", "the override dataset.seed=3")),
            Case(("--seed", "5678"), Sealed("fingerprint.seed", 5678)),
        ],
    },
    "prompt_key": {
        "input": [
            Case(
                ("--prompt-key", "q", "--answer-key", "a"),
                Sealed("fingerprint.dataset_kwargs", QA_KWARGS),
                input="{qa}",
            )
        ],
        "recipe": [
            Case(
                ("--prompt-key", "q", "--answer-key", "a"),
                _recipe_conflict(
                    "--prompt-key/--answer-key",
                    'dataset.dataset_kwargs: prompt_template="{input} {output}", label_key="output", '
                    'truncation_field="input"',
                    "the override(s) ++dataset.dataset_kwargs.prompt_template='{q} {a}' "
                    "++dataset.dataset_kwargs.label_key=a ++dataset.dataset_kwargs.truncation_field=q",
                ),
            )
        ],
    },
    "answer_key": {
        "input": [
            Case(
                ("--answer-key", "a"),
                Sealed(
                    "fingerprint.dataset_kwargs",
                    json.dumps(
                        {"label_key": "a", "prompt_template": "{input} {a}", "truncation_field": "input"},
                        sort_keys=True,
                    ),
                ),
                input="{qa}",
            )
        ],
        "recipe": [
            Case(
                ("--answer-key", "a"),
                _recipe_conflict(
                    "--prompt-key/--answer-key",
                    'dataset.dataset_kwargs: prompt_template="{input} {output}", label_key="output"',
                    "the override(s) ++dataset.dataset_kwargs.prompt_template='{input} {a}' "
                    "++dataset.dataset_kwargs.label_key=a",
                ),
            ),
            Case(("--answer-key", "output"), Sealed("fingerprint.pack_size", 4096)),
        ],
    },
    "chat": {
        "input": [
            Case(
                ("--chat", "--tokenizer", "{chat_tok}"),
                Sealed(
                    "fingerprint.dataset_kwargs",
                    json.dumps({"chat": True, "use_hf_tokenizer_chat_template": True}, sort_keys=True),
                ),
                input="{chat}",
            )
        ],
        "recipe": [
            Case(
                ("--chat",),
                _recipe_conflict(  # Megatron-Bridge 0.6.2's own way, not the deprecated dataset_kwargs.chat
                    "--chat",
                    "dataset.preprocessing=None: prompt/answer records",
                    f"the overrides {CHAT_OVERRIDES}",
                ),
            )
        ],
        "hf": [
            Case(
                ("--chat",),
                _recipe_conflict(
                    "--chat",
                    "dataset.preprocessing=PromptCompletionSFTPreprocessingConfig: prompt/answer records",
                    f"the overrides {CHAT_OVERRIDES}",
                ),
            )
        ],
    },
    "dataset_kwargs": {
        "input": [
            Case(
                ("--dataset-kwargs", '{"add_eos": false}'), Sealed("fingerprint.dataset_kwargs", '{"add_eos": false}')
            )
        ],
        "recipe": [
            Case(
                ("--dataset-kwargs", '{"add_eos": false}'),
                _recipe_conflict(
                    '--dataset-kwargs {"add_eos": false}',
                    "dataset.dataset_kwargs: add_eos=true",
                    "the override(s) ++dataset.dataset_kwargs.add_eos=false",
                ),
            ),
            Case(("--dataset-kwargs", '{"add_eos": true}'), Sealed("fingerprint.pack_size", 4096)),
        ],
    },
    "overflow": {
        "input": [Case(("--overflow", "drop"), Refused(OVERFLOW_REFUSED))],
        "recipe": [Case(("--overflow", "drop"), Refused(OVERFLOW_REFUSED))],
    },
    "workers": {
        "input": [Case(("--workers", "1"), Acts("one tokenizer process, the same bytes", _same_bytes_as_plain))],
        "recipe": [Case(("--workers", "1"), Acts("one tokenizer process, the same bytes", _same_bytes_as_plain))],
        "ray": [
            Case(
                ("--workers", "1"),
                Refused(
                    "--workers sets this machine's tokenizer processes; with --ray every Ray worker tokenizes its "
                    "shards in one process: size the cluster instead (ray start --num-cpus N) or the tasks "
                    "(--ray-shard-mb)"
                ),
            )
        ],
    },
    "ray": {
        "input": [Case(("--ray", "local"), Acts("packed on the Ray cluster, the same bytes", _same_bytes_as_plain))],
        "recipe": [Case(("--ray", "local"), Acts("packed on the Ray cluster, the same bytes", _same_bytes_as_plain))],
    },
    "ray_shard_mb": {
        "input": [Case(("--ray-shard-mb", "0.001"), NO_RAY_SHARDS)],
        "recipe": [Case(("--ray-shard-mb", "0.001"), NO_RAY_SHARDS)],
        "ray": [Case(("--ray-shard-mb", "0.001"), Acts("1 kB tasks, the same bytes", _same_bytes_as_plain))],
    },
    "no_balance": {
        "input": [Case(("--no-balance",), Sealed("fingerprint.algorithm", "best_fit_decreasing"))],
        "recipe": [Case(("--no-balance",), Sealed("fingerprint.algorithm", "best_fit_decreasing"))],
    },
    "sampler": {
        "input": [
            Case(("--sampler", "single"), Sealed("balance.sampler", "single")),
            Case(
                ("--sampler", "single", "--no-balance"),
                Refused(
                    "--sampler lays out balanced rows for the sampler and DP ranks that read them; --no-balance "
                    "keeps best-fit rows in their own order: drop --sampler or --no-balance"
                ),
            ),
        ],
        "recipe": [
            Case(
                ("--sampler", "single"),
                _recipe_conflict(
                    "--sampler single", "dataset.dataloader_type=batch", "the override dataset.dataloader_type=single"
                ),
            ),
            Case(("--sampler", "batch"), Sealed("balance.sampler", "batch")),
        ],
    },
    "sampler_seed": {
        "input": [
            Case(("--sampler-seed", "7"), Sealed("balance.sampler_seed", 7)),
            Case(
                ("--sampler-seed", "7", "--sampler", "single"),
                Refused(
                    "--sampler-seed seeds the batch sampler's shuffle; --sampler single reads the rows in file "
                    "order: drop --sampler-seed"
                ),
            ),
        ],
        "recipe": [
            Case(
                ("--sampler-seed", "7"),
                _recipe_conflict("--sampler-seed 7", "dataset.seed=5678", "the override dataset.seed=7"),
            )
        ],
    },
    "data_parallel": {
        "input": [Case(("--data-parallel", "2"), Sealed("balance.data_parallel", 2))],
        "recipe": [
            Case(
                ("--data-parallel", "2"),
                _recipe_conflict("--data-parallel 2", "DP 1 = world size / (TP x PP x CP = 1)", "--world-size 2"),
            )
        ],
    },
    "micro_batches": {
        "input": [Case(("--micro-batches", "2"), Sealed("balance.micro_batches", 2))],
        "recipe": [
            Case(
                ("--micro-batches", "2"),
                _recipe_conflict(
                    "--micro-batches 2",
                    "train.global_batch_size / DP = 8",
                    "the override train.global_batch_size=2",
                ),
            ),
            Case(("--micro-batches", "8"), Sealed("balance.micro_batches", 8)),
        ],
    },
    "world_size": {
        "input": [Case(("--world-size", "2"), NO_RECIPE_WORLD)],
        "recipe": [Case(("--world-size", "2"), Sealed("balance.data_parallel", 2))],
    },
    "max_sequences_per_row": {
        "input": [
            Case(("--max-sequences-per-row", "3"), Sealed("balance.max_sequences_per_row", 3)),
            Case(
                ("--max-sequences-per-row", "3", "--no-balance"),
                Refused(
                    "--max-sequences-per-row re-deals the rows by cost to hold the cap (the balance), so it cannot "
                    "keep --no-balance's best-fit rows: drop --no-balance (the capped rows are balanced) or the cap"
                ),
            ),
        ],
        "recipe": [Case(("--max-sequences-per-row", "3"), Sealed("balance.max_sequences_per_row", 3))],
    },
    "json": {
        "input": [Case(("--json",), Acts("the result as JSON", _json_printed))],
        "recipe": [Case(("--json",), Acts("the result as JSON", _json_printed))],
    },
    "verbose": {  # every command's flag (cli/startup.py): the warnings it shows, not the bytes
        "input": [Case(("--verbose",), Acts("every warning shown, the same bytes", _same_bytes_as_plain))],
        "recipe": [Case(("--verbose",), Acts("every warning shown, the same bytes", _same_bytes_as_plain))],
    },
}


def cases(mode: str) -> dict[str, list[Case]]:
    """The cases of ``mode``: its own, else the recipe's (hf) or the input mode's (ray)."""
    fallback = "recipe" if mode in RECIPE_MODES else "input"
    return {dest: by_mode.get(mode, by_mode[fallback]) for dest, by_mode in TABLE.items()}


def _parser_dests() -> set[str]:
    from mbridge_seqpack.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest for a in sub.choices["pack"]._actions if a.dest != "help"}


def test_the_table_covers_every_flag() -> None:
    """A new flag must be audited: the parser, the plugin's own table and this one name the same flags."""
    assert _parser_dests() == set(PACK_FLAGS) == set(TABLE)
    for dest, by_mode in TABLE.items():
        assert {"input", "recipe"} <= set(by_mode), dest  # the others fall back to these explicitly (cases())


# --- running the cells ------------------------------------------------------------------------------------


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, megatron_bridge: Any) -> dict[str, Path]:
    from tests.support.packs import chat_corpus, chat_tokenizer

    base = tmp_path_factory.mktemp("flags")
    lines = (DATA / "training.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines[:12]]
    files = {"train": base / "train.jsonl", "train2": base / "train2.jsonl", "val": base / "val.jsonl"}
    files["train"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    files["train2"].write_text("".join(json.dumps(r) + "\n" for r in rows[:6]))
    files["val"].write_text("".join(json.dumps(r) + "\n" for r in rows[6:9]))
    files["qa"] = base / "qa.jsonl"
    files["qa"].write_text("".join(json.dumps({**r, "q": r["input"], "a": r["output"]}) + "\n" for r in rows))
    files["chat"] = chat_corpus(base / "chat.jsonl", 12)
    files["chat_tok"] = chat_tokenizer(base)
    files["seal_key"] = base / "seal.key"
    files["seal_key"].write_text("a-seal-key-of-32-bytes-0123456789\n")
    files["tok2"] = base / "tok2"
    shutil.copytree(TOKENIZER, files["tok2"])
    return files


def _fill(text: str, files: dict[str, Path], tmp: Path) -> str:
    for name, path in files.items():
        text = text.replace(f"{{sha:{name}}}", _sha(path) if path.is_file() else "")
        text = text.replace(f"{{{name}}}", str(path))
    return text.replace("{tmp}", str(tmp))


def _run(argv: list[str]) -> tuple[int, str, str]:
    from mbridge_seqpack.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _command(mode: str, case: Case, files: dict[str, Path], tmp: Path) -> list[str]:
    """The mode's base, the case's flags, and (input modes, no --output given) an output of the run's own."""
    tmp.mkdir(parents=True, exist_ok=True)
    root = tmp / "root"
    if not root.exists():
        root.mkdir()
        shutil.copy(files["train"], root / "training.jsonl")
    named = {
        **files,
        "input": Path(_fill(case.input, files, tmp)),
        "root": root,
        "hf_root": tmp / "hf",
        "full": tmp / "full",
    }
    argv = [_fill(a, named, tmp) for a in ["pack", *BASE[mode], *case.args]]
    if mode not in RECIPE_MODES and "--output" not in argv:
        argv += ["--output", str(tmp / "out")]
    return argv


def _entries(directory: Path) -> dict[str, dict[str, Any]]:
    (meta,) = directory.glob("*_metadata.jsonl")
    return {entry["split"]: entry for entry in json.loads(meta.read_text())}


def _value(entry: dict[str, Any], path: str) -> Any:
    value: Any = entry
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _printed_directory(argv: list[str], stdout: str, tmp: Path) -> Path:
    return tmp / (Path(json.loads(stdout)["directory"]) if "--json" in argv else _directory(stdout))


def _check_cells(mode: str, members: list[tuple[str, Case]], files: dict[str, Path], tmp: Path) -> None:
    """Run the members' flags as one command (one member, or acting ones merged: see :func:`_merged`) and check
    each member's outcome on its result."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "full").mkdir(exist_ok=True)
    (tmp / "full" / "old.txt").write_text("old")
    case = Case(tuple(a for _, c in members for a in c.args), members[0][1].outcome, members[0][1].input)
    argv = _command(mode, case, files, tmp)
    here = os.getcwd()
    os.chdir(tmp)  # a recipe pack of another input goes to ./packed_<N>_mult<M>: one per cell
    try:
        code, stdout, stderr = _run(argv)
    finally:
        os.chdir(here)
    where = f"{'+'.join(d for d, _ in members)} x {mode}: {' '.join(argv[1:])}"
    if isinstance(case.outcome, Refused):
        expected = _fill(case.outcome.message.replace("{recipe}", RECIPE_NAME.get(mode, "")), files, tmp)
        assert code == 2, where
        assert unwrap(stderr).strip().splitlines()[-1] == f"mbridge-seqpack: error: {expected}", where
        return
    assert code == 0, f"{where}\n{stderr[-2000:]}"
    directory = _printed_directory(argv, stdout, tmp)
    entries = _entries(directory)

    def plain() -> Path:
        """The same command on this machine, without --ray / --ray-shard-mb / --workers / --verbose."""
        argv_plain = _command(mode, case, files, tmp / "plain")
        for flag_ in ("--ray", "--ray-shard-mb", "--workers"):
            while flag_ in argv_plain:
                at = argv_plain.index(flag_)
                del argv_plain[at : at + 2]
        while "--verbose" in argv_plain:
            argv_plain.remove("--verbose")
        if "--output" in argv_plain:
            at = argv_plain.index("--output")
            del argv_plain[at : at + 2]
        argv_plain += ["--output", str(tmp / "plain" / "out"), "--overwrite"]
        code_plain, out_plain, err_plain = _run(argv_plain)
        assert code_plain == 0, err_plain
        return _printed_directory(argv_plain, out_plain, tmp)

    for dest, member in members:
        outcome = member.outcome
        if isinstance(outcome, Sealed):
            expected = _fill(outcome.value, files, tmp) if isinstance(outcome.value, str) else outcome.value
            assert _value(entries["training"], outcome.path) == expected, f"{dest}: {where}"
        else:
            assert isinstance(outcome, Acts), where
            outcome.check({"directory": directory, "stdout": stdout, "entries": entries, "plain": plain})


#: flags that cannot share a command (one refuses the other, or both name the output)
_APART = [{"--no-balance", "--sampler"}, {"--no-balance", "--sampler-seed"}, {"--no-balance", "--data-parallel"},
          {"--no-balance", "--micro-batches"}, {"--no-balance", "--max-sequences-per-row"},
          {"--no-balance", "--world-size"}, {"--micro-batches", "--world-size"},  # (recipe: micro batches = GBS / DP)
          {"--sampler", "--sampler-seed"}]  # fmt: skip


def _merged(cells: list[tuple[str, Case]]) -> list[list[tuple[str, Case]]]:
    """Acting cells merged into as few commands as their flags allow (same input, no flag twice, none of
    :data:`_APART` together); refused cells stay alone (each has its own exact message)."""
    groups: list[list[tuple[str, Case]]] = []
    for dest, case in cells:
        flags = {a for a in case.args if a.startswith("--")}
        home = None
        if not isinstance(case.outcome, Refused):
            for group in groups:
                if isinstance(group[0][1].outcome, Refused) or group[0][1].input != case.input:
                    continue
                taken = {a for _, c in group for a in c.args if a.startswith("--")}
                if flags & taken or any(pair <= flags | taken for pair in _APART):
                    continue
                home = group
                break
        if home is None:
            groups.append([(dest, case)])
        else:
            home.append((dest, case))
    return groups


def _directory(stdout: str) -> Path:
    """The directory ``pack`` printed (``packed into DIR``, or the label alone and DIR on the next line)."""
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("packed into"))
    rest = lines[at][len("packed into") :].strip()
    return Path(rest or lines[at + 1].strip())


@pytest.mark.parametrize("mode", [m for m in MODES if m != "ray"])
def test_every_flag_acts_or_is_refused(
    mode: str, corpus: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a recipe pack of another input goes to ./packed_<N>_mult<M>
    monkeypatch.setenv("NEMO_DATASETS_CACHE", str(tmp_path / "nemo"))
    failures = []
    cells = [
        (dest, case)
        for dest, mode_cases in cases(mode).items()
        for case in mode_cases
        if not ("--ray" in case.args or dest == "ray")  # the Ray cells run on the session's cluster (below)
    ]
    for number, group in enumerate(_merged(cells)):  # acting flags share packs, each checked on its own outcome
        try:
            _check_cells(mode, group, corpus, tmp_path / f"{mode}-{number}")
        except Exception as exc:  # noqa: BLE001  (every cell reported, not just the first)
            failures.append(f"{'+'.join(d for d, _ in group)} x {mode}: {type(exc).__name__}: {exc}")
    assert not failures, "\n\n".join(failures)


def test_every_flag_under_ray(
    ray_cluster: Any, corpus: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ray mode's cells (acting ones merged into a few packs on the cluster, each checked on its pack), and the
    --ray flag in the other modes, on one local cluster."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NEMO_DATASETS_CACHE", str(tmp_path / "nemo"))
    failures = []
    for mode in MODES:
        cells = [(d, c) for d, mode_cases in cases(mode).items() for c in mode_cases if mode == "ray" or d == "ray"]
        for number, group in enumerate(_merged(cells) if mode == "ray" else [[cell] for cell in cells]):
            try:
                _check_cells(mode, group, corpus, tmp_path / f"{mode}-{number}")
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{'+'.join(d for d, _ in group)} x {mode}: {type(exc).__name__}: {exc}")
    assert not failures, "\n\n".join(failures)
