"""The choice of padded lengths: the at most k lengths that minimise the padded total of a
size histogram, exactly (the compiled DP and its numpy fallback, with the same tie-breaking)."""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from ._loader import _c, _i64, _ptr


def _check_histogram(values: Any, counts: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return (values, counts) as int64, or raise ValueError for a histogram the DP cannot take."""
    values, counts = _i64(values).ravel(), _i64(counts).ravel()
    if len(values) != len(counts):
        raise ValueError("values and counts must have the same length")
    if len(values) and (values[0] < 1 or np.any(np.diff(values) <= 0) or counts.min() < 1):
        raise ValueError("values must be positive and strictly increasing, counts positive")
    if len(values) and int(values[-1]) * int(counts.sum()) >= 2**62:
        raise ValueError("padded token total does not fit 62 bits (largest value times sample count)")
    if len(values) >= 2**31 - 1:
        raise ValueError("too many distinct values (at most 2^31 - 2)")
    return values, counts


def optimal_lengths(values: Any, counts: Any, k: int) -> np.ndarray:
    """Return the at most ``k`` lengths that minimise the padded total of a size histogram.

    Each sample is padded to the smallest chosen length >= its size; the result minimises
    ``sum(counts * padded)`` exactly. Ties go to the leftmost split at every step of the
    DP, so the result is unique (C and numpy agree). Dynamic programming over the d
    distinct values with the divide-and-conquer optimisation (the cost is Monge):
    O(k d log d) time, 4 k d bytes for the splits.

    Parameters
    ----------
    values : array of int
        The distinct sizes, positive and strictly increasing.
    counts : array of int
        How many samples have each size, positive.
    k : int
        The most lengths to choose, >= 1.

    Returns
    -------
    numpy.ndarray
        int64 lengths, increasing, a subset of ``values``, always ending at ``values[-1]``.
    """
    k = operator.index(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    values, counts = _check_histogram(values, counts)
    d = len(values)
    if d == 0:
        return np.zeros(0, dtype=np.int64)
    if k >= d:
        return values.copy()
    prefix = np.concatenate(([0], np.cumsum(counts)))
    lib = _c()
    if lib is None:
        return _optimal_lengths_fallback(values, prefix, k)
    f, g = np.empty(d + 1, np.int64), np.empty(d + 1, np.int64)
    opt = np.empty((k - 1) * (d + 1), np.int32)
    out = np.empty(k, np.int64)
    n = lib.sp_optimal_lengths(_ptr(values), _ptr(prefix), d, k, _ptr(f), _ptr(g), _ptr(opt), _ptr(out))
    return out[:n].copy()


def _ol_layer_np(prev: np.ndarray, v: np.ndarray, C: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (cur, opt) of one DP layer for i in [lo, hi] (see ``sp_optimal_lengths``).

    The divide and conquer of the C kernel, one recursion level at a time: every node of a
    level (a range of i and the range its leftmost argmins lie in) is evaluated in one
    vectorised pass, so a level costs O(d) numpy work and there are O(log d) levels.
    """
    d = len(v)
    cur = np.zeros(d + 1, np.int64)
    opt = np.zeros(d + 1, np.int32)
    lo_, hi_ = np.array([lo], np.int64), np.array([hi], np.int64)
    olo, ohi = np.array([0], np.int64), np.array([d - 1], np.int64)
    while len(lo_):
        mid = lo_ + (hi_ - lo_) // 2
        width = np.minimum(mid - 1, ohi) - olo + 1
        starts = np.concatenate(([0], np.cumsum(width)[:-1]))
        node = np.repeat(np.arange(len(width)), width)
        j = np.arange(int(width.sum()), dtype=np.int64) - starts[node] + olo[node]
        m = mid[node]
        val = prev[j] + v[m - 1] * (C[m] - C[j])
        best = np.minimum.reduceat(val, starts)
        hit = np.flatnonzero(val == best[node])
        first = hit[np.concatenate(([True], node[hit][1:] != node[hit][:-1]))]
        arg = j[first]
        cur[mid], opt[mid] = best, arg
        left, right = lo_ <= mid - 1, mid + 1 <= hi_
        lo_, hi_, olo, ohi = (np.concatenate((lo_[left], mid[right] + 1)), np.concatenate((mid[left] - 1, hi_[right])),
                              np.concatenate((olo[left], arg[right])), np.concatenate((arg[left], ohi[right])))
    return cur, opt


def _optimal_lengths_fallback(v: np.ndarray, C: np.ndarray, k: int) -> np.ndarray:
    """Return ``optimal_lengths`` computed with numpy (same DP, same tie-breaking)."""
    d = len(v)
    f = np.concatenate(([0], v * C[1:]))
    opts = []
    for layer in range(2, k + 1):
        f, o = _ol_layer_np(f, v, C, 1 if layer < k else d, d)
        opts.append(o)
    out, i = [int(v[d - 1])], d
    for o in reversed(opts):
        i = int(o[i])
        if i == 0:
            break
        out.append(int(v[i - 1]))
    return np.asarray(out[::-1], dtype=np.int64)
