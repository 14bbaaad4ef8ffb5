"""The bin packer: properties over random inputs, awkward capacities, policies, and Megatron-Bridge parity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mbridge_seqpack.placement import pack_lengths, packing_stats


def _check_valid(lengths: np.ndarray, bins: np.ndarray, capacity: int) -> None:
    assert bins.shape == lengths.shape and bins.dtype == np.int64
    assert (bins >= 0).all()  # every sequence in exactly one bin
    n_bins = int(bins.max()) + 1 if bins.size else 0
    used = np.bincount(bins, weights=lengths, minlength=n_bins)
    assert (used <= capacity).all()  # no bin over capacity
    assert (np.bincount(bins, minlength=n_bins) > 0).all()  # bin ids are dense
    assert n_bins >= -(-int(lengths.sum()) // capacity)  # never below the lower bound


@st.composite
def instances(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    capacity = draw(st.one_of(st.integers(1, 64), st.integers(1, 5000), st.sampled_from([8193, 16385, 24577])))
    lengths = draw(st.lists(st.integers(1, capacity), min_size=0, max_size=300))
    return np.asarray(lengths, dtype=np.int64), capacity


@settings(max_examples=300, deadline=None)
@given(instances(), st.integers(0, 2**32 - 1))
def test_properties(instance: tuple[np.ndarray, int], seed: int) -> None:
    lengths, capacity = instance
    bins = pack_lengths(lengths, capacity, seed=seed)
    _check_valid(lengths, bins, capacity)
    assert np.array_equal(bins, pack_lengths(lengths, capacity, seed=seed))  # deterministic per seed


@settings(max_examples=100, deadline=None)
@given(instances(), st.integers(0, 1000), st.integers(0, 1000))
def test_seed_changes_labels_not_quality(instance: tuple[np.ndarray, int], s1: int, s2: int) -> None:
    lengths, capacity = instance
    a, b = pack_lengths(lengths, capacity, seed=s1), pack_lengths(lengths, capacity, seed=s2)
    assert packing_stats(lengths, a, capacity).num_bins == packing_stats(lengths, b, capacity).num_bins


@pytest.mark.parametrize(
    ("lengths", "capacity", "bins"),
    [
        ([1, 1, 1], 1, 3),  # capacity 1
        ([5, 3, 2, 4, 6], 10, 2),  # exact fits: 6+4, 5+3+2
        ([7, 7, 7], 7, 3),  # capacity = max length
        ([8192, 1, 8191, 2], 8193, 2),  # 8192*n+1 capacities (TRL #3887)
        ([16384, 1, 8192, 8193], 16385, 2),
        ([3000] * 8 + [1] * 3, 24577, 1),
    ],
)
def test_awkward_capacities(lengths: list[int], capacity: int, bins: int) -> None:
    arr = np.asarray(lengths)
    result = pack_lengths(arr, capacity)
    _check_valid(arr, result, capacity)
    assert int(result.max()) + 1 == bins


def test_overflow_policies() -> None:
    lengths = np.array([10, 300, 20, 500])
    with pytest.raises(ValueError) as info:
        pack_lengths(lengths, 256)
    assert str(info.value) == (
        "lengths[1] = 300 exceeds capacity 256 (2 sequence(s) too long); raise the pack "
        "size, filter them out, or pass overflow='drop'"
    )
    bins = pack_lengths(lengths, 256, overflow="drop")
    assert bins.tolist()[1] == -1 and bins.tolist()[3] == -1
    assert bins[0] == bins[2] == 0
    stats = packing_stats(lengths, bins, 256)
    assert (stats.num_dropped, stats.num_bins, stats.total_tokens) == (2, 1, 30)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lengths": [3, 0, 2], "capacity": 8}, "lengths[1] = 0: every sequence must have at least 1 token"),
        (
            {"lengths": [[1, 2]], "capacity": 8},
            "lengths must be a 1-D sequence of token counts, got an array of shape (1, 2)",
        ),
        ({"lengths": [1.5], "capacity": 8}, "lengths must be integers, got dtype float64"),
        ({"lengths": [1], "capacity": 0}, "capacity must be a positive integer (tokens per pack), got 0"),
        (
            {"lengths": [1], "capacity": 8, "algorithm": "magic"},
            "algorithm must be one of best_fit_decreasing; got 'magic'",
        ),
        (
            {"lengths": [1], "capacity": 8, "overflow": "truncate"},
            "overflow must be one of error, drop; got 'truncate'",
        ),
    ],
)
def test_bad_inputs(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        pack_lengths(**kwargs)
    assert str(info.value) == message


def test_stats_and_lower_bound() -> None:
    lengths = np.array([6, 4, 5, 3, 2])
    bins = pack_lengths(lengths, 10)
    stats = packing_stats(lengths, bins, 10)
    assert stats.to_dict() == {
        "num_sequences": 5,
        "num_dropped": 0,
        "num_bins": 2,
        "capacity": 10,
        "total_tokens": 20,
        "lower_bound": 2,
        "gap_to_lower_bound": 0,
        "efficiency": 1.0,
        "max_sequences_per_bin": 3,
        "min_bin_tokens": 10,
        "sequences_per_bin_histogram": {"2": 1, "3": 1},
    }


def test_never_more_bins_than_megatron_bridge_ffd(megatron_bridge: object) -> None:
    """On seeded random instances and the benchmark's lognormal mix, bins <= Megatron-Bridge's FFD."""
    from megatron.bridge.data.packing.algorithms import first_fit_decreasing

    rng = np.random.default_rng(1234)
    for trial in range(600):
        capacity = int(rng.integers(2, 400))
        n = int(rng.integers(1, 400))
        if trial % 2:
            lengths = rng.integers(1, capacity + 1, n)
        else:
            lengths = np.clip(rng.lognormal(np.log(capacity / 5), 1.0, n).astype(np.int64), 1, capacity)
        ours = int(pack_lengths(lengths, capacity).max()) + 1
        assert ours <= len(first_fit_decreasing(lengths.tolist(), capacity)), (trial, capacity)
    lengths = np.clip(rng.lognormal(6, 1, 20000).astype(np.int64), 8, 4096)
    ours = int(pack_lengths(lengths, 4096).max()) + 1
    assert ours <= len(first_fit_decreasing(lengths.tolist(), 4096))


# ---- the C kernel and the pure-Python path ------------------------------------------------------------------


def _reference_bfd_bins(lengths: list[int], capacity: int) -> int:
    """Textbook best-fit decreasing, one item at a time over a sorted list of free spaces."""
    import bisect

    spaces: list[int] = []
    bins = 0
    for length in sorted(lengths, reverse=True):
        at = bisect.bisect_left(spaces, length)
        if at == len(spaces):
            bins, space = bins + 1, capacity
        else:
            space = spaces.pop(at)
        if space - length:
            bisect.insort(spaces, space - length)
    return bins


def test_the_c_kernel_is_built_and_loaded() -> None:
    from mbridge_seqpack.placement.packer import native_kernel

    assert native_kernel() is not None  # built by hatch_build.py when the project is installed


@settings(max_examples=300, deadline=None)
@given(instances(), st.integers(0, 2**32 - 1))
def test_c_kernel_and_python_path_place_identically(instance: tuple[np.ndarray, int], seed: int) -> None:
    """Packs must not depend on whether a compiler was there: same bins, sequence for sequence."""
    import os

    lengths, capacity = instance
    native = pack_lengths(lengths, capacity, seed=seed)
    os.environ["MBRIDGE_SEQPACK_NATIVE"] = "0"
    try:
        python = pack_lengths(lengths, capacity, seed=seed)
    finally:
        del os.environ["MBRIDGE_SEQPACK_NATIVE"]
    assert np.array_equal(native, python)
    assert (int(native.max()) + 1 if native.size else 0) == _reference_bfd_bins(lengths.tolist(), capacity)


@settings(max_examples=200, deadline=None)
@given(instances(), st.data())
def test_placing_into_open_bins_is_identical_in_c_and_python(
    instance: tuple[np.ndarray, int], data: st.DataObject
) -> None:
    import os

    from mbridge_seqpack.placement.packer import place

    lengths, capacity = instance
    spaces = np.asarray(data.draw(st.lists(st.integers(0, capacity), max_size=20)), dtype=np.int64)
    seeded = np.random.default_rng(0).permutation(lengths.size)
    results = []
    for native in ("1", "0"):
        os.environ["MBRIDGE_SEQPACK_NATIVE"] = native
        out = np.full(lengths.size, -1, dtype=np.int64)
        results.append((place(lengths, seeded, capacity, out, spaces), out))
    del os.environ["MBRIDGE_SEQPACK_NATIVE"]
    (count_c, bins_c), (count_py, bins_py) = results
    assert count_c == count_py and np.array_equal(bins_c, bins_py)
    used = np.bincount(bins_c, weights=lengths, minlength=count_c) if lengths.size else np.zeros(count_c)
    free = np.concatenate([spaces, np.full(count_c - spaces.size, capacity)])
    assert (used <= free).all()  # open bins keep their free space, new ones the capacity


def test_peak_memory_within_three_times_the_input() -> None:
    """10M lengths (80 MB of int64): the process's peak RSS growth during one call (high-water mark reset
    through /proc/self/clear_refs), the output array included."""
    import subprocess
    import sys

    code = """
