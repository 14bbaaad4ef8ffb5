"""``pack`` in bounded memory: tokens spill to disk and are written back one row group at a time, so the
peak memory of a pack does not grow with its tokens (only a few bytes per sequence)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mbridge_seqpack.artifact.row_tokens import gather_tokens
from mbridge_seqpack.artifact.store import RowSources, build_rows, column_checksums, write_split
from mbridge_seqpack.placement.packer import pack_lengths
from mbridge_seqpack.tokenization.sequences import TokenizedSequences


def _sequences(tmp_path: Path, n: int = 400, spilled: bool = True) -> TokenizedSequences:
    rng = np.random.default_rng(3)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(2, 600, n))]).astype(np.int64)
    tokens = rng.integers(0, 50_000, offsets[-1], dtype=np.int64)
    mask = rng.integers(0, 2, offsets[-1], dtype=np.int8)
    if not spilled:
        return TokenizedSequences(tokens, mask, offsets)
    tokens.tofile(tmp_path / "tokens.int64")
    mask.tofile(tmp_path / "loss_mask.int8")
    return TokenizedSequences(
        np.memmap(tmp_path / "tokens.int64", dtype=np.int64, mode="r"),
        np.memmap(tmp_path / "loss_mask.int8", dtype=np.int8, mode="r"),
        offsets,
    )


def test_gather_from_a_spill_file_equals_indexing_in_memory(tmp_path: Path) -> None:
    spilled, in_memory = _sequences(tmp_path), _sequences(tmp_path, spilled=False)
    picks = np.asarray([17, 3, 399, 3, 0])
    starts, sizes = spilled.offsets[picks], np.diff(spilled.offsets)[picks]
    ids, mask = gather_tokens(spilled, starts, sizes)
    expected = np.concatenate([in_memory.tokens[s : s + k] for s, k in zip(starts, sizes)])
    assert np.array_equal(ids, expected) and ids.dtype == np.int64
    assert np.array_equal(mask, np.concatenate([in_memory.loss_mask[s : s + k] for s, k in zip(starts, sizes)]))
    assert np.array_equal(gather_tokens(in_memory, starts, sizes)[0], expected)


def test_streamed_write_equals_the_whole_table(tmp_path: Path) -> None:
    """Row groups of 7 rows from the spill file: the same rows, the same sealed checksums as one table."""
    import pyarrow.parquet as pq

    seqs = _sequences(tmp_path)
    bins = pack_lengths(seqs.lengths, 1024, seed=0)
    whole = build_rows(_sequences(tmp_path, spilled=False), bins)
    sums = write_split(tmp_path / "t.idx.parquet", seqs, bins, {"x": 1}, row_group_size=7)
    written = pq.ParquetFile(str(tmp_path / "t.idx.parquet"))
    assert written.metadata.num_row_groups == -(-int(bins.max() + 1) // 7)
    table = written.read()
    assert sums["columns"] == column_checksums(whole) == column_checksums(table)
    for name, column in whole.items():
        assert table.column(name).to_pylist() == column.to_pylist(), name


def test_batches_respect_rows_and_tokens() -> None:
    seqs = TokenizedSequences(np.zeros(0, np.int64), np.zeros(0, np.int8), np.arange(0, 1001, 10, dtype=np.int64))
    layout = RowSources.of(seqs, np.repeat(np.arange(25), 4))  # 25 rows of 4 sequences (40 tokens)
    assert list(layout.batches(max_rows=10, max_tokens=100)) == [(k, k + 2) for k in range(0, 24, 2)] + [(24, 25)]
    assert list(layout.batches(max_rows=10, max_tokens=10)) == [(k, k + 1) for k in range(25)]  # one row at least
    assert list(layout.batches(max_rows=10)) == [(0, 10), (10, 20), (20, 25)]


CHILD = """
import gc, json, sys
from pathlib import Path
from mbridge_seqpack.pipeline.pack import PackOptions, pack_jsonl
from mbridge_seqpack.recipes.building_blocks import embedded_data_dir, embedded_tokenizer_dir

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

work = Path(sys.argv[1])
records = [json.loads(x) for x in (embedded_data_dir() / "training.jsonl").read_text().splitlines()]
# 8 records per line: ~700-token sequences, so the per-sequence bookkeeping is small next to the tokens
joined = [{key: " ".join(r[key] for r in records[i : i + 8]) for key in ("input", "output")}
          for i in range(0, len(records) - 7, 8)]
text = "".join(json.dumps(r) + "\\n" for r in joined)
out = {}
for name, copies in (("warm", 1), ("small", 8), ("large", 32)):
    src = work / f"{name}.jsonl"
    src.write_text(text * copies)
    gc.collect()
    open("/proc/self/clear_refs", "w").write("5")  # reset the high-water mark to the current RSS
    base = status("VmRSS:")
    result = pack_jsonl({"training": src}, tokenizer=embedded_tokenizer_dir(), output_dir=work / name,
                        options=PackOptions(pack_size=4096), overwrite=True, workers=1, lines_per_chunk=200)
    out[name] = {"peak": status("VmHWM:") - base, "tokens": result.splits["training"].stats["total_tokens"]}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_pack_peak_memory_does_not_grow_with_the_tokens(tmp_path: Path, megatron_bridge: object) -> None:
    """Packs of 1.3M and 5M tokens through Megatron-Bridge's tokenization: the larger one's peak memory is
    within 4 bytes per extra token of the smaller one's (measured: -2..+1; both peaks are ~45-65 MB of row-group
    buffers and one chunk of records). Holding the tokens, as before, took 9 bytes per token plus the copies
    of the whole table; Megatron-Bridge's own prep holds every record as Python lists."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    small, large = out["small"], out["large"]
    assert large["tokens"] > 3.5 * small["tokens"] > 4_000_000
    extra = (large["peak"] - small["peak"]) / (large["tokens"] - small["tokens"])
    assert extra <= 4.0, out
    assert not list(tmp_path.glob("large/.tokens-*"))  # the spill is gone from the artifact


def test_spill_failures_name_the_file_and_the_fix(tmp_path: Path) -> None:
    from mbridge_seqpack.tokenization.sequences import InputError, _TokenSink

    (tmp_path / "blocked" / "tokens.int64").mkdir(parents=True)  # a directory where the spill file goes
    with pytest.raises(InputError) as raised:
        _TokenSink(tmp_path / "blocked")
    assert str(raised.value) == (
        f"{tmp_path / 'blocked' / 'tokens.int64'}: cannot spill tokenized data (Is a directory); "
        "free space or choose another --output"
    )
    seqs = _sequences(tmp_path)
    with open(tmp_path / "tokens.int64", "r+b") as handle:
        handle.truncate(100 * 8)  # the spill lost its tail after it was mapped
    with pytest.raises(InputError) as raised:
        gather_tokens(seqs, seqs.offsets[[399]], np.diff(seqs.offsets)[[399]])
    assert str(raised.value) == f"{tmp_path / 'tokens.int64'}: spilled tokens end early (truncated); re-run pack"
