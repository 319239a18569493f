"""Numeric kernels: greedy packing, merging of sorted runs, bin packing into rows, and the
choice of padded lengths.

The public functions here are the contract the stages use. They run the compiled C
kernels (``_ckernels``, built by ``pip install``; called through ctypes, with the GIL
released) when present, and otherwise fall back, after one warning, to the numpy and
pure-Python implementations below, which give identical results, more slowly.
Set ``SORTPACK_NO_CKERNELS=1`` to force the fallback. ``backend()`` says which is in use.

About 700 lines on purpose: each kernel's ctypes binding sits beside its numpy fallback, so
the two implementations that must agree bit for bit are read together.
"""
from __future__ import annotations

import ctypes
import importlib.util
import math
import operator
import os
import sys
import warnings
from bisect import bisect_left, insort

import numpy as np

BUDGETS = ("padded", "tokens", "quadratic")


def round_lengths(lengths: np.ndarray, pad_multiple: int = 0, shapes: np.ndarray | None = None) -> np.ndarray:
    """Return lengths rounded up to a multiple of ``pad_multiple`` or to the next of ``shapes``.

    With ``shapes``, a length above the largest shape maps to -1 (an oversize sample).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if shapes is not None and len(shapes):
        shapes = np.asarray(shapes, dtype=np.int64)
        pos = np.searchsorted(shapes, lengths, side="left")
        out = np.full(lengths.shape, -1, dtype=np.int64)
        ok = pos < len(shapes)
        out[ok] = shapes[pos[ok]]
        return out
    if pad_multiple and pad_multiple > 1:
        return -(-lengths // pad_multiple) * pad_multiple
    return lengths.copy()


def sample_cost(lengths: np.ndarray, budget: str, quadratic_scale: float) -> np.ndarray:
    """Return each sample's cost under ``budget`` when alone in a micro-batch."""
    lengths = np.asarray(lengths, dtype=np.float64 if budget == "quadratic" else np.int64)
    if budget == "quadratic":
        return lengths + lengths * lengths / quadratic_scale
    return lengths


