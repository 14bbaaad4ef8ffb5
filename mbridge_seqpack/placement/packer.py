"""Bin packing of sequence lengths: best-fit decreasing (BFD).

Sequences are taken longest first (ties in a seeded order); each goes to the bin with the smallest
remaining space that holds it; bins with equal remaining space form a LIFO stack; a bin opens when none
fits. Two implementations place every sequence identically (tested):

- the C kernel (``bfd.c`` beside this module, built by the wheel's build hook, loaded with ctypes): a counting sort
  and a 64-ary bitset over remaining-space values, O(n + capacity), at most 8 bytes per sequence of work memory
  (4 for the order, 4 per bin); ``pack_lengths`` groups the sequences by length and shuffles each group in
  place (seeded: ``tie_order``), so no step reads or writes memory at random over all sequences but the
  bins' own assignment;
- the pure-Python path (no compiler, or ``MBRIDGE_SEQPACK_NATIVE=0``): every group of equal-length
  sequences is placed at once, with a Python big integer as the bitset of non-empty buckets; the work is
  proportional to the number of (length, bucket) groups.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from mbridge_seqpack.errors import UsageError

__all__ = [
    "pack_lengths",
    "PackingStats",
    "packing_stats",
    "ALGORITHMS",
    "OVERFLOW_POLICIES",
    "native_kernel",
    "NATIVE_ENV",
]

ALGORITHMS = ("best_fit_decreasing",)
OVERFLOW_POLICIES = ("error", "drop")


NATIVE_ENV = "MBRIDGE_SEQPACK_NATIVE"
#: built by hatch_build.py next to its source, ``bfd.c`` beside this module (in the wheel and the tree)
_KERNEL = Path(__file__).parent / "_bfd.so"


#: ``bfd_abi_version()`` of the kernel this module calls (2: ``relabel_all`` takes int32, skipped entries get -1)
KERNEL_ABI = 2


@functools.lru_cache(maxsize=None)
def _load_kernel(path: str) -> Any:
    lib = ctypes.CDLL(path)
    version = getattr(lib, "bfd_abi_version", None)
    if version is None:
        return None
    version.restype = ctypes.c_int64
    if version() != KERNEL_ABI:
        return None
    i64p = np.ctypeslib.ndpointer(dtype=np.int64, flags="C_CONTIGUOUS")
    i32p = np.ctypeslib.ndpointer(dtype=np.int32, flags="C_CONTIGUOUS")
    lib.bfd_pack_into.argtypes = [i64p, i32p, ctypes.c_int64, ctypes.c_int64, i64p, ctypes.c_int64, i64p]
    lib.bfd_pack_into.restype = ctypes.c_int64
    lib.bfd_pack_seeded.argtypes = [i64p, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint64, i64p]
    lib.bfd_pack_seeded.restype = ctypes.c_int64
    lib.relabel_all.argtypes = [i64p, ctypes.c_int64, i32p]
    lib.relabel_all.restype = None
    return lib


def native_kernel() -> Any:
    """The loaded C kernel, or None (not built, or ``MBRIDGE_SEQPACK_NATIVE=0``)."""
    if os.environ.get(NATIVE_ENV, "1") == "0" or not _KERNEL.exists():
        return None
    try:
        return _load_kernel(str(_KERNEL))  # None for a library of another version (a stale build)
    except OSError:
        return None


def _as_lengths(lengths: object) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise UsageError(f"lengths must be a 1-D sequence of token counts, got an array of shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise UsageError(f"lengths must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 1:
        bad = int(np.argmax(arr < 1))
        raise UsageError(f"lengths[{bad}] = {int(arr[bad])}: every sequence must have at least 1 token")
    return arr


def _best_fit_decreasing(
    counts: list[int], capacity: int, open_space: list[int] = []
) -> tuple[list[list[tuple[list[int], int]]], int]:
    """Place ``counts[L]`` items of each length L (largest first) into the open bins (``open_space[b]`` free
    tokens) and new ones. Returns per-length placements ``[(bin_ids, items_per_bin), ...]`` in placement
    order, and the number of bins."""
    buckets: list[list[int]] = [[] for _ in range(capacity + 1)]  # bin ids by remaining space
    occupied = 0  # bit r set <=> buckets[r] non-empty (r >= 1)
    for b, space in enumerate(open_space):
        if space:
            buckets[space].append(b)
            occupied |= 1 << space
    num_bins = len(open_space)
    placements: list[list[tuple[list[int], int]]] = [[] for _ in range(capacity + 1)]

    def put(ids: list[int], remaining: int) -> None:
        nonlocal occupied
        buckets[remaining].extend(ids)
        if remaining:
            occupied |= 1 << remaining

    for length in range(capacity, 0, -1):
        left = counts[length]
        if not left:
            continue
        placed = placements[length]
        while left:
            fits = occupied >> length
            if not fits:
                break
            space = length + ((fits & -fits).bit_length() - 1)  # smallest remaining space >= length
            bucket = buckets[space]
            per_bin = space // length  # a bin stays the best fit until it cannot take another
            whole = min(len(bucket), left // per_bin)
            if whole:
                # as one at a time: the top bin of the stack is filled first and pushed first
                moved = bucket[len(bucket) - whole :][::-1]
                del bucket[len(bucket) - whole :]
                put(moved, space - per_bin * length)
                placed.append((moved, per_bin))
                left -= whole * per_bin
            if left and bucket:  # fewer than per_bin items remain: they all go to one bin
                b = bucket.pop()
                put([b], space - left * length)
                placed.append(([b], left))
                left = 0
            if not bucket:
                occupied &= ~(1 << space)
        if left:
            per_bin = capacity // length
            whole, rest = divmod(left, per_bin)
            if whole:
                ids = list(range(num_bins, num_bins + whole))
                num_bins += whole
                put(ids, capacity - per_bin * length)
                placed.append((ids, per_bin))
            if rest:
                put([num_bins], capacity - rest * length)
                placed.append(([num_bins], rest))
                num_bins += 1
    return placements, num_bins


def pack_lengths(
    lengths: object,
    capacity: int,
    *,
    algorithm: Literal["best_fit_decreasing"] = "best_fit_decreasing",
    seed: int = 0,
    overflow: Literal["error", "drop"] = "error",
) -> np.ndarray:
    """Bin index of every sequence (int64 array aligned with ``lengths``).

    ``capacity`` is the pack size in tokens. Bin numbering and which of several equal-length sequences
    lands in which bin are shuffled by ``seed`` (deterministic for a seed), so packs are not ordered by
    fill. A sequence longer than ``capacity`` raises (``overflow="error"``) or gets bin ``-1``
    (``overflow="drop"``); it is never truncated.
    """
    if algorithm not in ALGORITHMS:
        raise UsageError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}")
    if overflow not in OVERFLOW_POLICIES:
        raise UsageError(f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}; got {overflow!r}")
    if not isinstance(capacity, (int, np.integer)) or isinstance(capacity, bool) or capacity < 1:
        raise UsageError(f"capacity must be a positive integer (tokens per pack), got {capacity!r}")
    capacity = int(capacity)
    arr = _as_lengths(lengths)
    n = arr.size
    if n == 0:
        return np.full(0, -1, dtype=np.int64)
    if int(arr.max()) > capacity:  # one reduction; the details only when some are too long
        too_long = arr > capacity
        first = int(np.argmax(too_long))
        if overflow == "error":
            raise UsageError(
                f"lengths[{first}] = {int(arr[first])} exceeds capacity {capacity} "
                f"({int(too_long.sum())} sequence(s) too long); raise the pack size, filter them out, or pass "
                f"overflow='drop'"
            )
    if n >= 2**31 - 1:
        raise UsageError(f"pack_lengths takes fewer than 2**31 sequences, got {n}")
    rng = np.random.default_rng(seed)
    tie_seed = int(rng.integers(0, 2**63))
    kernel = native_kernel()
    # the kernel writes every entry (-1 for a sequence left out); the Python path only the placed ones
    assignment = np.empty(n, dtype=np.int64) if kernel is not None else np.full(n, -1, dtype=np.int64)
    if kernel is not None:
        num_bins = int(kernel.bfd_pack_seeded(arr, n, capacity, tie_seed, assignment))
        if num_bins < 0:
            raise MemoryError(f"the packing kernel could not allocate its work arrays for {n} sequences")
    else:
        num_bins = _place_in_python(arr, tie_order(arr, capacity, tie_seed), capacity, assignment, [])
    relabel = rng.permutation(num_bins)  # bins numbered in a seeded order, so packs are not ordered by fill
    if kernel is not None:
        kernel.relabel_all(assignment, n, relabel.astype(np.int32))
    else:
        placed = assignment >= 0
        assignment[placed] = relabel[assignment[placed]]
    return assignment


_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def _mix64(z: int) -> int:
    """SplitMix64's finalizer (``mix64`` in native/bfd.c)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def tie_order(arr: np.ndarray, capacity: int, seed: int) -> np.ndarray:
    """The kept sequences (length <= ``capacity``) grouped by length, each group of equal lengths (in index order)
    shuffled by Fisher-Yates, position p swapped with ``mix64(seed + length * golden + p) % (p + 1)``: the order
    ``bfd_pack_seeded`` places in, here for the pure-Python path (int32). Shuffling within a group keeps each swap
    inside one small contiguous group, where shuffling all indices at once touched memory at random."""
    kept = np.flatnonzero(arr <= capacity)
    order = kept[np.argsort(arr[kept], kind="stable")].astype(np.int32)
    values, starts, counts = np.unique(arr[order], return_index=True, return_counts=True)
    for length, begin, size in zip(values.tolist(), starts.tolist(), counts.tolist()):
        if size < 2:
            continue
        group = order[begin : begin + size].tolist()
        base = (seed + length * _GOLDEN) & _MASK
        for p in range(size - 1, 0, -1):
            q = _mix64((base + p) & _MASK) % (p + 1)
            group[p], group[q] = group[q], group[p]
        order[begin : begin + size] = group
    return order


