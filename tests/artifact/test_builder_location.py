"""#21: ``pack --recipe`` writes where Megatron-Bridge's own GPT SFT dataset builder looks (its ``default_pack_path``),
so the launch needs no packed path override; the fingerprint rule checks a pack found there as it checks an explicit
one. Held to the real builder: ``GPTSFTDatasetBuilder`` with the tokenizer ``build_tokenizer(cfg.tokenizer)`` makes,
its ``prepare_data()`` (which must skip, not re-make, the pack) and its ``build()``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.packs import DATA, TOKENIZER, assert_the_hook_refuses

pytestmark = pytest.mark.slow

RECIPE = "llama3_8b_sft_packed_8k"


def _launch(root: Path, tokenizer: Path, *extra: str) -> Any:
    from mbridge_seqpack.recipes.targets import build_launch

    return build_launch(RECIPE, [f"dataset.dataset_root={root}", f"tokenizer.tokenizer_model={tokenizer}", *extra]).cfg


def _real_builder(cfg: Any) -> Any:
    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetBuilder
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    return GPTSFTDatasetBuilder(config=cfg.dataset, tokenizer=build_tokenizer(cfg.tokenizer))


@pytest.mark.parametrize(
    "tokenizer_dir, extra, folder_prefix",
    [
        ("tok", [], None),  # a local path: "/" -> "--"
        ("org/model/nemo_tokenizer", ["dataset.offline_packing_specs.pad_seq_to_mult=4"], "org--model_"),
        ("org/model/context/nemo_tokenizer", ["dataset.seed=3"], "org--model_"),
        ("tok", ["dataset.offline_packing_specs.tokenizer_model_name=my-llama"], "my-llama_"),
        ("tok", ['++dataset.dataset_kwargs.prompt_template="Q: {input} A: {output}"'], None),
    ],
)
def test_the_location_is_the_builders_default_pack_path(
    tmp_path: Path, megatron_bridge: Any, tokenizer_dir: str, extra: list[str], folder_prefix: str | None
) -> None:
    from mbridge_seqpack.artifact.builder_location import builder_location

    shutil.copytree(TOKENIZER, tmp_path / tokenizer_dir)
    cfg = _launch(tmp_path / "root", tmp_path / tokenizer_dir, *extra)
    location = builder_location(cfg)
    assert location is not None and not location.directory.exists()  # a config-time lookup creates nothing
    builder = _real_builder(cfg)
    assert location.directory == builder.default_pack_path
    assert location.split_path("training") == builder.train_path_packed
    assert location.split_path("validation") == builder.validation_path_packed
    assert location.metadata == builder.pack_metadata
    if folder_prefix is not None:
        assert location.directory.name.startswith(folder_prefix)


def test_no_location_where_the_builder_needs_more_than_the_config(packed_cfg: Any) -> None:
    """A Hugging Face dataset (materialized under a cache), a tokenizer type named from its loaded identifiers, a
    config that does not pack: no location, so no lookup and nothing created."""
    import copy

    from megatron.bridge.data.builders.gpt_sft import GPTSFTDatasetConfig

    from mbridge_seqpack.artifact.builder_location import builder_location

    assert isinstance(packed_cfg.dataset, GPTSFTDatasetConfig)
    packed_cfg.tokenizer.tokenizer_type, packed_cfg.tokenizer.tokenizer_model = "HuggingFaceTokenizer", str(TOKENIZER)
    assert builder_location(packed_cfg) is not None
    for change in (
        lambda c: setattr(c.dataset, "dataset_root", None),
        lambda c: setattr(c.tokenizer, "tokenizer_type", "SentencePieceTokenizer"),
        lambda c: setattr(c.dataset, "offline_packing_specs", None),
        lambda c: setattr(c.dataset.offline_packing_specs, "packed_sequence_size", -1),
    ):
        cfg = copy.deepcopy(packed_cfg)
        change(cfg)
        assert builder_location(cfg) is None


@pytest.fixture
def dataset_root(tmp_path: Path) -> tuple[Path, Path]:
    """A dataset root with both splits (small) and a tokenizer directory of its own."""
    root = tmp_path / "root"
    root.mkdir()
    for split, n in (("training", 40), ("validation", 20)):
        lines = (DATA / f"{split}.jsonl").read_text().splitlines(keepends=True)[:n]
        (root / f"{split}.jsonl").write_text("".join(lines))
    shutil.copytree(TOKENIZER, tmp_path / "tok")
    return root, tmp_path / "tok"


def test_pack_recipe_writes_where_megatron_bridge_reads_it(
    dataset_root: tuple[Path, Path], megatron_bridge: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --output: the sealed pack lands in the builder's default location; the builder's prep skips it and its
    build() trains on it; check accepts it; once the input file changes, the pack there is refused by check and by
    the hook inside Megatron-Bridge's runtime_config_update()."""
    import os

    import pyarrow.parquet as pq

    from mbridge_seqpack.cli.main import main
    from mbridge_seqpack.report import check

    root, tok = dataset_root
    overrides = [f"dataset.dataset_root={root}", f"tokenizer.tokenizer_model={tok}"]
    assert main(["pack", "--recipe", RECIPE, *overrides]) == 0
    out = capsys.readouterr().out
    cfg = _launch(root, tok)
    builder = _real_builder(cfg)
    train = Path(builder.train_path_packed)
    assert out.splitlines()[:2] == ["packed into", f"  {train.parent}"]  # a long path whole on its own line
    assert "its default_pack_path): no packed path override needed" in " ".join(out.split())
    assert "use:" not in out
    assert sorted(p.name for p in train.parent.iterdir()) == [
        "8192_metadata.jsonl",
        "training_8192.idx.parquet",
        "validation_8192.idx.parquet",
    ]
    assert json.loads(Path(builder.pack_metadata).read_text())[0]["fingerprint"]["pack_size"] == 8192  # sealed
    written = os.stat(train).st_mtime_ns
    builder.prepare_data()
    assert os.stat(train).st_mtime_ns == written  # Megatron-Bridge's prep skipped it: "already exists"
    train_ds, valid_ds, _ = builder.build()
    assert Path(train_ds.file_path) == train and len(train_ds) == pq.read_metadata(train).num_rows
    assert list(train_ds[0]["input_ids"]) == pq.read_table(train)["input_ids"][0].as_py()
    assert [v.rule_id for v in check(cfg, world_size=8) if v.rule_id.startswith("artifact.")] == []

    with (root / "training.jsonl").open("a") as f:  # the data changed since packing
        f.write((DATA / "training.jsonl").read_text().splitlines(keepends=True)[50])
    (v,) = [v for v in check(cfg, world_size=8) if v.rule_id == "artifact.fingerprint_mismatch"]
    assert v.fields == {"dataset.dataset_root": str(root)}
    assert v.rule.startswith(f"the pack was made from another training file than {root / 'training.jsonl'}")
    assert "pack --recipe ... --overwrite" in v.fix and str(train.parent) in v.fix
    # one list: the validation split (20 records, 1 row; not stale) is also short of an evaluation batch
    assert_the_hook_refuses(cfg, also=("eval.packed_split_rows",))


