"""contract record/diff/bisect-run: one record of the installed Megatron-Bridge (module-scoped: the import costs
~35 s), its exit codes, a diff of hand-made records, and diffs of records of real Megatron-Bridge commits (parent and
child of three packing fixes, recorded with ``contract record --megatron-bridge``) that name the observation and the
values at the first difference."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from mbridge_seqpack.cli.main import main
from mbridge_seqpack.contract import bisect
from mbridge_seqpack.contract.observations import names
from tests.support.stderr_text import unwrap

FIXTURES = Path(__file__).resolve().parents[1] / "contract_fixtures"


def _pair(pr: str) -> tuple[str, str]:
    return str(next(FIXTURES.glob(f"{pr}_parent_*.json"))), str(next(FIXTURES.glob(f"{pr}_child_*.json")))


@pytest.mark.parametrize(
    "pr, observation, before, after",
    [
        ("pr3926", "step.get_batch.pp_stages", "before: null", "after:  [[11, 12, 13, 14, 21, 22"),
        ("pr4675", "collate.packed.mapped_padding", "before: 1", "after:  0"),
        ("pr5470", "collate.packed.mult1", "before: (absent)", "after:  [[false, false"),
    ],
)
def test_real_changes_are_named(pr: str, observation: str, before: str, after: str, capsys) -> None:
    a, b = _pair(pr)
    assert main(["contract", "diff", a, b]) == 1
    out = capsys.readouterr().out
    assert observation in out and before in out and after in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_a_record_against_itself_is_unchanged(capsys) -> None:
    a, _ = _pair("pr4675")
    assert main(["contract", "diff", a, a]) == 0


def test_not_a_record_is_a_usage_error(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert main(["contract", "diff", str(bad), str(bad)]) == 2
    assert "not a contract record" in unwrap(capsys.readouterr().err)


@pytest.fixture(scope="module")
def installed(tmp_path_factory, megatron_bridge) -> Path:
    """The one real record of this file: the installed Megatron-Bridge, through the CLI (its tests are slow: the
    fixture)."""
    out = tmp_path_factory.mktemp("contract") / "installed.json"
    assert main(["contract", "record", "--output", str(out)]) == 0
    return out


def test_the_installed_record_runs_every_observation(installed: Path) -> None:
    import importlib.metadata

    import mbridge_seqpack
    from mbridge_seqpack.contract.observations import VERSION
    from mbridge_seqpack.contract.record import FORMAT

    data = json.loads(installed.read_text())
    assert (data["format"], data["observations_version"], data["plugin_version"]) == (
        FORMAT,
        VERSION,
        mbridge_seqpack.__version__,
    )
    assert data["megatron_core"] == importlib.metadata.version("megatron-core")
    assert data["megatron_bridge"]["commit"] is None
    assert data["megatron_bridge"]["version"].startswith("0.6.2")
    assert "site-packages/megatron/bridge/__init__.py" in data["megatron_bridge"]["file"]
    assert data["megatron_bridge"]["checkout"] is None and data["only"] is None
    assert "megatron.bridge.data.packing.gpt_sft:GPTSFTPackedDataset" in data["megatron_bridge"]["resolved"]
    assert sorted(data["observations"]) == sorted(names())
    status = {n: o["status"] for n, o in data["observations"].items()}
    # TE's THD partition helper needs CUDA: not determined on a CPU, never "ok" there, never a failure
    assert status.pop("cp.partition_indices") in ("ok", "not_run")
    assert set(status.values()) == {"ok"}, status
    assert data["seconds"]["observations"] < 30


def test_the_installed_record_against_itself_is_empty(installed: Path, capsys) -> None:
    assert main(["contract", "diff", str(installed), str(installed)]) == 0
    assert capsys.readouterr().out.startswith("no change: every observation of both records is the same\n")


def _as_if_recorded(monkeypatch, data: dict[str, Any]) -> None:
    """bisect-run's record step answered by ``data`` (a second real record would cost another 40 s)."""

    def fake(checkout: Path | None, wanted: list[str]) -> dict[str, Any]:
        return {**data, "only": wanted, "observations": {n: data["observations"][n] for n in wanted}}

    monkeypatch.setattr(bisect, "record", fake)


