"""Merging of sorted runs of uint64 keys (single keys and (hi, lo) pairs): the compiled
kernels and their numpy fallback, a stable argsort or lexsort with the same result."""
from __future__ import annotations

from typing import Any

import numpy as np

from ._loader import _c, _i64, _ptr, _scratch


def _check_offsets(offsets: Any, n: int) -> np.ndarray:
    """Return the run offsets as int64, or raise ValueError unless they rise from 0 to ``n``."""
    offsets = _i64(offsets).ravel()
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
        raise ValueError(f"offsets must rise from 0 to {n} (the number of keys)")
    return offsets


def _runs(keys: np.ndarray, offsets: np.ndarray):
    """Return (contiguous uint64 keys, checked int64 offsets, the compiled library or None)."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64).ravel()
    return keys, _check_offsets(offsets, len(keys)), _c()


def merge_sorted_runs(keys: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (merged keys, permutation) of sorted uint64 runs ``keys[offsets[i]:offsets[i+1]]``.

    ``merged == keys[perm]``; equal keys keep run order. The result always equals
    ``np.argsort(keys, kind="stable")``: runs found unsorted are sorted that way instead.
    C: one branchless two-way merge for k <= 2; for k >= 3, ceil(log2 k) such passes over
    neighbouring runs, with a temporary copy of keys and positions (2n words).

    Parameters
    ----------
    keys : array of uint64
        The runs, one after another.
    offsets : array of int
        ``k + 1`` offsets rising from 0 to ``len(keys)``.

    Returns
    -------
    tuple of numpy.ndarray
        The merged keys (uint64) and the int64 permutation that gives them.
    """
    keys, offsets, lib = _runs(keys, offsets)
    if lib is None:
        perm = np.argsort(keys, kind="stable")
        return keys[perm], perm
    merged = np.empty(len(keys), dtype=np.uint64)
    perm = np.empty(len(keys), dtype=np.int64)
    k = len(offsets) - 1
    scratch = _scratch(lib.sp_merge_scratch_words(len(keys), k, 0))
    rc = lib.sp_merge_runs_u64(_ptr(keys), _ptr(offsets), k, _ptr(merged), _ptr(perm), _ptr(scratch))
    if rc == -1:
        raise MemoryError("merge_sorted_runs")
    if rc != 0:
        perm = np.argsort(keys, kind="stable")
        return keys[perm], perm
    return merged, perm


def merge_sorted_keys(keys: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Return the sorted uint64 runs ``keys[offsets[i]:offsets[i+1]]`` merged into one sorted array.

    ``merge_sorted_runs`` without the permutation: half the writes, for keys that carry
    nothing along. Always equals ``np.sort(keys)``: runs found unsorted are sorted instead.
    ``keys`` and ``offsets`` as in ``merge_sorted_runs``; the result is a new uint64 array.
    """
    keys, offsets, lib = _runs(keys, offsets)
    if lib is None:
        return np.sort(keys, kind="stable")
    merged = np.empty(len(keys), dtype=np.uint64)
    k = len(offsets) - 1
    scratch = _scratch(lib.sp_merge_scratch_words(len(keys), k, 0))
    rc = lib.sp_merge_keys_u64(_ptr(keys), _ptr(offsets), k, _ptr(merged), _ptr(scratch))
    if rc == -1:
        raise MemoryError("merge_sorted_keys")
    if rc != 0:
        return np.sort(keys, kind="stable")
    return merged


def merge_sorted_runs2(hi: np.ndarray, lo: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Return the permutation merging runs sorted by the pair (hi, lo) of uint64 arrays.

    Stable by run on equal pairs; always equals ``np.lexsort((lo, hi))``. For k >= 3 the
    C passes need temporaries of 5n words (hi, lo and positions, ping-pong).

    Parameters
    ----------
    hi, lo : array of uint64
        The first and second key of each pair, the same length.
    offsets : array of int
        ``k + 1`` offsets rising from 0 to ``len(hi)``.

    Returns
    -------
    numpy.ndarray
        The int64 permutation that sorts the pairs.
    """
    hi = np.ascontiguousarray(hi, dtype=np.uint64).ravel()
    lo = np.ascontiguousarray(lo, dtype=np.uint64).ravel()
    if len(hi) != len(lo):
        raise ValueError("hi and lo must have the same length")
    offsets = _check_offsets(offsets, len(hi))
    lib = _c()
    if lib is None:
        return np.lexsort((lo, hi))
    perm = np.empty(len(hi), dtype=np.int64)
    k = len(offsets) - 1
    scratch = _scratch(lib.sp_merge_scratch_words(len(hi), k, 1))
    rc = lib.sp_merge_runs_pair(_ptr(hi), _ptr(lo), _ptr(offsets), k, _ptr(perm), _ptr(scratch))
    if rc == -1:
        raise MemoryError("merge_sorted_runs2")
    if rc != 0:
        return np.lexsort((lo, hi))
    return perm
