"""Bin packing of samples into fixed-length rows by best-fit-decreasing, whole or by windows:
the compiled kernel, its numpy fallback, and the sequential reference they both reproduce."""
from __future__ import annotations

import operator
from bisect import bisect_left, insort
from typing import Any

import numpy as np

from ._loader import _c, _i64, _ptr, _scratch

# Samples per best-fit window. Fill is lost mostly to each window's last, partial row, so it
# grows with the rows a window makes. Log-normal sizes (median 300, max 8192), rows of 8192,
# 1M samples in random order: window 4096 -> 99.79%, 16384 -> 99.94%, 65536 -> 99.98%
# (~4000 rows a window), the whole set -> 99.998%; the time is flat (~17 ms) up to 2^18.
# 65536 leaves a wide margin over 99.7% for smaller or larger samples. Windows of a
# *size-sorted* order hold samples of nearly one size, which no window size fixes short of
# the whole set (95.8% at 65536 on the same data): pack windows of an order that mixes sizes.
DEFAULT_ROW_WINDOW = 65536
# The compiled kernel keeps two words and a bit per token of the row (its open rows bucketed by room left): past
# this row length, and past 4 words per sample, the reference packs instead (the same rows, memory by samples)
COMPILED_ROW_LEN = 1 << 22


def pack_rows_reference(sizes: Any, row_len: int, max_segments: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, row_splits) of best-fit-decreasing packing (the oracle; a Python loop).

    Samples are placed by size descending, ties by position; each goes into the open row
    with the least remaining room that still fits it (among equals, the row that was put
    back last), or opens a new row. A row closes at ``max_segments`` samples (0: never).
    Rows are returned in the order of the position of their first (largest) sample, and
    the samples of a row in position order: ``order[row_splits[r]:row_splits[r+1]]``.
    """
    sizes_l = [int(s) for s in _i64(sizes).ravel()]
    _check_rows(sizes_l, row_len, max_segments)
    n = len(sizes_l)
    caps: list[int] = []  # distinct remaining room values that have open rows, ascending
    stacks: dict[int, list[int]] = {}
    rem: list[int] = []
    seg: list[int] = []
    first: list[int] = []
    rowof = [0] * n
    for p in sorted(range(n), key=lambda p: (-sizes_l[p], p)):
        s = sizes_l[p]
        k = bisect_left(caps, s)
        if k < len(caps):
            c = caps[k]
            row = stacks[c].pop()
            if not stacks[c]:
                del stacks[c]
                del caps[k]
            rem[row] -= s
            seg[row] += 1
        else:
            row = len(rem)
            rem.append(row_len - s)
            seg.append(1)
            first.append(p)
        rowof[p] = row
        if max_segments <= 0 or seg[row] < max_segments:
            c = rem[row]
            if c in stacks:
                stacks[c].append(row)
            else:
                stacks[c] = [row]
                insort(caps, c)
    members: list[list[int]] = [[] for _ in rem]
    for p in range(n):
        members[rowof[p]].append(p)
    order: list[int] = []
    splits = [0]
    for row in sorted(range(len(rem)), key=first.__getitem__):
        order += members[row]
        splits.append(len(order))
    return np.asarray(order, dtype=np.int64), np.asarray(splits, dtype=np.int64)


def _check_rows(sizes: Any, row_len: int, max_segments: int) -> None:
    """Raise ValueError for a negative ``row_len`` or ``max_segments``, or a size outside [0, row_len]."""
    if row_len < 0:
        raise ValueError(f"row_len must be >= 0, got {row_len}")
    if max_segments < 0:
        raise ValueError(f"max_segments must be >= 0, got {max_segments}")
    arr = np.asarray(sizes, dtype=np.int64)
    bad = np.flatnonzero((arr < 0) | (arr > row_len))
    if bad.size:
        raise ValueError(f"sample {int(bad[0])} has size {int(arr[bad[0]])}, outside [0, {row_len}] "
                         "(remove or truncate samples longer than a row first)")


def pack_rows(sizes: Any, row_len: int, max_segments: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, row_splits) packing all samples into rows by best-fit-decreasing.

    Semantics and output order as ``pack_rows_reference``; ``order`` is a permutation of
    0..n-1, ``row_splits`` int64 ``[0, ..., n]``. ValueError if a size is outside
    [0, row_len]. O(n log row_len).
    """
    return pack_rows_windows(sizes, row_len, max_segments, window=0)