import gc, numpy as np, sys
from mbridge_seqpack.placement import pack_lengths
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
lengths = np.random.default_rng(0).integers(1, 131073, 10_000_000)
pack_lengths(lengths[:1000], 131072)
gc.collect()
open("/proc/self/clear_refs", "w").write("5")  # reset the high-water mark to the current RSS
base = status("VmRSS:")
pack_lengths(lengths, 131072)
print((status("VmHWM:") - base) / lengths.nbytes)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout) <= 3.0, done.stdout


def test_a_kernel_library_of_another_version_is_not_loaded(tmp_path) -> None:
    """A stale ``_bfd.so`` (built from older sources, another calling convention) must not be called: the
    pure-Python path, which places identically, runs instead."""
    import shutil
    import subprocess

    from mbridge_seqpack.placement.packer import KERNEL_ABI, _load_kernel

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    for name, body in (
        ("old", "int64_t bfd_abi_version(void) { return 1; }"),
        ("none", "int64_t other(void) {return 0;}"),
    ):
        source = tmp_path / f"{name}.c"
        source.write_text(f"#include <stdint.h>\n{body}\n")
        subprocess.run([compiler, "-shared", "-fPIC", str(source), "-o", str(tmp_path / f"{name}.so")], check=True)
        assert _load_kernel(str(tmp_path / f"{name}.so")) is None
    assert KERNEL_ABI == 2