def greedy_pack_reference(sizes, max_tokens, budget="padded", max_samples=0, batch_multiple=1,
                          quadratic_scale=1.0, pad_multiple=0, shapes=None) -> np.ndarray:
    """Return micro-batch boundaries of the sequential greedy (the oracle; a Python loop).

    A sample joins the current micro-batch iff afterwards the budget holds and the count is
    at most ``max_samples`` (when > 0). Cost of a micro-batch of ``c`` samples whose largest
    rounded length is ``L``: padded ``c*L``; tokens ``sum(s)`` (``c*L`` when rounding);
    quadratic ``sum(s + s*s/Q)`` (``c*(L + L*L/Q)`` when rounding). When a micro-batch closes
    with ``batch_multiple`` M > 1, it keeps the largest multiple of M of its samples (all
    when fewer than M) and the rest open the next one, which the sample is tested against.
    Returns int64 ``[0, b1, ..., n]``: micro-batch i is ``sizes[b[i]:b[i+1]]``.
    """
    sizes = [int(s) for s in np.asarray(sizes, dtype=np.int64)]
    rounding = bool(pad_multiple and pad_multiple > 1) or (shapes is not None and len(shapes) > 0)
    shape_list = [int(x) for x in shapes] if shapes is not None else []

    def rnd(x):
        if shape_list:
            for s in shape_list:
                if s >= x:
                    return s
            return x
        if pad_multiple and pad_multiple > 1:
            return -(-x // pad_multiple) * pad_multiple
        return x

    def cost(batch):
        c = len(batch)
        if c == 0:
            return 0
        L = rnd(max(batch))
        if budget == "padded" or rounding:
            if budget == "quadratic":
                return c * (L + L * L / quadratic_scale)
            return c * L
        if budget == "tokens":
            return sum(batch)
        # plain left-to-right addition, not sum(): sum() is compensated from Python 3.12
        # on, and micro-batch boundaries must not depend on the interpreter
        total = 0.0
        for s in batch:
            total += s + s * s / quadratic_scale
        return total

    bounds = [0]
    start = 0
    batch: list[int] = []
    for _i, s in enumerate(sizes):
        while batch:
            trial = batch + [s]
            if cost(trial) <= max_tokens and (max_samples <= 0 or len(trial) <= max_samples):
                break
            c = len(batch)
            keep = c if c < batch_multiple else batch_multiple * (c // batch_multiple)
            start += keep
            bounds.append(start)
            batch = batch[keep:]
        batch.append(s)
    if batch:
        bounds.append(len(sizes))
    return np.asarray(bounds, dtype=np.int64)


# --------------------------------------------------------------------------------------
# loading the compiled kernels

_ABI_VERSION = 8  # must equal SP_ABI_VERSION in _ckernels.c
_UNLOADED = object()
_clib = _UNLOADED
_fallback_reason = ""
_warned = False

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_SIGNATURES = {
    "sp_abi_version": ([], _I64),
    "sp_greedy_pack": ([_PTR, _I64, _I64, _I64, ctypes.c_double, _I64, _I64,
                        ctypes.c_double, _I64, _PTR, _I64, _PTR], _I64),
    "sp_merge_scratch_words": ([_I64, _I64, _I64], _I64),
    "sp_merge_runs_u64": ([_PTR, _PTR, _I64, _PTR, _PTR, _PTR], _I64),
    "sp_merge_runs_pair": ([_PTR, _PTR, _PTR, _I64, _PTR, _PTR], _I64),
    "sp_pack_rows_scratch_words": ([_I64, _I64, _I64], _I64),
    "sp_pack_rows": ([_PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR], _I64),
    "sp_optimal_lengths": ([_PTR, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _PTR], _I64),
    "sp_gather_bytes": ([_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _PTR], _I64),
}


def _load_clib():
    """Return the ctypes handle of the compiled kernels, or None with the reason recorded."""
    global _fallback_reason
    if os.environ.get("SORTPACK_NO_CKERNELS", "") not in ("", "0"):
        _fallback_reason = "SORTPACK_NO_CKERNELS is set"
        return None
    try:
        spec = importlib.util.find_spec(__name__ + "._ckernels")
    except (ImportError, ValueError) as exc:
        spec = None
        _fallback_reason = f"cannot locate _ckernels ({exc})"
    if spec is None or not spec.origin:
        _fallback_reason = _fallback_reason or "the _ckernels extension was not built"
        return None
    try:
        lib = ctypes.CDLL(spec.origin)
        for name, (args, res) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
    except (OSError, AttributeError) as exc:
        _fallback_reason = f"cannot load {spec.origin} ({exc})"
        return None
    if lib.sp_abi_version() != _ABI_VERSION:
        # an in-place build left over from another checkout: calling it would be unsafe
        _fallback_reason = f"{spec.origin} is stale (ABI {lib.sp_abi_version()}, want {_ABI_VERSION})"
        return None
    return lib


def _c():
    """Return the compiled library, or None (after warning once) when it is unavailable."""
    global _clib, _warned
    if _clib is _UNLOADED:
        _clib = _load_clib()
    if _clib is None and not _warned:
        _warned = True
        warnings.warn(f"sortpack.kernels: compiled kernels unavailable ({_fallback_reason}); "
                      "using the slower numpy fallback", RuntimeWarning, stacklevel=3)
    return _clib


def backend() -> str:
    """Return ``"c"`` when the compiled kernels are in use, else ``"numpy"``."""
    global _clib
    if _clib is _UNLOADED:
        _clib = _load_clib()
    return "numpy" if _clib is None else "c"


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


def _scratch(words: int, dtype=np.uint64) -> np.ndarray:
    """Return uninitialised scratch memory for a C kernel.

    Allocated by numpy rather than malloc: numpy asks for transparent huge pages on large
    arrays, and first-touch faults of small pages can cost as much as the kernel itself.
    """
    return np.empty(max(int(words), 1), dtype=dtype)


# --------------------------------------------------------------------------------------
# greedy packing

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _limits(max_tokens) -> tuple[int, float]:
    """Return (int limit, float limit) such that cost <= max_tokens exactly as Python compares.

    An int cost fits iff it is <= floor(max_tokens); a float cost iff it is <= the largest
    double not above max_tokens (Python compares int and float exactly, without rounding).
    """
    if isinstance(max_tokens, (float, np.floating)):
        d = float(max_tokens)
        if math.isnan(d):
            return _INT64_MIN, d
        li = _INT64_MAX if d >= 2.0**63 else _INT64_MIN if d < -(2.0**63) else math.floor(d)
        return li, d
    m = operator.index(max_tokens)
    li = min(max(m, _INT64_MIN), _INT64_MAX)
    try:
        d = float(m)
    except OverflowError:
        return li, (sys.float_info.max if m > 0 else -math.inf)
    if d > m:
        d = math.nextafter(d, -math.inf)
    return li, d


def _shape_records(shapes) -> np.ndarray | None:
    """Return the shapes the reference's rounding can pick, increasing, or None for no shapes.

    The reference rounds x to the first shape >= x in list order. That shape is larger than
    every shape before it, so only prefix-maximum records can be picked, and the first one
    >= x is the smallest record >= x: rounding is a monotone lookup in the records.
    """
    if shapes is None or len(shapes) == 0:
        return None
    vals = [int(x) for x in shapes]
    rec, best = [], None
    for v in vals:
        if best is None or v > best:
            rec.append(v)
            best = v
    return np.asarray(rec, dtype=np.int64)


def _pack_args(max_tokens, budget, max_samples, batch_multiple, quadratic_scale, pad_multiple,
               shapes) -> dict:
    """Validate the options of greedy_pack; return them normalised."""
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; expected one of {', '.join(BUDGETS)}")
    max_samples = 0 if max_samples is None else operator.index(max_samples)
    batch_multiple = 1 if batch_multiple is None else operator.index(batch_multiple)
    if batch_multiple < 1:
        raise ValueError(f"batch_multiple must be >= 1, got {batch_multiple}")
    pad = 0 if not pad_multiple else int(pad_multiple)
    if pad != (pad_multiple or 0):
        raise ValueError(f"pad_multiple must be an integer, got {pad_multiple!r}")
    q = float(quadratic_scale)
    if budget == "quadratic" and not (q > 0 and math.isfinite(q)):
        raise ValueError(f"quadratic_scale must be positive and finite, got {quadratic_scale!r}")
    lim_i, lim_d = _limits(max_tokens)
    rec = _shape_records(shapes)
    return dict(budget=budget, lim_i=lim_i, lim_d=lim_d, max_samples=max_samples,
                multiple=batch_multiple, q=q, pad=pad if pad > 1 else 0, records=rec,
                rounding=rec is not None or pad > 1)


def greedy_pack(sizes, max_tokens, budget="padded", max_samples=0, batch_multiple=1,
                quadratic_scale=1.0, pad_multiple=0, shapes=None) -> np.ndarray:
    """Return micro-batch boundaries of the sequential greedy (see ``greedy_pack_reference``).

    Identical to the reference for every option; sizes must be non-negative (ValueError).
    """
    a = _pack_args(max_tokens, budget, max_samples, batch_multiple, quadratic_scale,
                   pad_multiple, shapes)
    sizes = _i64(sizes).ravel()
    lib = _c()
    if lib is None:
        return _greedy_pack_fallback(sizes, a)
    n = len(sizes)
    # n + 1 is the worst case (all singletons); untouched pages of np.empty cost nothing
    out = np.empty(n + 1, dtype=np.int64)
    rec = a["records"] if a["records"] is not None else np.zeros(1, dtype=np.int64)
    nb = lib.sp_greedy_pack(_ptr(sizes), n, BUDGETS.index(a["budget"]),
                            a["lim_i"], a["lim_d"], a["max_samples"], a["multiple"], a["q"],
                            a["pad"], _ptr(rec), 0 if a["records"] is None else len(rec),
                            _ptr(out))
    if nb < 0:
        raise ValueError("greedy_pack: sizes must be non-negative")
    return out[:nb].copy()


def _round_np(x: np.ndarray, a: dict) -> np.ndarray:
    """Return the reference's rounding of lengths x (records lookup or pad multiple)."""
    rec = a["records"]
    if rec is not None:
        pos = np.searchsorted(rec, x, side="left")
        return np.where(pos < len(rec), rec[np.minimum(pos, len(rec) - 1)], x)
    if a["pad"]:
        return -(-x // a["pad"]) * a["pad"]
    return x


def _prefix_fits(w: np.ndarray, a: dict) -> np.ndarray:
    """Return ok[t]: do the samples w[:t+1], as one micro-batch, fit the budget?"""
    count = np.arange(1, len(w) + 1, dtype=np.int64)
    budget = a["budget"]
    if budget == "padded" or a["rounding"]:
        L = _round_np(np.maximum.accumulate(w), a)
        if budget == "quadratic":
            Lf = L.astype(np.float64)
            ok = count.astype(np.float64) * (Lf + (L * L).astype(np.float64) / a["q"]) <= a["lim_d"]
        else:
            ok = count * L <= a["lim_i"]
    elif budget == "tokens":
        ok = np.cumsum(w) <= a["lim_i"]
    else:
        # cumsum adds left to right, as the reference does
        x = w.astype(np.float64) + (w * w).astype(np.float64) / a["q"]
        ok = np.cumsum(x) <= a["lim_d"]
    if a["max_samples"] > 0:
        ok &= count <= a["max_samples"]
    ok[0] = True
    return ok


def _greedy_pack_fallback(sizes: np.ndarray, a: dict) -> np.ndarray:
    """Return the greedy boundaries with numpy work per micro-batch, not per sample.

    A micro-batch starting at j holds the longest prefix of sizes[j:] whose every prefix
    fits. Every cost is monotone under taking a sub-run of a micro-batch (non-negative
    sizes, monotone rounding), so restarting at the first leftover sample after a
    batch_multiple cut reproduces the reference, which re-tests the leftover as a group.
    """
    if len(sizes) and sizes.min() < 0:
        raise ValueError("greedy_pack: sizes must be non-negative")
    n = len(sizes)
    bounds = [0]
    j, guess, M = 0, 64, a["multiple"]
    while j < n:
        K = min(n - j, guess)
        while True:
            bad = np.flatnonzero(~_prefix_fits(sizes[j:j + K], a))
            if bad.size:
                c = int(bad[0])
                break
            if j + K >= n:
                c = K
                break
            K = min(n - j, 2 * K)
        if j + c >= n:
            bounds.append(n)
            break
        keep = c if c < M else M * (c // M)
        j += keep
        bounds.append(j)
        guess = 2 * c + 16
    return np.asarray(bounds, dtype=np.int64)


# --------------------------------------------------------------------------------------
# merging sorted runs

def _check_offsets(offsets, n: int) -> np.ndarray:
    offsets = _i64(offsets).ravel()
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
        raise ValueError(f"offsets must rise from 0 to {n} (the number of keys)")
    return offsets


def merge_sorted_runs(keys: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (merged keys, permutation) of sorted uint64 runs ``keys[offsets[i]:offsets[i+1]]``.

    ``merged == keys[perm]``; equal keys keep run order. The result always equals
    ``np.argsort(keys, kind="stable")``: runs found unsorted are sorted that way instead.
    C: one branchless two-way merge for k <= 2; for k >= 3, ceil(log2 k) such passes over
    neighbouring runs, with a temporary copy of keys and positions (2n words).
    """
    keys = np.ascontiguousarray(keys, dtype=np.uint64).ravel()
    offsets = _check_offsets(offsets, len(keys))
    lib = _c()
    if lib is None:
        perm = np.argsort(keys, kind="stable")
        return keys[perm], perm
    n = len(keys)
    merged = np.empty(n, dtype=np.uint64)
    perm = np.empty(n, dtype=np.int64)
    k = len(offsets) - 1
    scratch = _scratch(lib.sp_merge_scratch_words(n, k, 0))
    rc = lib.sp_merge_runs_u64(_ptr(keys), _ptr(offsets), k, _ptr(merged), _ptr(perm), _ptr(scratch))
    if rc == -1:
        raise MemoryError("merge_sorted_runs")
    if rc != 0:
        perm = np.argsort(keys, kind="stable")
        return keys[perm], perm
    return merged, perm


def merge_sorted_runs2(hi: np.ndarray, lo: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Return the permutation merging runs sorted by the pair (hi, lo) of uint64 arrays.

    Stable by run on equal pairs; always equals ``np.lexsort((lo, hi))``. For k >= 3 the
    C passes need temporaries of 5n words (hi, lo and positions, ping-pong).
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


# --------------------------------------------------------------------------------------
# bin packing into fixed-length rows

# Samples per best-fit window. Fill is lost mostly to each window's last, partial row, so it
# grows with the rows a window makes. Log-normal sizes (median 300, max 8192), rows of 8192,
# 1M samples in random order: window 4096 -> 99.79%, 16384 -> 99.94%, 65536 -> 99.98%
# (~4000 rows a window), the whole set -> 99.998%; the time is flat (~17 ms) up to 2^18.
# 65536 leaves a wide margin over 99.7% for smaller or larger samples. Windows of a
# *size-sorted* order hold samples of nearly one size, which no window size fixes short of
# the whole set (95.8% at 65536 on the same data): pack windows of an order that mixes sizes.
DEFAULT_ROW_WINDOW = 65536


def pack_rows_reference(sizes, row_len: int, max_segments: int = 0) -> tuple[np.ndarray, np.ndarray]:
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


def _check_rows(sizes, row_len, max_segments) -> None:
    if row_len < 0:
        raise ValueError(f"row_len must be >= 0, got {row_len}")
    if max_segments < 0:
        raise ValueError(f"max_segments must be >= 0, got {max_segments}")
    arr = np.asarray(sizes, dtype=np.int64)
    bad = np.flatnonzero((arr < 0) | (arr > row_len))
    if bad.size:
        raise ValueError(f"sample {int(bad[0])} has size {int(arr[bad[0]])}, outside [0, {row_len}] "
                         "(remove or truncate samples longer than a row first)")


def pack_rows(sizes, row_len: int, max_segments: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, row_splits) packing all samples into rows by best-fit-decreasing.

    Semantics and output order as ``pack_rows_reference``; ``order`` is a permutation of
    0..n-1, ``row_splits`` int64 ``[0, ..., n]``. ValueError if a size is outside
    [0, row_len]. O(n log row_len).
    """
    return pack_rows_windows(sizes, row_len, max_segments, window=0)


def pack_rows_windows(sizes, row_len: int, max_segments: int = 0,
                      window: int = DEFAULT_ROW_WINDOW) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, row_splits) of ``pack_rows`` applied to each run of ``window`` samples.

    Windows are ``sizes[0:window]``, ``sizes[window:2*window]``, ...; their rows are
    concatenated and ``order`` holds global positions, so a row never mixes windows and the
    result for a window does not depend on the others (nor on how ranks split the data, as
    long as window boundaries are global). ``window <= 0`` packs everything at once.
    """
    row_len, max_segments, window = (operator.index(row_len), operator.index(max_segments),
                                     operator.index(window))
    sizes = _i64(sizes).ravel()
    n = len(sizes)
    lib = _c()
    if lib is None:
        _check_rows(sizes, row_len, max_segments)
        w = n if window <= 0 or window > n else window
        orders, splits, _done = [], [np.zeros(1, dtype=np.int64)], 0
        for w0 in range(0, n, max(w, 1)):
            o, s = pack_rows_reference(sizes[w0:w0 + w], row_len, max_segments)
            orders.append(o + w0)
            splits.append(s[1:] + w0)
        order = np.concatenate(orders) if orders else np.zeros(0, dtype=np.int64)
        return order, np.concatenate(splits)
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


# --------------------------------------------------------------------------------------
# optimal padded lengths

def _check_histogram(values, counts) -> tuple[np.ndarray, np.ndarray]:
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


def optimal_lengths(values, counts, k: int) -> np.ndarray:
    """Return the at most ``k`` lengths that minimise the padded total of a size histogram.

    ``values`` are the distinct sizes (positive, strictly increasing) and ``counts`` how
    many samples have each. Each sample is padded to the smallest chosen length >= its
    size; the result (increasing, a subset of ``values``, always ending at ``values[-1]``)
    minimises ``sum(counts * padded)`` exactly. Ties go to the leftmost split at every step
    of the DP, so the result is unique (C and numpy agree). Dynamic programming over the
    d distinct values with the divide-and-conquer optimisation (the cost is Monge):
    O(k d log d) time, 4 k d bytes for the splits.
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


def batch_capacity(lengths, max_tokens, budget: str = "padded", quadratic_scale: float = 1.0,
                   max_samples: int = 0) -> np.ndarray:
    """Return, per padded length L, the most samples a micro-batch rounded to L can hold.

    Compares exactly as ``greedy_pack`` does when lengths are rounded (cost ``c*L``, or
    ``c*(L + L*L/Q)`` for the quadratic budget), capped at ``max_samples`` when > 0, so a
    micro-batch the greedy packs at length L never holds more. 0 where L alone does not fit.
    """
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; expected one of {', '.join(BUDGETS)}")
    lengths = _i64(lengths)
    if len(lengths) and lengths.min() < 1:
        raise ValueError("lengths must be positive")
    lim_i, lim_d = _limits(max_tokens)
    if budget == "quadratic":
        # the kernel's float expression, so that c fits here iff it fits there
        unit = lengths.astype(np.float64) + (lengths * lengths).astype(np.float64) / float(quadratic_scale)
        cap = np.floor(lim_d / unit).astype(np.int64)
        for _ in range(4):  # the float quotient may be off by one either way
            cap += ((cap + 1).astype(np.float64) * unit <= lim_d)
            cap -= ((cap > 0) & (cap.astype(np.float64) * unit > lim_d))
    else:
        cap = np.maximum(lim_i, 0) // lengths
    if max_samples and max_samples > 0:
        cap = np.minimum(cap, max_samples)
    return np.maximum(cap, 0)


def gather_bytes(bases: np.ndarray, buffers: list, piece: np.ndarray, src_start: np.ndarray,
                 length: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Return ``dst`` filled in row order: row i is ``length[i]`` bytes of ``buffers[piece[i]]`` at ``src_start[i]``.

    Rows land one after another from ``dst``'s start. ``bases`` are the buffers' addresses
    (what the C kernel reads); ``buffers`` are the same memory as numpy uint8 arrays (what the
    fallback reads).
    """
    piece, src_start, length = _i64(piece), _i64(src_start), _i64(length)
    dst_off = np.zeros(len(length), dtype=np.int64)
    if len(length) > 1:
        np.cumsum(length[:-1], out=dst_off[1:])
    if int(length.sum()) > len(dst):
        raise ValueError("gather_bytes: the rows need more bytes than dst holds")
    lib = _c()
    if lib is not None:
        bases = np.ascontiguousarray(bases, dtype=np.uint64)
        got = lib.sp_gather_bytes(_ptr(bases), len(bases), _ptr(piece), _ptr(src_start), _ptr(length),
                                  _ptr(dst_off), len(length), _ptr(dst))
        if got < 0:
            raise ValueError("gather_bytes: a piece number is out of range")
        return dst
    # numpy: one vectorised copy per piece, through a byte index (8 bytes of index per byte)
    for k in np.unique(piece).tolist():
        rows = np.flatnonzero(piece == k)
        n = length[rows]
        if n.sum() == 0:
            continue
        shift = np.repeat(src_start[rows] - dst_off[rows], n)
        at = np.repeat(dst_off[rows], n) + (np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n))
        dst[at] = buffers[k][at + shift]
    return dst
