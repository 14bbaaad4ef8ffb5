"""Packs of the embedded corpus and the questions the pack tests ask of them (shared by the artifact, seal, stale-pack
and tokenizer tests)."""

from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack import check
from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir

DATA = embedded_data_dir()
TOKENIZER = embedded_tokenizer_dir()
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<user> {{ m['content'] }}\n{% else %}"
    "{% generation %}<assistant> {{ m['content'] }}{{ eos_token }}{% endgeneration %}\n{% endif %}"
    "{% endfor %}"
)


def run_pack(inputs: dict[str, Path], out: Path, **options: Any) -> Any:
    """``inputs`` packed at 4096 with the embedded tokenizer into ``out`` (replacing it); ``options`` override."""
    return pack_jsonl(
        inputs,
        tokenizer=options.pop("tokenizer", TOKENIZER),
        output_dir=out,
        lines_per_chunk=options.pop("lines_per_chunk", 50_000),
        options=PackOptions(**{"pack_size": 4096, **options}),
        overwrite=True,
    )


def small_validation_pack(out: Path) -> Path:
    """The embedded training corpus and the first 94 validation records (2 rows at 4096: under one row per rank of
    8) packed at 4096 into ``out``."""
    data = embedded_data_dir()
    small = out.parent / "validation.jsonl"
    small.write_text("".join((data / "validation.jsonl").read_text().splitlines(keepends=True)[:94]))
    pack_jsonl(
        {"training": data / "training.jsonl", "validation": small},
        tokenizer=embedded_tokenizer_dir(),
        output_dir=out,
        options=PackOptions(pack_size=4096),
    )
    return out


def pack_rule(cfg: Any) -> list[Any]:
    """What ``artifact.fingerprint_mismatch`` finds (``check`` at world size 8, that rule only)."""
    return [v for v in check(cfg, world_size=8) if v.rule_id == "artifact.fingerprint_mismatch"]


def small_jsonl(path: Path, n: int = 40) -> Path:
    """The first ``n`` embedded training records, written to ``path``."""
    rows = [json.loads(line) for line in (DATA / "training.jsonl").read_text().splitlines()[:n]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def packed_sequences(path: Path) -> collections.Counter:
    """The multiset of (tokens, loss mask) sequences a packed file holds."""
    import pyarrow.parquet as pq

    out: collections.Counter = collections.Counter()
    for row in pq.read_table(str(path), columns=["input_ids", "loss_mask", "seq_start_id"]).to_pylist():
        bounds = row["seq_start_id"] + [len(row["input_ids"])]
        for s, e in zip(bounds[:-1], bounds[1:]):
            out[(tuple(row["input_ids"][s:e]), tuple(row["loss_mask"][s:e]))] += 1
    return out


def chat_tokenizer(tmp_path: Path) -> Path:
    """A copy of the embedded tokenizer with a chat template that marks the answers as generation."""
    tok = tmp_path / "tok"
    shutil.copytree(TOKENIZER, tok)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    return tok


def chat_corpus(path: Path, n: int, *, sharegpt: bool = False) -> Path:
    """The first ``n`` embedded prompt/answer records as chat records: ``messages`` or ShareGPT ``conversations``."""
    with open(path, "w") as f:
        for line in (DATA / "training.jsonl").read_text().splitlines()[:n]:
            r = json.loads(line)
            if sharegpt:
                turns = [{"from": "User", "value": r["input"]}, {"from": "Assistant", "value": r["output"]}]
                f.write(json.dumps({"conversations": turns}) + "\n")
            else:
                turns = [{"role": "user", "content": r["input"]}, {"role": "assistant", "content": r["output"]}]
                f.write(json.dumps({"messages": turns}) + "\n")
    return path


def assert_the_hook_refuses(cfg: Any, violations: int = 1, also: tuple[str, ...] = ()) -> None:
    """Through install() and Megatron-Bridge's own runtime_config_update(), as a launch would."""
    import copy
    import os

    from megatron.bridge.training.config import runtime_config_update

    import mbridge_seqpack
    from mbridge_seqpack.errors import PackingConfigError

    os.environ["WORLD_SIZE"] = "8"  # the conftest fixture restores the environment
    with mbridge_seqpack.install(), pytest.raises(PackingConfigError) as info:
        runtime_config_update(copy.deepcopy(cfg))
    assert info.value.rule_ids == ["artifact.fingerprint_mismatch"] * violations + list(also)
