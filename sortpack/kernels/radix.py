"""Sorting uint64 codes whose low bits already rise in input order (packed sample ids): a stable radix
sort on the bits above them, the compiled kernel, and ``np.sort`` as its fallback (the same result);
and the merge of sorted runs into memory the caller no longer needs (``merge_sorted_keys_into``,
``merge_with_own_run``)."""
from __future__ import annotations

import numpy as np

from ._loader import _c, _ptr, _scratch
from .merge import _runs


def sort_id_ordered(codes: np.ndarray, low_bits: int, high_bits: int, scratch: np.ndarray | None = None
                    ) -> np.ndarray:
    """Return ``codes`` sorted ascending, given that their low ``low_bits`` bits rise in input order.

    The codes of one rank's samples packed as ``key << low_bits | id``, ids numbered in input
    order, are sorted by their key alone with a stable radix sort (a few linear passes over
    ``high_bits``, the width of ``codes >> low_bits``) instead of a comparison sort: the ties'
    input order is their id order, so the result is ``np.sort(codes)``. Codes wider than
    ``low_bits + high_bits``, and the numpy fallback, sort with ``np.sort``.

    Without ``scratch``, ``codes`` (uint64, C-contiguous) is sorted in place and returned, as
    ``ndarray.sort`` would: the radix passes scatter through a scratch array of the same size
    that is freed on return. With ``scratch`` (uint64, C-contiguous, at least ``len(codes)``,
    not overlapping them) the passes scatter there and nothing is copied back: the result is
    either ``codes`` itself or ``scratch[:len(codes)]``, and the other one is free memory the
    caller may reuse (``codes`` is consumed either way).
    """
    codes = np.ascontiguousarray(codes, dtype=np.uint64).ravel()
    given = scratch is not None
    if scratch is not None and (len(scratch) < len(codes) or scratch.dtype != np.uint64
                                or not scratch.flags.c_contiguous):
        # refused whichever sort runs: a caller the fallback lets through fails only where the kernel is built
        raise ValueError("sort_id_ordered: scratch must be C-contiguous uint64 of at least len(codes)")
    lib = _c()
    if lib is None or not 0 <= low_bits <= 64 or not 0 <= high_bits <= 64 - low_bits:
        codes.sort()
        return codes
    out = np.empty_like(codes) if scratch is None else scratch[:len(codes)]
    counts = np.empty(max(int(lib.sp_radix_words(high_bits)), 1), np.int64)
    rc = lib.sp_radix_sort_high(_ptr(codes), len(codes), low_bits, high_bits, _ptr(out), _ptr(counts))
    if rc == 0:
        if given:
            return out
        codes[...] = out  # one copy back: the caller's array holds the result, the scratch goes
        return codes
    del out
    if rc == 1:
        return codes
    if rc == 2:  # a code above the bits said: nothing moved
        codes.sort()
        return codes
    raise ValueError(f"sort_id_ordered: bad arguments (low_bits={low_bits}, high_bits={high_bits})")


def merge_sorted_keys_into(keys: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Return the sorted uint64 runs ``keys[offsets[i]:offsets[i+1]]`` merged, written into ``out[:len(keys)]``.

    ``merge_sorted_keys`` into memory the caller is done with (the rank's codes once they are
    sent), where a new array would be pages the process touches for the first time. ``out``
    (uint64, C-contiguous, not overlapping ``keys``) must hold at least ``len(keys)`` codes;
    the result is its first ``len(keys)``, and always equals ``np.sort(keys)``.
    """
    keys, offsets, lib = _runs(keys, offsets)
    n = len(keys)
    if len(out) < n or out.dtype != np.uint64 or not out.flags.c_contiguous:
        raise ValueError("merge_sorted_keys_into: out must be C-contiguous uint64 of at least len(keys)")
    merged = out[:n]
    if lib is None:
        merged[...] = np.sort(keys, kind="stable")
        return merged
    k = len(offsets) - 1
    scratch = _scratch(lib.sp_merge_scratch_words(n, k, 0))
    rc = lib.sp_merge_keys_u64(_ptr(keys), _ptr(offsets), k, _ptr(merged), _ptr(scratch))
    if rc == -1:
        raise MemoryError("merge_sorted_keys_into")
    if rc != 0:
        merged[...] = np.sort(keys, kind="stable")
    return merged


def merge_with_own_run(received: np.ndarray, first_run: int, own: np.ndarray, own_first: bool) -> np.ndarray:
    """Return ``received`` (two sorted runs of uint64 codes, the first ``first_run`` long) merged in place.

    One of the two runs is this rank's own, which it still holds in ``own`` (the run it sent
    itself): ``own_first`` says it is the first run. The other run is read where it lies and the
    own run from ``own``, so the merge needs no memory beyond ``received``: a two-rank exchange
    whose received codes outnumber the rank's own merges without a new array. Equals
    ``np.sort(received)``.
    """
    received = np.ascontiguousarray(received, dtype=np.uint64)
    own = np.ascontiguousarray(own, dtype=np.uint64)
    na = int(first_run)
    nb = len(received) - na
    if not 0 <= na <= len(received) or len(own) != (na if own_first else nb):
        raise ValueError("merge_with_own_run: the own run's length does not match its place")
    lib = _c()
    if lib is None:
        # the own run's place may be unwritten (an exchange that skips its own block): fill it first
        if own_first:
            received[:na] = own
        else:
            received[na:] = own
        received.sort(kind="stable")
        return received
    rc = lib.sp_merge_two_in_place(_ptr(received), na, nb, _ptr(own), int(bool(own_first)))
    if rc != 0:
        raise ValueError("merge_with_own_run: bad run lengths")
    return received


def merge_runs_between(keys: np.ndarray, offsets: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (the sorted uint64 runs ``keys[offsets[i]:offsets[i+1]]`` merged, the buffer left free).

    The k-way merge as ceil(log2 k) passes of two-way merges of neighbouring runs that
    ping-pong between ``keys`` and ``other`` (uint64, C-contiguous, at least ``len(keys)``, not
    overlapping them), the two buffers the caller already holds: no scratch memory, where
    ``merge_sorted_keys`` needs two words per key for k >= 3. The merged codes are the first
    ``len(keys)`` of one buffer; the other (whole) is returned as free. Both are consumed.
    Always equals ``np.sort(keys)``.
    """
    keys, offsets, _ = _runs(keys, offsets)
    n = len(keys)
    if len(other) < n or other.dtype != np.uint64 or not other.flags.c_contiguous:
        raise ValueError("merge_runs_between: other must be C-contiguous uint64 of at least len(keys)")
    src, dst = keys, other[:n]
    bounds = [int(b) for b in offsets]
    while len(bounds) > 2:
        for i in range(0, len(bounds) - 1, 2):
            a, b = bounds[i], bounds[i + 1]
            if i + 2 < len(bounds):
                c = bounds[i + 2]
                merge_sorted_keys_into(src[a:c], np.array([0, b - a, c - a], np.int64), dst[a:c])
            else:  # the odd run out moves as it is
                dst[a:b] = src[a:b]
        bounds = bounds[::2] if (len(bounds) - 1) % 2 == 0 else bounds[::2] + [bounds[-1]]
        src, dst = dst, src
    if src.ctypes.data == keys.ctypes.data:
        return src, other
    return src, keys
