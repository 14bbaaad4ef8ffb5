"""One report from the library to the command line and the hook (``report/``, issue #51): ``check()``'s report,
``check --json`` and the hook's log carry the same verdicts for the same config, an assumed and a not-determined
one included; an ok that rests on an assumption is said as assumed, never as a plain ok."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
from typing import Any

import pytest

from mbridge_seqpack.cli.args import DEFAULT_RECIPE

#: CP=32 (more ranks than a CPU world forks: the equivalence check's CP part is not determined here) on 64 GPUs;
#: the attention verdict is computed off a GPU (cuDNN's own support query assumed); the rows are not aligned to
#: 2 x CP (an error)
OVERRIDES = [
    "model.context_parallel_size=32",
    "dataset.offline_packing_specs.pad_seq_to_mult=64",
    "model.calculate_per_token_loss=true",
    "ddp.average_in_collective=false",
]
WORLD = 64
EXPECTED = {
    "attention.backend_available": "assumed",
    "equivalence.labels": "undetermined",
    "offline.row_width_alignment": "violation",
}
MARKS = {"FAIL": "violation", "ADV ": "violation", "UND?": "undetermined"}


def _built() -> Any:
    from mbridge_seqpack.recipes.targets import build_launch

    return build_launch(DEFAULT_RECIPE, OVERRIDES, None, runner=False).cfg


def _not_plain(verdicts: list[dict[str, Any]]) -> dict[str, str]:
    return {v["rule_id"]: v["state"] for v in verdicts if v["state"] not in ("ok", "n/a")}


def _from_text(text: str) -> dict[str, str]:
    """The verdicts a report's text says: each rule listed with a mark, and the rules of the assumed section."""
    found = {m.group(2): MARKS[m.group(1)] for m in re.finditer(r"^  (FAIL|ADV |UND\?) (\S+)$", text, re.M)}
    lines = text.splitlines()
    if any(line.startswith("assumed, not computed here") for line in lines):
        at = next(i for i, line in enumerate(lines) if line.startswith("assumed, not computed here"))
        section = " ".join(line.strip() for line in lines[at + 1 :] if line.startswith("  "))
        for ids in re.findall(r"\(([a-z_]+\.[a-z_0-9]+(?:, [a-z_]+\.[a-z_0-9]+)*)\)", section):
            found.update({rule_id: "assumed" for rule_id in ids.split(", ")})
    return found


def test_library_command_line_and_hook_say_the_same_verdicts(
    megatron_bridge: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from megatron.bridge.training.config import runtime_config_update

    import mbridge_seqpack
    from mbridge_seqpack.cli.main import main

    report = mbridge_seqpack.check(_built(), world_size=WORLD)
    assert _not_plain(report.verdicts()) == EXPECTED
    assert [v.rule_id for v in report] == ["equivalence.labels", "offline.row_width_alignment"]
    assert report.assumed[0]["assumed"][0] == (
        "cuDNN's own support query (needs a GPU) accepts what TE's fixed FusedAttention rules pass"
    )

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["check", "--json", "--rules-only", "--world-size", str(WORLD), *OVERRIDES]) == 1
    shown = json.loads(out.getvalue())
    assert shown["verdicts"] == report.verdicts()
    assert shown["assumed"] == report.assumed

    cfg = _built()
    os.environ["WORLD_SIZE"] = str(WORLD)  # the conftest puts the environment back
    with mbridge_seqpack.install(mode="warn"), caplog.at_level(logging.INFO, logger="mbridge_seqpack"):
        with pytest.warns(mbridge_seqpack.PackingConfigWarning), contextlib.suppress(AssertionError, ValueError):
            runtime_config_update(cfg)  # Megatron-Bridge's own checks may refuse what the rules only warned of
    [logged] = [r.getMessage() for r in caplog.records if "checked the config inside validate()" in r.getMessage()]
    assert _from_text(logged) == EXPECTED == _from_text(report.to_text())
    assert report.count_line() in logged.splitlines()


