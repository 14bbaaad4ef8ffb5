"""What ``pack`` tells a user after packing: the tokens the rows train on and the sequences that train on none
(sealed in the metadata), steps per epoch at the recipe's batch, every override a launch needs, and the recipe's
own row-count rules run on the new pack (a split too small for a batch fails the launch after the model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from mbridge_seqpack.cli.main import main

DATA = Path(__file__).resolve().parents[2] / "mbridge_seqpack" / "data" / "sft_sample"
TOKENIZER = DATA.parent / "tokenizer"


TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<user> {{ m['content'] }}\n{% else %}"
    "{% generation %}<assistant> {{ m['content'] }}{{ eos_token }}{% endgeneration %}\n{% endif %}{% endfor %}"
)


def _records(path: Path, n: int) -> Path:
    rows = [json.loads(line) for line in (DATA / "training.jsonl").read_text().splitlines()[:n]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_loss_tokens_and_sequences_that_train_on_nothing_are_counted_and_sealed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], megatron_bridge: Any
) -> None:
    tok = tmp_path / "tok"
    shutil.copytree(TOKENIZER, tok)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    source = tmp_path / "chat.jsonl"
    with source.open("w") as f:
        for index, line in enumerate((DATA / "training.jsonl").read_text().splitlines()[:40]):
            r = json.loads(line)
            turns = [{"role": "user", "content": r["input"]}]
            turns += [] if index % 4 == 0 else [{"role": "assistant", "content": r["output"]}]  # 10 without one
            f.write(json.dumps({"messages": turns}) + "\n")
    out = tmp_path / "pack"
    argv = ["pack", str(source), "--chat", "--tokenizer", str(tok), "--pack-size", "2048", "--output", str(out)]
    assert main(argv) == 0
    said = " ".join(capsys.readouterr().out.split())
    (entry,) = json.loads((out / "2048_metadata.jsonl").read_text())
    table = pq.read_table(out / "training_2048.idx.parquet")
    assert entry["loss_tokens"] == sum(sum(mask) for mask in table["loss_mask"].to_pylist())  # what trains
    assert entry["zero_loss_sequences"] == 10
    slots = entry["stats"]["num_bins"] * 2048
    assert f"; loss on {entry['loss_tokens']:,} tokens ({entry['loss_tokens'] / slots:.1%} of the slots)" in said
    assert "10 sequence(s) train on no token (empty answer or no assistant turn)" in said


def test_pack_recipe_runs_the_recipes_row_rules_on_the_pack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], megatron_bridge: Any
) -> None:
    source = _records(tmp_path / "data.jsonl", 40)
    out = tmp_path / "pack"
    assert main(["pack", "--recipe", "small_gpt_smoke_4k", str(source), "--output", str(out)]) == 0
    text = capsys.readouterr().out
    rows = pq.read_metadata(out / "training_4096.idx.parquet").num_rows
    said = " ".join(text.split())
    assert f"; {rows // 8} step(s) per epoch at the recipe's global batch 8" in said
    assert (
        f"warning: the packed training split holds {rows} rows and one global batch takes 8: the data loaders "
        "refuse it when they are built, after the model; add dataset.max_train_samples=800"
    ) in said
    assert f"    dataset.offline_packing_specs.packed_train_data_path={out / 'training_4096.idx.parquet'}\n" in text
    assert "packed_val_data_path" not in text and "packed_metadata_path" not in text  # not packed; not read
    assert all(len(line) <= 100 or line.startswith("    dataset.") for line in text.splitlines())