def place(
    arr: np.ndarray, seeded: np.ndarray, capacity: int, assignment: np.ndarray, open_space: np.ndarray | None = None
) -> int:
    """Best-fit decreasing of ``arr[seeded]`` (ties in ``seeded``'s order) into the bins ``open_space`` describes
    (free tokens of bins 0..k-1) and new ones; writes ``assignment[seeded]`` and returns the number of bins.
    The C kernel when built, else the pure-Python path: identical placements."""
    spaces = np.zeros(0, dtype=np.int64) if open_space is None else np.ascontiguousarray(open_space, dtype=np.int64)
    kernel = native_kernel()
    if kernel is not None:
        num_bins = int(
            kernel.bfd_pack_into(
                np.ascontiguousarray(arr, dtype=np.int64),
                np.ascontiguousarray(seeded, dtype=np.int32),
                seeded.size,
                capacity,
                assignment,
                spaces.size,
                spaces,
            )
        )
        if num_bins < 0:
            raise MemoryError(f"the packing kernel could not allocate its work arrays for {seeded.size} sequences")
        return num_bins
    return _place_in_python(arr, seeded, capacity, assignment, spaces.tolist())


def _place_in_python(
    arr: np.ndarray, shuffled: np.ndarray, capacity: int, assignment: np.ndarray, open_space: list[int]
) -> int:
    """The pure-Python path: bins for ``arr[shuffled]`` written into ``assignment``; returns the bin count."""
    counts = np.bincount(arr[shuffled], minlength=capacity + 1).tolist()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the loop allocates many small acyclic lists; collections would rescan the caller's heap
    try:
        placements, num_bins = _best_fit_decreasing(counts, capacity, open_space)
    finally:
        if gc_was_enabled:
            gc.enable()
    if not shuffled.size:
        return num_bins
    small = np.uint16 if capacity < 2**16 else np.uint32  # 16-bit keys get numpy's radix sort
    order = shuffled[np.argsort(arr[shuffled].astype(small), kind="stable")]  # ascending length, seeded ties
    bin_ids: list[int] = []
    repeats: list[int] = []
    for groups in placements:  # ascending length, matching ``order``
        for ids, per_bin in groups:
            bin_ids.extend(ids)
            repeats.extend([per_bin] * len(ids))
    assignment[order] = np.repeat(np.asarray(bin_ids, dtype=np.int64), np.asarray(repeats, dtype=np.int64))
    return num_bins


