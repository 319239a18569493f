"""Sorting uint64 codes whose low bits already rise in input order (packed sample ids): a stable radix
sort on the bits above them, the compiled kernel, and ``np.sort`` as its fallback (the same result)."""
from __future__ import annotations

import numpy as np

from ._loader import _c, _ptr


def sort_id_ordered(codes: np.ndarray, low_bits: int, high_bits: int) -> np.ndarray:
    """Return ``codes`` sorted ascending, given that their low ``low_bits`` bits rise in input order.

    The codes of one rank's samples packed as ``key << low_bits | id``, ids numbered in input
    order, are sorted by their key alone with a stable radix sort (a few linear passes over
    ``high_bits``, the width of ``codes >> low_bits``) instead of a comparison sort: the ties'
    input order is their id order, so the result is ``np.sort(codes)``. ``codes`` (uint64,
    C-contiguous) is sorted in place and returned, as ``ndarray.sort`` would: the radix
    passes scatter through a scratch array of the same size that is freed on return, so the
    caller's next array of that size reuses its memory instead of new pages. Codes wider
    than ``low_bits + high_bits``, and the numpy fallback, sort with ``np.sort``.
    """
    codes = np.ascontiguousarray(codes, dtype=np.uint64).ravel()
    lib = _c()
    if lib is None or not 0 <= low_bits <= 64 or not 0 <= high_bits <= 64 - low_bits:
        codes.sort()
        return codes
    out = np.empty_like(codes)
    counts = np.empty(max(int(lib.sp_radix_words(high_bits)), 1), np.int64)
    rc = lib.sp_radix_sort_high(_ptr(codes), len(codes), low_bits, high_bits, _ptr(out), _ptr(counts))
    if rc == 0:
        codes[...] = out  # one copy back: the caller's array holds the result, the scratch goes
        return codes
    del out
    if rc == 1:
        return codes
    if rc == 2:  # a code above the bits said: nothing moved
        codes.sort()
        return codes
    raise ValueError(f"sort_id_ordered: bad arguments (low_bits={low_bits}, high_bits={high_bits})")
