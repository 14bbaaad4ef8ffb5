"""The pack engine protocol (pipeline/engine.py): the local and the Ray engine are one interface, and any engine
that keeps it packs through ``pack_jsonl`` unchanged, into the same bytes."""

from __future__ import annotations

import filecmp
import inspect
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.pipeline.engine import LocalEngine, PackEngine
from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
from mbridge_seqpack.pipeline.ray_engine import RayEngine
from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir

METHODS = ("check_inputs", "tokenizer_facts", "tokenize", "write_split")


def _parameters(function: Any) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of every parameter but ``self``."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values() if p.name != "self"]


@pytest.mark.parametrize("engine", [LocalEngine(), RayEngine("local")], ids=["local", "ray"])
def test_both_engines_keep_the_protocol(engine: Any) -> None:
    """Not only the names (``runtime_checkable`` looks no further): every method takes the protocol's parameters
    (more only with a default), so ``pack_jsonl`` calls either the same way. Building a Ray engine joins no
    cluster."""
    assert isinstance(engine, PackEngine)
    assert sorted(name for name in dir(PackEngine) if not name.startswith("_")) == sorted(METHODS)
    for name in METHODS:
        wanted, given = _parameters(getattr(PackEngine, name)), _parameters(getattr(engine, name))
        assert given[: len(wanted)] == wanted, name
        assert all(default is not inspect.Parameter.empty for _, _, default in given[len(wanted) :]), name
    assert getattr(engine, "ray", None) is None


def test_an_object_without_the_protocol_is_not_an_engine() -> None:
    class Tokenizes:
        def tokenize(self, *args: Any, **kwargs: Any) -> Any: ...

    assert not isinstance(Tokenizes(), PackEngine)


class Recording:
    """A third engine: the local one, each call written down. Nothing in ``pack_jsonl`` knows it."""

    def __init__(self) -> None:
        self.inner, self.calls = LocalEngine(workers=1), []

    def check_inputs(self, inputs: Any, dataset_kwargs: Any) -> None:
        self.calls.append(("check_inputs", sorted(inputs)))
        self.inner.check_inputs(inputs, dataset_kwargs)

    def tokenizer_facts(self, tokenizer: Any, config: Any = None) -> tuple[int, int, str]:
        self.calls.append(("tokenizer_facts", Path(tokenizer).name))
        return self.inner.tokenizer_facts(tokenizer, config)

    def tokenize(self, source: Any, tokenizer: Any, spill: Path, **options: Any) -> Any:
        self.calls.append(("tokenize", spill.name))
        return self.inner.tokenize(source, tokenizer, spill, **options)

    def write_split(self, path: Path, seqs: Any, bins: Any, info: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("write_split", path.name))
        return self.inner.write_split(path, seqs, bins, info)


def test_a_third_engine_plugs_in_and_packs_the_same_bytes(tmp_path: Path, megatron_bridge: Any) -> None:
    lines = (embedded_data_dir() / "training.jsonl").read_text().splitlines()
    source = tmp_path / "train.jsonl"
    source.write_text("\n".join(lines[:40]) + "\n")
    options = PackOptions(pack_size=2048, pad_seq_to_mult=4, data_parallel=2)
    common = dict(tokenizer=embedded_tokenizer_dir(), options=options)
    engine = Recording()
    assert isinstance(engine, PackEngine)
    ours = pack_jsonl(
        {"training": source, "validation": source}, output_dir=tmp_path / "ours", engine=engine, **common
    )
    local = pack_jsonl({"training": source, "validation": source}, output_dir=tmp_path / "local", **common)
    assert engine.calls == [
        ("check_inputs", ["training", "validation"]),
        ("tokenizer_facts", "tokenizer"),
        ("tokenize", ".tokens-training"),
        ("write_split", "training_2048.idx.parquet"),
        ("tokenize", ".tokens-validation"),
        ("write_split", "validation_2048.idx.parquet"),
    ]
    names = sorted(p.name for p in ours.directory.iterdir())
    assert (
        names
        == sorted(p.name for p in local.directory.iterdir())
        == [
            "2048_metadata.jsonl",
            "training_2048.idx.parquet",
            "validation_2048.idx.parquet",
        ]
    )
    for name in names:  # the metadata too: it names the input, never the output
        assert filecmp.cmp(ours.directory / name, local.directory / name, shallow=False), name