def test_bisect_run_exits_0_unchanged_and_1_changed(installed: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    data = json.loads(installed.read_text())
    _as_if_recorded(monkeypatch, data)
    assert main(["contract", "bisect-run", "--against", str(installed)]) == 0
    # by default the outcomes decide; census.scan (the guards of the functions run) only when named
    assert "unchanged: collate.in_batch, collate.packed.mapped_padding," in unwrap(capsys.readouterr().err)
    assert main(["contract", "bisect-run", "--against", str(installed), "--only", "census.scan"]) == 0
    changed = copy.deepcopy(data)
    changed["observations"]["collate.packed.mult1"]["value"]["rows 0,1,2"]["cu_seqlens_q"][0][1] += 1
    good = tmp_path / "good.json"
    good.write_text(json.dumps(changed))
    assert main(["contract", "bisect-run", "--against", str(good), "--only", "collate.packed.mult1"]) == 1
    captured = capsys.readouterr()
    assert "changed: collate.packed.mult1" in captured.err
    assert "  at: cu_seqlens_q[0][1]\n" in captured.out
    # an observation not named with --only does not decide
    assert main(["contract", "bisect-run", "--against", str(good), "--only", "prep.pack"]) == 0


def test_bisect_run_skips_a_checkout_that_cannot_be_imported(tmp_path: Path, installed: Path, capsys) -> None:
    broken = tmp_path / "broken"
    (broken / "src" / "megatron" / "bridge").mkdir(parents=True)
    (broken / "src" / "megatron" / "bridge" / "__init__.py").write_text("raise ImportError('needs another mcore')\n")
    argv = ["contract", "bisect-run", "--against", str(installed), "--only", "prep.pack"]
    assert main([*argv, "--megatron-bridge", str(broken)]) == 125
    assert "megatron.bridge cannot be imported: ImportError: needs another mcore" in unwrap(capsys.readouterr().err)
    (tmp_path / "old").mkdir()  # a commit from before the src/megatron/bridge layout
    assert main([*argv, "--megatron-bridge", str(tmp_path / "old")]) == 125
    assert "has no src/megatron/bridge/__init__.py" in unwrap(capsys.readouterr().err)
    # `record` of such a checkout is a usage error, not a plugin bug
    assert main(["contract", "record", "--megatron-bridge", str(broken), "-o", str(tmp_path / "r.json")]) == 2
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["diff", "{installed}", "{bad}"], "bad.json: not a contract record (not JSON: "),
        (["diff", "{installed}", "{other}"], 'other.json: not a contract record (no "format"'),
        (["record", "-o", "{other}", "--megatron-bridge", "{tmp}"], "not a Megatron-Bridge repository root"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(argv, message, installed: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "bad.json").write_text("{bad")
    (tmp_path / "other.json").write_text('{"observations": {}}')
    where = {"missing": tmp_path / "missing.json", "bad": tmp_path / "bad.json", "other": tmp_path / "other.json"}
    argv = [a.format(installed=installed, tmp=tmp_path, **where) for a in argv]
    assert main(["contract", *argv]) == 2
    err = unwrap(capsys.readouterr().err)
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--against", "{missing}"], "missing.json: no such record; write one with"),
        (["--against", "{bad}"], "bad.json: not a contract record (not JSON: "),
        (["--against", "{installed}", "--only", "nosuch"], "--only nosuch: no such observation;"),
        (["--against", "{installed}", "--megatron-bridge", "{missing}"], "missing.json: no such folder"),
        (["--against", "{installed}", "--megatron-bridge"], "argument --megatron-bridge: expected one argument"),
        (["--agianst", "{installed}"], "the following arguments are required: --against"),
        (["--against", "{installed}", "--onyl", "x"], "unrecognized arguments: --onyl x"),
    ],
)
def test_kit_mistakes_under_bisect_run_abort_the_bisect(argv, message, installed: Path, tmp_path: Path, capsys):
    """git bisect run counts 1-127 but 125 as bad: a mistake of the kit exits 128, which aborts the bisect."""
    (tmp_path / "bad.json").write_text("{bad")
    where = {"missing": tmp_path / "missing.json", "bad": tmp_path / "bad.json"}
    argv = [a.format(installed=installed, **where) for a in argv]
    try:
        code = main(["contract", "bisect-run", *argv])
    except SystemExit as exc:  # argparse's own exit
        code = exc.code
    assert code == 128
    err = unwrap(capsys.readouterr().err)
    assert message in err and "(exit 128: git bisect run stops here)" in err and "Traceback" not in err


def _small(observations: dict[str, Any]) -> dict[str, Any]:
    return {"format": "mbridge-seqpack contract record", "observations_version": 1, "observations": observations}


