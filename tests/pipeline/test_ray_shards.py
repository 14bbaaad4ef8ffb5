"""``pack --ray``'s shards of the input (no Ray needed: the driver cuts them before any worker starts)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mbridge_seqpack.pipeline.ray_engine import plan_shards


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(st.text(alphabet="ab\u00e9", max_size=30), min_size=0, max_size=40),
    trailing=st.booleans(),
    shard_bytes=st.integers(1, 200),
)
def test_ray_shards_cut_the_file_at_line_ends_and_number_their_lines(tmp_path_factory, lines, trailing, shard_bytes):
    """``pack --ray``'s shards: consecutive, covering every byte, each ending at a line end (or the file's end),
    ``first_line`` the file's own number of their first line."""
    path = tmp_path_factory.mktemp("shards") / "in.jsonl"
    data = "\n".join(lines).encode() + (b"\n" if trailing and lines else b"")
    path.write_bytes(data)
    shards = plan_shards(path, shard_bytes)
    assert shards[0].start == 0 and shards[-1].end == len(data)
    assert [s.index for s in shards] == list(range(len(shards)))
    for before, after in zip(shards, shards[1:]):
        assert before.end == after.start and data[before.end - 1 : before.end] == b"\n"
        assert before.end - before.start >= shard_bytes
    for shard in shards:
        assert shard.first_line == data[: shard.start].count(b"\n") + 1


def test_a_file_that_shrank_after_it_was_cut_is_refused_by_the_worker(tmp_path) -> None:
    """A worker reads its shard's byte range; a file changed under the pack says so (as data, for the driver)."""
    from mbridge_seqpack.pipeline.ray_engine import ShardJob, tokenize_shard

    source = tmp_path / "in.jsonl"
    source.write_text('{"input": "a", "output": "b"}\n')
    job = ShardJob(str(source), str(tmp_path), 64, 1, {}, 0, True, str(tmp_path / "spill"), shown="in.jsonl")
    shard = {"index": 3, "start": 0, "end": 500, "first_line": 1}
    row = tokenize_shard(shard, job)  # the driver makes the spill root inside its staging directory; it is gone
    assert row["error"] == (
        f"{tmp_path / 'spill'}: the pack's staging directory is gone (its driver stopped or was killed); this "
        "shard is not written"
    )
    assert not (tmp_path / "spill").exists()  # a task that outlives its driver does not re-create it
    (tmp_path / "spill").mkdir()
    row = tokenize_shard(shard, job)
    assert row["error"] == "in.jsonl: shorter than when it was cut into shards (changed?); re-run pack"
    assert (row["index"], row["records"], row["sizes"]) == (3, 0, b"")


def test_truncated_spill_files_are_refused_when_rows_are_gathered(tmp_path) -> None:
    import numpy as np

    from mbridge_seqpack.pipeline.ray_engine import ShardedSequences
    from mbridge_seqpack.tokenization.sequences import InputError

    spill = tmp_path / "shard_000000" / "spill"
    spill.mkdir(parents=True)
    np.arange(10, dtype=np.int64).tofile(spill / "tokens.int64")
    np.ones(6, dtype=np.int8).tofile(spill / "loss_mask.int8")  # 4 short
    seqs = ShardedSequences(np.array([0, 4, 10]), [str(spill.parent)], np.array([0, 10]))
    ids, mask = seqs.gather(np.array([4, 0]), np.array([2, 4]))
    assert ids.tolist() == [4, 5, 0, 1, 2, 3] and mask.tolist() == [1] * 6
    with pytest.raises(InputError) as info:
        seqs.gather(np.array([4]), np.array([6]))
    assert str(info.value) == f"{spill.parent}: spilled tokens end early (truncated); re-run"


def test_the_shard_size_must_be_positive(capsys) -> None:
    from mbridge_seqpack.cli import main
    from mbridge_seqpack.pipeline.ray_engine import RayEngine
    from mbridge_seqpack.tokenization.sequences import InputError

    with pytest.raises(InputError) as info:
        RayEngine("local", shard_bytes=0)
    assert str(info.value) == "--ray-shard-mb must be positive, got 0"
    with pytest.raises(SystemExit) as stop:
        main(["pack", "--pack-size", "64", "--ray", "local", "--ray-shard-mb", "0"])
    assert stop.value.code == 2
    assert "argument --ray-shard-mb: expected a positive number, got 0" in capsys.readouterr().err
