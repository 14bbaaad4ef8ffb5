"""The public-report corpus (``tests/support/real_reports.py``): every traced failure is rejected by exactly the rules
named, every near-miss is accepted, nothing crashes, and ``docs/real-reports.md`` is generated from it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest

from mbridge_seqpack import check
from tests.support.real_reports import REPORTS, Report, render_markdown

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_docs_page_is_current() -> None:
    assert (ROOT / "docs" / "real-reports.md").read_text() == render_markdown()


@pytest.fixture(scope="module")
def pack_of(tmp_path_factory: pytest.TempPathFactory, megatron_bridge: Any) -> Callable[[int], list[str]]:
    """Overrides that point a config at a pack of the embedded training data made with ``pad_seq_to_mult``."""
    from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
    from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir

    made: dict[int, Path] = {}

    def overrides(mult: int) -> list[str]:
        if mult not in made:
            out = tmp_path_factory.mktemp(f"pack{mult}") / "p"
            pack_jsonl(
                {"training": embedded_data_dir() / "training.jsonl"},
                tokenizer=embedded_tokenizer_dir(),
                output_dir=out,
                options=PackOptions(pack_size=4096, pad_seq_to_mult=mult),
                overwrite=True,
            )
            made[mult] = out
        specs = "dataset.offline_packing_specs"
        return [  # a training-only pack: no validation split is prepared at launch into its metadata file
            f"{specs}.packed_train_data_path={made[mult] / 'training_4096.idx.parquet'}",
            f"{specs}.packed_metadata_path={made[mult] / '4096_metadata.jsonl'}",
            "dataset.do_validation=false",
        ]

    return overrides


@pytest.fixture(scope="module")
def val_pack_of(tmp_path_factory: pytest.TempPathFactory, megatron_bridge: Any) -> list[str]:
    """Overrides that point a config at a pack of the embedded training and validation data (pad_seq_to_mult 1)."""
    from tests.support.packs import small_validation_pack

    out = small_validation_pack(tmp_path_factory.mktemp("val_pack") / "p")
    specs = "dataset.offline_packing_specs"
    return [
        f"{specs}.packed_train_data_path={out / 'training_4096.idx.parquet'}",
        f"{specs}.packed_val_data_path={out / 'validation_4096.idx.parquet'}",
        f"{specs}.packed_metadata_path={out / '4096_metadata.jsonl'}",
    ]


@pytest.mark.parametrize(
    "report", REPORTS, ids=[f"{i:02d}-{'fails' if r.expected else 'works'}" for i, r in enumerate(REPORTS)]
)
def test_report(report: Report, request: pytest.FixtureRequest) -> None:
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    base = request.getfixturevalue(f"{report.base}_cfg")
    overrides = list(report.overrides)
    if report.pack_mult is not None:
        overrides += request.getfixturevalue("pack_of")(report.pack_mult)
    if report.val_pack:
        overrides += request.getfixturevalue("val_pack_of")
    cfg: Any = process_config_with_overrides(copy.deepcopy(base), cli_overrides=overrides)
    found = check(cfg, world_size=report.world)
    errors = sorted({v.rule_id for v in found if v.severity == "error"})
    assert errors == sorted(report.expected), report.title
    assert set(report.advisories) <= {v.rule_id for v in found if v.severity == "advisory"}, report.title
    if found:  # the message a launch prints fits 100 columns, every override whole on one line
        from mbridge_seqpack.errors import PackingConfigError

        lines = str(PackingConfigError(found)).splitlines()
        assert max(map(len, lines)) <= 100, max(lines, key=len)
        tokens = {token for line in lines for token in line.split()}
        assert all(o in tokens for v in found for o in v.overrides)
