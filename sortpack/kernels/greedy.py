"""Greedy packing of ordered sizes into micro-batches under a budget: the compiled kernel,
its numpy fallback, and the sequential reference they both reproduce exactly."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ._loader import _c, _i64, _ptr
from .budget import KernelCost, kernel_cost, limits


def greedy_pack_reference(sizes: Any, max_tokens: Any, budget: str | KernelCost = "padded", max_samples: int = 0,
                          batch_multiple: int = 1, quadratic_scale: float = 1.0, pad_multiple: int = 0,
                          shapes: Any = None, sizes2: Any = None, max2: Any = 0) -> np.ndarray:
    """Return micro-batch boundaries of the sequential greedy (the oracle; a Python loop).

    A sample joins the current micro-batch iff afterwards the budget holds and the count is
    at most ``max_samples`` (when > 0). Cost of a micro-batch of ``c`` samples whose largest
    rounded length is ``L`` (``budget``: a name of ``COSTS`` or a ``KernelCost``): per slot
    ``c*unit(L)`` (always when rounding), else ``sum(unit(s))``; ``unit(s)`` is ``s``, or
    ``s + s*s/Q`` for a quadratic cost (padded ``c*L``, tokens ``sum(s)``, quadratic
    ``sum(s + s*s/Q)``). When a micro-batch closes with ``batch_multiple`` M > 1, it keeps the
    largest multiple of M of its samples (all when fewer than M) and the rest open the next
    one, which the sample is tested against.
    With ``sizes2`` (caps beside the budget: one measure per sample, or K rows of them) the sum
    of a micro-batch's measure k stays at most ``max2`` (or ``max2[k]``) too.

    Returns
    -------
    numpy.ndarray
        int64 ``[0, b1, ..., n]``: micro-batch i is ``sizes[b[i]:b[i+1]]``.
    """
    sizes = [int(s) for s in np.asarray(sizes, dtype=np.int64)]
    caps, lims = cap_arrays(sizes2, max2, len(sizes))
    second = [[int(v) for v in row] for row in caps]
    rounding = bool(pad_multiple and pad_multiple > 1) or (shapes is not None and len(shapes) > 0)
    shape_list = [int(x) for x in shapes] if shapes is not None else []
    kind = kernel_cost(budget)

    def cost(batch: list[int]) -> float:
        return _reference_cost(batch, kind, quadratic_scale, _reference_round(max(batch), shape_list, pad_multiple),
                               rounding)

    def fits2(first: int, last: int) -> bool:
        return all(sum(row[first:last + 1]) <= int(lim) for row, lim in zip(second, lims))

    bounds = [0]
    start = 0
    batch: list[int] = []
    for i, s in enumerate(sizes):
        while batch:
            trial = batch + [s]
            if cost(trial) <= max_tokens and (max_samples <= 0 or len(trial) <= max_samples) and fits2(start, i):
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


def _reference_round(x: int, shape_list: list[int], pad_multiple: int) -> int:
    """Return the padded length of a micro-batch whose largest sample is ``x`` (the oracle's rule)."""
    if shape_list:
        for s in shape_list:
            if s >= x:
                return s
        return x
    if pad_multiple and pad_multiple > 1:
        return -(-x // pad_multiple) * pad_multiple
    return x


def _reference_cost(batch: list[int], kind: KernelCost, quadratic_scale: float, L: int, rounding: bool) -> float:
    """Return the oracle's cost of a non-empty micro-batch whose rounded largest length is ``L``."""
    c = len(batch)
    if kind.per_slot or rounding:
        if kind.quadratic:
            return c * (L + L * L / quadratic_scale)
        return c * L
    if not kind.quadratic:
        return sum(batch)
    # plain left-to-right addition, not sum(): sum() is compensated from Python 3.12
    # on, and micro-batch boundaries must not depend on the interpreter
    total = 0.0
    for s in batch:
        total += s + s * s / quadratic_scale
    return total


@dataclass(frozen=True)
class _Options:
    """The options of greedy_pack, validated and in the form both implementations read."""

    cost: KernelCost
    lim_i: int  # an int cost fits iff <= lim_i
    lim_d: float  # a float cost fits iff <= lim_d
    max_samples: int
    multiple: int
    q: float
    pad: int  # 0: no pad multiple
    records: np.ndarray | None  # the shapes rounding can pick, increasing; None: no shapes
    rounding: bool
    caps: np.ndarray | None = None  # (K, n) measures of the K caps beside the budget, or None
    lims: np.ndarray | None = None  # (K,) the sum of measure k in a micro-batch stays <= lims[k]


def _shape_records(shapes: Any) -> np.ndarray | None:
    """Return the shapes the reference's rounding can pick, increasing, or None for no shapes.

    The reference rounds x to the first shape >= x in list order. That shape is larger than
    every shape before it, so only prefix-maximum records can be picked, and the first one
    >= x is the smallest record >= x: rounding is a monotone lookup in the records.
    """
    if shapes is None or len(shapes) == 0:
        return None
    vals = [int(x) for x in shapes]
    rec: list[int] = []
    best = None
    for v in vals:
        if best is None or v > best:
            rec.append(v)
            best = v
    return np.asarray(rec, dtype=np.int64)


def _options(max_tokens: Any, budget: str | KernelCost, counts: tuple[Any, Any], quadratic_scale: Any,
             rounding: tuple[Any, Any]) -> _Options:
    """Validate the options of greedy_pack (``counts``: max_samples, batch_multiple; ``rounding``: pad_multiple,
    shapes); return them normalised."""
    max_samples, batch_multiple = counts
    pad_multiple, shapes = rounding
    cost = kernel_cost(budget)
    max_samples = 0 if max_samples is None else operator.index(max_samples)
    batch_multiple = 1 if batch_multiple is None else operator.index(batch_multiple)
    if batch_multiple < 1:
        raise ValueError(f"batch_multiple must be >= 1, got {batch_multiple}")
    pad = 0 if not pad_multiple else int(pad_multiple)
    if pad != (pad_multiple or 0):
        raise ValueError(f"pad_multiple must be an integer, got {pad_multiple!r}")
    q = float(quadratic_scale)
    if cost.quadratic and not (q > 0 and math.isfinite(q)):
        raise ValueError(f"quadratic_scale must be positive and finite, got {quadratic_scale!r}")
    lim_i, lim_d = limits(max_tokens)
    rec = _shape_records(shapes)
    return _Options(cost=cost, lim_i=lim_i, lim_d=lim_d, max_samples=max_samples,
                    multiple=batch_multiple, q=q, pad=pad if pad > 1 else 0, records=rec,
                    rounding=rec is not None or pad > 1)


def greedy_pack(sizes: Any, max_tokens: Any, budget: str | KernelCost = "padded", max_samples: int = 0,
                batch_multiple: int = 1, quadratic_scale: float = 1.0, pad_multiple: int = 0,
                shapes: Any = None, sizes2: Any = None, max2: Any = 0) -> np.ndarray:
    """Return micro-batch boundaries of the sequential greedy (see ``greedy_pack_reference``).

    Identical to the reference for every option; sizes must be non-negative (ValueError).

    Parameters
    ----------
    sizes : array of int
        Sample sizes in packing order.
    max_tokens : int or float
        The limit on a micro-batch's cost under ``budget``.
    budget : str or KernelCost
        One of ``BUDGETS`` (a name of ``COSTS``), or a ``KernelCost``.
    max_samples : int
        At most this many samples a micro-batch when > 0.
    batch_multiple : int
        A closed micro-batch keeps a multiple of this many samples when it has that many.
    quadratic_scale : float
        ``Q`` of a quadratic cost.
    pad_multiple : int
        Lengths round up to a multiple of this when > 1.
    shapes : array of int, optional
        Lengths round up to the first of these that is >= them.
    sizes2 : array of int, optional
        Caps beside the budget: a measure per sample (``--size2``), or a (K, n) array of K of them
        (``--cap``); a micro-batch's sum of measure k stays <= ``max2`` (or ``max2[k]``).
    max2 : int or sequence of int
        The cap of each measure.

    Returns
    -------
    numpy.ndarray
        int64 ``[0, b1, ..., n]``: micro-batch i is ``sizes[b[i]:b[i+1]]``.
    """
    a = _options(max_tokens, budget, (max_samples, batch_multiple), quadratic_scale, (pad_multiple, shapes))
    sizes = _i64(sizes).ravel()
    if sizes2 is not None:
        caps, lims = cap_arrays(sizes2, max2, len(sizes))
        a = replace(a, caps=caps, lims=lims)
    lib = _c()
    if lib is None:
        return _greedy_pack_fallback(sizes, a)
    n = len(sizes)
    # n + 1 is the worst case (all singletons); untouched pages of np.empty cost nothing
    out = np.empty(n + 1, dtype=np.int64)
    rec = a.records if a.records is not None else np.zeros(1, dtype=np.int64)
    nrec = 0 if a.records is None else len(rec)
    if a.caps is None or a.lims is None:
        nb = lib.sp_greedy_pack(_ptr(sizes), n, a.cost.code, a.lim_i, a.lim_d, a.max_samples,
                                a.multiple, a.q, a.pad, _ptr(rec), nrec, _ptr(out))
    else:
        nb = lib.sp_greedy_pack_caps(_ptr(sizes), n, a.cost.code, a.lim_i, a.lim_d, a.max_samples,
                                     a.multiple, a.q, a.pad, _ptr(rec), nrec, _ptr(a.caps), _ptr(a.lims),
                                     len(a.lims), _ptr(out))
    if nb < 0:
        raise ValueError("greedy_pack: sizes must be non-negative")
    return out[:nb].copy()


MAX_CAPS = 16  # caps beside the budget the kernels take (SP_MAX_CAPS in _ckernels.c)


def cap_arrays(sizes2: Any, max2: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ((K, n) int64 measures, (K,) int64 caps) of one measure per sample or K rows of them (ValueError on
    a shape that does not match ``n`` samples, a cap count unlike the rows', or more than ``MAX_CAPS``)."""
    if sizes2 is None:
        return np.zeros((0, n), np.int64), np.zeros(0, np.int64)
    caps = np.ascontiguousarray(np.atleast_2d(np.asarray(sizes2, dtype=np.int64)))
    if caps.ndim != 2 or caps.shape[1] != n:
        raise ValueError("sizes2 must have one value per size (or K rows of them)")
    lims = np.atleast_1d(np.asarray([operator.index(x) for x in np.atleast_1d(max2)], dtype=np.int64))
    if len(lims) != len(caps):
        raise ValueError(f"max2 must give one cap per row of sizes2 ({len(caps)}), got {len(lims)}")
    if len(caps) > MAX_CAPS:
        raise ValueError(f"at most {MAX_CAPS} caps beside the budget, got {len(caps)}")
    return caps, lims


def _round_np(x: np.ndarray, a: _Options) -> np.ndarray:
    """Return the reference's rounding of lengths x (records lookup or pad multiple)."""
    rec = a.records
    if rec is not None:
        pos = np.searchsorted(rec, x, side="left")
        return np.where(pos < len(rec), rec[np.minimum(pos, len(rec) - 1)], x)
    if a.pad:
        return -(-x // a.pad) * a.pad
    return x


_SQ_EXACT = 3037000499  # the largest int64 whose square is an int64 (sq_to_double in _ckernels.c)


def _square_f64(x: np.ndarray) -> np.ndarray:
    """Return float64(x*x) of int64 ``x``, squared exactly and rounded once, as Python (and ``sq_to_double``) does.

    ``x * x`` in int64 wraps above 3037000499: those few are squared as Python ints.
    """
    x = np.asarray(x, dtype=np.int64)
    a = np.abs(x)
    out = (np.minimum(a, _SQ_EXACT) ** 2).astype(np.float64)
    big = np.flatnonzero(a > _SQ_EXACT)
    if big.size:
        out[big] = [float(int(v) * int(v)) for v in x[big].tolist()]
    return out


def _running_sums_fit(w: np.ndarray, lim: int, axis: int = -1) -> np.ndarray:
    """Return cumsum(w) <= lim along ``axis`` for non-negative int64 ``w``, a sum past int64 never fitting.

    A running sum of non-negative int64s that passes 2**63 - 1 wraps below 0: from there on
    nothing fits (the compiled kernels' checked additions say the same).
    """
    cs = np.cumsum(w, axis=axis)
    return (cs <= lim) & ~np.logical_or.accumulate(cs < 0, axis=axis)


def _prefix_fits(w: np.ndarray, a: _Options) -> np.ndarray:
    """Return ok[t]: do the samples w[:t+1], as one micro-batch, fit the budget?"""
    count = np.arange(1, len(w) + 1, dtype=np.int64)
    if a.cost.per_slot or a.rounding:
        L = _round_np(np.maximum.accumulate(w), a)
        if a.cost.quadratic:
            Lf = L.astype(np.float64)
            ok = count.astype(np.float64) * (Lf + _square_f64(L) / a.q) <= a.lim_d
        else:
            # count * L <= lim_i without the product (it may pass int64): L <= floor(lim_i / count)
            ok = L <= a.lim_i // count
    elif not a.cost.quadratic:
        ok = _running_sums_fit(w, a.lim_i)
    else:
        # cumsum adds left to right, as the reference does
        x = w.astype(np.float64) + _square_f64(w) / a.q
        ok = np.cumsum(x) <= a.lim_d
    if a.max_samples > 0:
        ok &= count <= a.max_samples
    ok[0] = True
    return ok


def _prefix_fits2(w: np.ndarray, j: int, a: _Options) -> np.ndarray:
    """Return ``_prefix_fits`` of the samples from ``j`` (``w = sizes[j:j+K]``), every cap's too."""
    ok = _prefix_fits(w, a)
    if a.caps is not None and a.lims is not None and len(a.lims):
        ok &= np.stack([_running_sums_fit(row, int(lim))
                        for row, lim in zip(a.caps[:, j:j + len(w)], a.lims)]).all(axis=0)
        ok[0] = True
    return ok


def _greedy_pack_fallback(sizes: np.ndarray, a: _Options) -> np.ndarray:
    """Return the greedy boundaries with numpy work per micro-batch, not per sample.

    A micro-batch starting at j holds the longest prefix of sizes[j:] whose every prefix
    fits. Every cost is monotone under taking a sub-run of a micro-batch (non-negative
    sizes, monotone rounding), so restarting at the first leftover sample after a
    batch_multiple cut reproduces the reference, which re-tests the leftover as a group.
    """
    if (len(sizes) and sizes.min() < 0) or (a.caps is not None and a.caps.size and a.caps.min() < 0):
        raise ValueError("greedy_pack: sizes must be non-negative")
    n = len(sizes)
    bounds = [0]
    j, guess, M = 0, 64, a.multiple
    while j < n:
        K = min(n - j, guess)
        while True:
            bad = np.flatnonzero(~_prefix_fits2(sizes[j:j + K], j, a))
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
