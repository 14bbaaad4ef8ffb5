"""``pack --ray``'s shards of the input (no Ray needed: the driver cuts them before any worker starts)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mbridge_seqpack.packing.ray_engine import plan_shards


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