def test_an_assumed_ok_is_counted_and_named_never_a_plain_ok(packed_cfg: Any) -> None:
    """Off a GPU, TE's backend selection runs with cuDNN's own support query taken as accepting: the rule that
    reads it holds only on that assumption, and the report says so in the result line, the count and a section
    naming the assumption with the rule."""
    import mbridge_seqpack

    report = mbridge_seqpack.check(packed_cfg, world_size=8)
    assert [(a["rule_id"], a["assumed"][0]) for a in report.assumed] == [
        (
            "attention.backend_available",
            "cuDNN's own support query (needs a GPU) accepts what TE's fixed FusedAttention rules pass",
        )
    ]
    text = report.to_text().splitlines()
    assert text[0].startswith("result: OK (") and text[0].endswith("1 assumed)")
    assert re.search(r"\b1 assumed\b", report.count_line())
    at = text.index(f"assumed, not computed here ({len(report.assumptions())}):")
    assert text[at + 1].startswith("  cuDNN's own support query (needs a GPU) accepts")
    assert "attention.backend_available" in " ".join(text[at + 1 :])


def test_on_the_device_nothing_is_assumed(megatron_bridge: Any) -> None:
    """Where CUDA is up in the checking process, TE's selection and cuDNN's query are the real ones: nothing is
    taken on trust (``Target.assumptions``)."""
    from mbridge_seqpack.analysis.te_attention import Target

    device = Target((9, 0), (9, 20, 0), "2.8.3", None, on_device=True)
    declared = Target((9, 0), (9, 20, 0), "2.8.3", None, arch_source="--gpu-arch h100")
    assert device.assumptions() == ()
    assert declared.assumptions() == (
        "cuDNN's own support query (needs a GPU) accepts what TE's fixed FusedAttention rules pass",
    )
    # an undeclared cuDNN is asked, not assumed: every version TE gates on (analysis/cudnn_gates.py)
    undeclared = Target((9, 0), (9, 20, 0), "2.8.3", None, cudnn_declared=False)
    assert undeclared.assumptions() == declared.assumptions()


def test_the_report_iterates_as_the_violations_did(packed_cfg: Any) -> None:
    """``check()`` returned a list of violations: the report iterates, indexes and counts them the same way."""
    import mbridge_seqpack
    from mbridge_seqpack.config_paths import set_path

    set_path(packed_cfg, "model.context_parallel_size", 2)  # rows not aligned to 2 x CP
    report = mbridge_seqpack.check(packed_cfg, world_size=8)
    assert len(report) == len(report.violations) > 0
    assert list(report) == report.violations and report[0] is report.violations[0]
    [first, *_] = report
    assert first.rule_id == report.violations[0].rule_id


def test_the_packs_are_planned_on_rank_zero_only(packed_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook checks on every rank of a job and only rank 0 logs the report: the other ranks do not read the
    packs' seals for its contents line (the launch guard, too, plans them on rank 0 alone)."""
    import mbridge_seqpack

    assert mbridge_seqpack.check(packed_cfg, world_size=8).contents is not None
    monkeypatch.setenv("RANK", "5")
    assert mbridge_seqpack.check(packed_cfg, world_size=8).contents is None


def test_an_unset_global_batch_is_reported_never_a_crash(packed_cfg: Any) -> None:
    """``train.global_batch_size=None`` (Megatron-Bridge's own validate() asserts on it later): the report's layout
    says the token slots are not known; computing them crashed inside the hook (found by the never-crash property
    test)."""
    from mbridge_seqpack.report import check

    packed_cfg.train.global_batch_size = None
    report = check(packed_cfg, world_size=8)
    assert report.derived["token_slots_per_step"] is None and report.derived["global_batch_size"] is None
    assert "  batch    micro 1, global None, token slots per step not known" in report.to_text().splitlines()