def test_diff_of_hand_made_records(tmp_path: Path, capsys) -> None:
    def obs(value: Any, function: str = "megatron.bridge.data.packing.gpt_sft:GPTSFTPackedDataset.collate_fn"):
        return {"function": function, "inputs": "3 synthetic rows " + "in 20 " * 30, "status": "ok", "value": value}

    at = "megatron/bridge/training/gpt_step.py"
    guards = {"collate.x": {"raise::a::0": f"{at} get_batch: raise ValueError('x')"}}
    before = _small(
        {
            "collate.x": obs({"rows 0,1": {"tokens": [1, 2, 3, 4], "cu": [0, 4]}, "rows 2": {"tokens": [5]}}),
            "step.y": obs({"rows 0": list(range(200))}, "megatron.bridge.training.gpt_step:get_batch"),
            "same": obs({"a": 1}),
            "census.scan": obs(guards, "mbridge_seqpack.contract.guards:guards_of_source"),
            "validate.rule_cases": obs({"cp0": {"config": "world 8, cp 0", "verdict": "ok"}}),
        }
    )
    after = copy.deepcopy(before)
    after["observations"]["collate.x"]["value"]["rows 0,1"]["tokens"][2:] = [9, 8]  # first difference at tokens[2]
    after["observations"]["collate.x"]["value"]["rows 2"]["tokens"] = [6]
    after["observations"]["step.y"]["value"]["rows 0"] = list(range(1, 201))
    after["observations"]["census.scan"]["value"]["collate.x"] = {
        "raise::b::0": f"{at} get_batch: raise ValueError('y')",
        "assert::c::0": f"{at} _new: assert mask",
    }
    after["observations"]["validate.rule_cases"]["value"]["cp0"]["verdict"] = "ZeroDivisionError"
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(before))
    b.write_text(json.dumps(after))
    assert main(["contract", "diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert out.startswith("3 observations changed\n")
    collate = out[out.index("collate.x  (megatron.bridge.data.packing.gpt_sft:GPTSFTPackedDataset.collate_fn)") :]
    assert collate.split("\n\n")[0].splitlines()[-4:] == [
        "  input: rows 0,1",
        "  at: tokens[2]",
        "  before: 3",
        "  after:  9",
    ]
    assert "  at: [0]\n  before: 0\n  after:  1\n" in out  # step.y: the first element, not the whole list
    # the guards of the code the inputs ran are shown after the changes, not counted
    assert "\n\ncensus.scan: 2 guards of the code these inputs ran changed (shown, not counted: " in out
    assert f"  changed guard {at} get_batch: raise ValueError('x') -> raise\n      ValueError('y')\n" in out
    assert f"  added guard {at} _new: assert mask\n" in out
    assert "  cp0 (world 8, cp 0): ok -> ZeroDivisionError" in out
    assert "same" not in out.replace("the same", "")

    assert main(["contract", "diff", "--json", str(a), str(b)]) == 1
    got = json.loads(capsys.readouterr().out)
    assert got["changed"] is True and [c["observation"] for c in got["changes"]] == [
        "collate.x",
        "step.y",
        "validate.rule_cases",
    ]
    assert [c["observation"] for c in got["guards_not_counted"]] == ["census.scan"]
    first = got["changes"][0]
    assert (first["input"], first["position"], first["before"], first["after"]) == ("rows 0,1", "tokens[2]", 3, 9)
    assert main(["contract", "diff", "--json", str(a), str(a)]) == 0
    assert json.loads(capsys.readouterr().out)["changes"] == []


def _thd_expected(mult: int) -> dict[str, list[list[int]]]:
    """The packed collate of the observation's three synthetic rows, from the rows alone (THD as Transformer Engine
    documents it: each sequence trains on its tokens but the last, which is its label; offsets are cumulative
    lengths, padded offsets round each length up to ``mult``; position ids restart per sequence)."""
    from mbridge_seqpack.contract.observations import ROWS, WIDTH

    tokens, cu, cu_padded, positions = [], [], [], []
    for row in ROWS:
        flat: list[int] = []
        ends, padded_ends, pos = [0], [0], []
        for seq in row:
            length = len(seq) - 1
            padded = -(-length // mult) * mult
            flat += list(seq[:-1]) + [0] * (padded - length)  # the prep pads with EOS, here id 0
            ends.append(ends[-1] + length)
            padded_ends.append(padded_ends[-1] + padded)
            pos += list(range(padded))
        tokens.append(flat + [0] * (WIDTH - len(flat)))
        cu.append(ends)
        cu_padded.append(padded_ends)
        positions.append(pos + [0] * (WIDTH - len(pos)))
    return {"tokens": tokens, "cu": cu, "cu_padded": cu_padded, "position_ids": positions}


@pytest.mark.parametrize("mult", [1, 4])
def test_the_installed_records_collate_values_are_the_rows(installed: Path, mult: int) -> None:
    """The record's values, not only its header: the packed collate's tokens, position ids and sequence offsets of
    ``collate.packed.mult<M>`` are what the synthetic rows give by THD's own arithmetic (the record keeps what
    Megatron-Bridge returned, unchanged)."""
    value = json.loads(installed.read_text())["observations"][f"collate.packed.mult{mult}"]["value"]["rows 0,1,2"]
    expected = _thd_expected(mult)
    assert value["tokens"] == expected["tokens"]
    assert value["position_ids"] == expected["position_ids"]
    offsets = "cu_seqlens_q_padded" if mult > 1 else "cu_seqlens_q"
    want = expected["cu_padded"] if mult > 1 else expected["cu"]
    for row, ends in zip(value[offsets], want):  # each row's offsets, then its closing entries (the row's padding)
        assert row[: len(ends)] == ends
    if mult > 1:
        for row, ends in zip(value["cu_seqlens_q"], expected["cu"]):
            assert row[: len(ends)] == ends