def test_pack_recipe_does_not_write_into_the_package_or_for_another_input(
    tmp_path: Path, dataset_root: tuple[Path, Path], megatron_bridge: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The packaged recipes read the embedded sample: their default stays ./packed_<N>_mult<M> (the package is
    never written into). An explicit input is not what the builder would prepare from: no default location either."""
    from mbridge_seqpack.cli.main import main

    root, tok = dataset_root
    argv = ["pack", str(root / "training.jsonl"), "--recipe", RECIPE, f"dataset.dataset_root={root}"]
    assert main([*argv, f"tokenizer.tokenizer_model={tok}", "--output", str(tmp_path / "explicit")]) == 0
    out = capsys.readouterr().out
    assert (
        "use (paste after the recipe's overrides):\n    dataset.offline_packing_specs.packed_train_data_path=" in out
    )
    assert not (root / "packed").exists()
    os_cwd = Path.cwd()
    try:
        import os

        os.chdir(tmp_path)
        assert main(["pack", "--recipe", RECIPE, f"tokenizer.tokenizer_model={tok}"]) == 0
    finally:
        os.chdir(os_cwd)
    assert "the dataset root is the package's embedded sample" in capsys.readouterr().err
    assert (tmp_path / "packed_8192_mult1" / "training_8192.idx.parquet").is_file()
    assert not (DATA / "packed").exists()


HF_RECIPE = f"{Path(__file__).resolve().parents[1] / 'scripts' / 'hf_recipe.py'}:hf_smoke"


def test_a_hugging_face_dataset_is_packed_where_megatron_bridge_materializes_and_reads_it(
    tmp_path: Path, megatron_bridge: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recipe reading a local JSON file as a Hugging Face dataset: pack --recipe materializes it with
    Megatron-Bridge's own materialize_hf_dataset and packs where its builder (which resolves the same root) looks;
    the builder's prep skips the pack and the rule checks it, stale input included."""
    from mbridge_seqpack.artifact.builder_location import builder_location
    from mbridge_seqpack.cli.main import main
    from mbridge_seqpack.recipes.targets import build_launch
    from mbridge_seqpack.report import check

    source = tmp_path / "source.jsonl"
    source.write_text("".join((DATA / "training.jsonl").read_text().splitlines(keepends=True)[:30]))
    overrides = [f"++dataset.hf_dataset.load_kwargs.data_files={source}", f"dataset.hf_output_root={tmp_path / 'hf'}"]
    assert main(["pack", "--recipe", HF_RECIPE, *overrides, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["found_by_megatron_bridge"] is True
    cfg = build_launch(HF_RECIPE, overrides).cfg
    builder = _real_builder(cfg)
    train = Path(builder.train_path_packed)
    assert builder_location(cfg).split_path("training") == train and train.is_file()
    assert (tmp_path / "hf" / "training.jsonl").is_file()  # Megatron-Bridge's materialized copy, packed from
    written = train.stat().st_mtime_ns
    builder.prepare_data()
    assert train.stat().st_mtime_ns == written  # its prep found the pack
    assert [v.rule_id for v in check(cfg, world_size=8) if v.rule_id == "artifact.fingerprint_mismatch"] == []
    with (tmp_path / "hf" / "training.jsonl").open("a") as f:  # the materialized data changed since packing
        f.write((DATA / "training.jsonl").read_text().splitlines(keepends=True)[50])
    (v,) = [v for v in check(cfg, world_size=8) if v.rule_id == "artifact.fingerprint_mismatch"]
    assert v.rule.startswith(f"the pack was made from another training file than {tmp_path / 'hf' / 'training.jsonl'}")


def test_looking_up_a_hugging_face_datasets_cache_folder_neither_creates_nor_removes_one(megatron_bridge: Any) -> None:
    """Without hf_output_root the folder is in Megatron-Bridge's datasets cache, which its resolver creates. The
    config-time lookup names the same folder without creating it, and leaves an empty one alone: every rank checks
    at once, and the folder another rank's builder has just made is empty until its download starts (removing it
    made a concurrent check of the same config crash with FileNotFoundError)."""
    from megatron.bridge.data.builders.gpt_sft import resolve_gpt_sft_dataset_root

    from mbridge_seqpack.artifact.builder_location import builder_location, jsonl_root
    from mbridge_seqpack.recipes.targets import build_launch

    cfg = build_launch(HF_RECIPE, ["++dataset.hf_dataset.load_kwargs.data_files=/nowhere/never-made.jsonl"]).cfg
    location = builder_location(cfg)
    assert location is not None
    folder = location.directory.parent.parent  # <cache>/hf-sft-<adapter>-<digest>
    assert not folder.exists()
    try:
        assert Path(resolve_gpt_sft_dataset_root(cfg.dataset)) == folder == jsonl_root(cfg)  # the real one makes it
        assert folder.is_dir() and not any(folder.iterdir())
        assert jsonl_root(cfg) == folder and builder_location(cfg) == location
        assert folder.is_dir()  # another rank's folder: still there
    finally:
        folder.rmdir()