def pack_rows_windows(sizes: Any, row_len: int, max_segments: int = 0,
                      window: int = DEFAULT_ROW_WINDOW) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, row_splits) of ``pack_rows`` applied to each run of ``window`` samples.

    Windows are ``sizes[0:window]``, ``sizes[window:2*window]``, ...; their rows are
    concatenated and ``order`` holds global positions, so a row never mixes windows and the
    result for a window does not depend on the others (nor on how ranks split the data, as
    long as window boundaries are global).

    Parameters
    ----------
    sizes : array of int
        Sample sizes, each in [0, row_len] (ValueError otherwise).
    row_len : int
        The capacity of a row.
    max_segments : int
        A row holds at most this many samples when > 0.
    window : int
        Samples per window; ``window <= 0`` packs everything at once.

    Returns
    -------
    tuple of numpy.ndarray
        ``order`` (int64 global positions, row after row) and ``row_splits`` (int64
        ``[0, ..., n]``): row r is ``order[row_splits[r]:row_splits[r+1]]``.
    """
    row_len, max_segments, window = (operator.index(row_len), operator.index(max_segments),
                                     operator.index(window))
    sizes = _i64(sizes).ravel()
    n = len(sizes)
    row_len = _packing_row_len(sizes, row_len)
    lib = _c()
    if lib is None or row_len > max(COMPILED_ROW_LEN, 4 * n):
        return _pack_rows_fallback(sizes, row_len, max_segments, window)
    if row_len < 0 or max_segments < 0:
        _check_rows(sizes, row_len, max_segments)
    order = np.empty(n, dtype=np.int64)
    splits = np.empty(n + 1, dtype=np.int64)
    scratch = _scratch(lib.sp_pack_rows_scratch_words(n, row_len, window), np.int64)
    nrows = lib.sp_pack_rows(_ptr(sizes), n, row_len, max_segments, window, _ptr(order),
                             _ptr(splits), _ptr(scratch))
    if nrows < 0:
        _check_rows(sizes, row_len, max_segments)
        raise ValueError("pack_rows: invalid sizes")  # pragma: no cover - caught above
    return order, splits[:nrows + 1].copy()


def _packing_row_len(sizes: np.ndarray, row_len: int) -> int:
    """Return the row length that packs ``sizes`` as ``row_len`` does: at most their total.

    Rows of at least the total fit every sample into every open row, so best fit takes the
    fullest open row whatever their length: every such length gives the same rows. Sizes
    outside [0, row_len] keep ``row_len`` (the packers refuse them).
    """
    n = len(sizes)
    if not n or row_len <= 0:
        return row_len
    lo, hi = int(sizes.min()), int(sizes.max())
    if lo < 0 or hi > row_len or (hi and n > (2**63 - 1) // hi):  # refused, or a total that could overflow
        return row_len
    return min(row_len, int(sizes.sum()))


def _pack_rows_fallback(sizes: np.ndarray, row_len: int, max_segments: int,
                        window: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``pack_rows_windows`` computed by the reference, one window at a time."""
    _check_rows(sizes, row_len, max_segments)
    n = len(sizes)
    w = n if window <= 0 or window > n else window
    orders: list[np.ndarray] = []
    splits = [np.zeros(1, dtype=np.int64)]
    for w0 in range(0, n, max(w, 1)):
        o, s = pack_rows_reference(sizes[w0:w0 + w], row_len, max_segments)
        orders.append(o + w0)
        splits.append(s[1:] + w0)
    order = np.concatenate(orders) if orders else np.zeros(0, dtype=np.int64)
    return order, np.concatenate(splits)