@dataclass(frozen=True)
class PackingStats:
    """How well a packing fills its bins, and how far it is from the best possible."""

    num_sequences: int
    num_dropped: int
    num_bins: int
    capacity: int
    total_tokens: int
    lower_bound: int
    max_sequences_per_bin: int
    min_bin_tokens: int
    sequences_per_bin_histogram: dict[int, int] = field(default_factory=dict)

    @property
    def efficiency(self) -> float:
        """Fraction of token slots holding real tokens (1.0 = no padding)."""
        return self.total_tokens / (self.num_bins * self.capacity) if self.num_bins else 0.0

    @property
    def gap_to_lower_bound(self) -> int:
        """Bins above ``ceil(total_tokens / capacity)``."""
        return self.num_bins - self.lower_bound

    def to_dict(self) -> dict[str, object]:
        return {
            "num_sequences": self.num_sequences,
            "num_dropped": self.num_dropped,
            "num_bins": self.num_bins,
            "capacity": self.capacity,
            "total_tokens": self.total_tokens,
            "lower_bound": self.lower_bound,
            "gap_to_lower_bound": self.gap_to_lower_bound,
            "efficiency": round(self.efficiency, 6),
            "max_sequences_per_bin": self.max_sequences_per_bin,
            "min_bin_tokens": self.min_bin_tokens,
            "sequences_per_bin_histogram": {str(k): v for k, v in self.sequences_per_bin_histogram.items()},
        }


def packing_stats(lengths: object, bins: np.ndarray, capacity: int) -> PackingStats:
    """Statistics of an assignment from :func:`pack_lengths` (bins ``-1`` are dropped sequences)."""
    arr = _as_lengths(lengths)
    bins = np.asarray(bins, dtype=np.int64)
    if bins.shape != arr.shape:
        raise UsageError(f"bins has shape {bins.shape}, lengths has shape {arr.shape}; they must match")
    placed = bins >= 0
    num_bins = int(bins.max()) + 1 if placed.any() else 0
    tokens = np.bincount(bins[placed], weights=arr[placed], minlength=num_bins).astype(np.int64)
    per_bin = np.bincount(bins[placed], minlength=num_bins)
    total = int(arr[placed].sum())
    hist_keys, hist_counts = np.unique(per_bin, return_counts=True) if num_bins else ([], [])
    return PackingStats(
        num_sequences=int(arr.size),
        num_dropped=int((~placed).sum()),
        num_bins=num_bins,
        capacity=int(capacity),
        total_tokens=total,
        lower_bound=-(-total // int(capacity)),
        max_sequences_per_bin=int(per_bin.max()) if num_bins else 0,
        min_bin_tokens=int(tokens.min()) if num_bins else 0,
        sequences_per_bin_histogram={int(k): int(v) for k, v in zip(hist_keys, hist_counts)},
    )
