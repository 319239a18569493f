"""Best fit over the budget and every cap at once (vector bin packing), window by window: the compiled kernel,
its numpy fallback, and the sequential reference they both reproduce exactly.

A window's samples come in visiting order (largest first: the caller orders them). A bin (a
micro-batch, or a row) opens with the first sample of the window not yet placed, then takes, again
and again, the first unplaced sample of the window that fits it: its cost under the budget (any
``KernelCost``, rounding, ``max_samples``) and the sum of every cap's measure stay within their
limits. When none fits the bin closes; with ``batch_multiple`` M it keeps the largest multiple of M
of its samples (all when fewer than M) and the last ones it took go back to the window. Each bin so
takes the largest sample that still fits it, whichever cap binds: where the runs of a sorted order
leave room a sample elsewhere in the window fills (``stages/pack/cut.py`` makes the windows).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ._loader import _c, _i64, _ptr, _scratch
from .budget import KernelCost, kernel_cost
from .greedy import (
    _Options,
    _options,
    _reference_cost,
    _reference_round,
    _round_np,
    _shape_records,
    _square_f64,
    cap_arrays,
)


def _windows(windows: Any, n: int) -> np.ndarray:
    """Return window bounds ``[0, ..., n]`` (int64; None: one window) after checking they cover the samples."""
    if windows is None:
        return np.array([0, n], np.int64)
    w = _i64(windows).ravel()
    if n == 0 and len(w) == 1 and int(w[0]) == 0:
        return np.array([0, 0], np.int64)
    if len(w) < 2 or int(w[0]) != 0 or int(w[-1]) != n or bool(np.any(np.diff(w) < 0)):
        raise ValueError("windows must be non-decreasing bounds from 0 to the number of samples")
    return w


def fit_pack_reference(sizes: Any, max_tokens: Any, budget: str | KernelCost = "tokens", max_samples: int = 0,
                       batch_multiple: int = 1, quadratic_scale: float = 1.0, pad_multiple: int = 0,
                       shapes: Any = None, sizes2: Any = None, max2: Any = 0,
                       windows: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, bounds) of the bin-centric best fit (the oracle; a Python loop), window by window.

    ``order`` holds the samples (positions) bin after bin, each bin's in the order it took them;
    bin b is ``order[bounds[b]:bounds[b+1]]``. The cost of a bin is ``greedy_pack_reference``'s.
    """
    sizes_l = [int(s) for s in _i64(sizes).ravel()]
    n = len(sizes_l)
    caps, lims = cap_arrays(sizes2, max2, n)
    rows = [[int(v) for v in row] for row in caps]
    kind = kernel_cost(budget)
    rec = _shape_records(shapes)
    shape_list = [] if rec is None else [int(x) for x in rec]
    pad = int(pad_multiple) if pad_multiple and pad_multiple > 1 else 0
    rounding = bool(shape_list) or pad > 1
    if min(sizes_l, default=0) < 0 or (caps.size and int(caps.min()) < 0):
        raise ValueError("fit_pack: sizes and measures must be non-negative")

    def fits(batch: list[int]) -> bool:
        cost = _reference_cost([sizes_l[p] for p in batch], kind, quadratic_scale,
                               _reference_round(max(sizes_l[p] for p in batch), shape_list, pad), rounding)
        return (cost <= max_tokens and (max_samples <= 0 or len(batch) <= max_samples)
                and all(sum(row[p] for p in batch) <= int(lim) for row, lim in zip(rows, lims)))

    order: list[int] = []
    bounds = [0]
    w = _windows(windows, n)
    for a, b in zip(w[:-1].tolist(), w[1:].tolist()):
        free = list(range(a, b))
        while free:
            batch = [free.pop(0)]
            while True:
                j = next((p for p in free if fits(batch + [p])), None)
                if j is None:
                    break
                batch.append(j)
                free.remove(j)
            c = len(batch)
            keep = c if c < batch_multiple else batch_multiple * (c // batch_multiple)
            free = sorted(free + batch[keep:])
            order += batch[:keep]
            bounds.append(len(order))
    return np.asarray(order, dtype=np.int64), np.asarray(bounds, dtype=np.int64)


def fit_pack(sizes: Any, max_tokens: Any, budget: str | KernelCost = "tokens", max_samples: int = 0,
             batch_multiple: int = 1, quadratic_scale: float = 1.0, pad_multiple: int = 0, shapes: Any = None,
             sizes2: Any = None, max2: Any = 0, windows: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Return (order, bounds) of the bin-centric best fit over the budget and every cap (see the module's text).

    Identical to ``fit_pack_reference``. Parameters as ``greedy_pack``'s, and ``windows``: bounds
    ``[0, ..., n]`` of the windows (None: one), each in visiting order; a bin never spans two.

    Returns
    -------
    tuple of numpy.ndarray
        ``order`` (int64 positions, bin after bin) and ``bounds`` (int64 ``[0, ..., n]``).
    """
    a = _options(max_tokens, budget, (max_samples, batch_multiple), quadratic_scale, (pad_multiple, shapes))
    sizes = _i64(sizes).ravel()
    n = len(sizes)
    caps, lims = cap_arrays(sizes2, max2, n)
    a = replace(a, caps=caps, lims=lims)
    wins = _windows(windows, n)
    if (n and int(sizes.min()) < 0) or (caps.size and int(caps.min()) < 0):
        raise ValueError("fit_pack: sizes and measures must be non-negative")
    lib = _c()
    if lib is None:
        return _fit_fallback(sizes, a, wins)
    order = np.empty(n, np.int64)
    bounds = np.empty(n + 1, np.int64)
    rec = a.records if a.records is not None else np.zeros(1, dtype=np.int64)
    nrec = 0 if a.records is None else len(rec)
    longest = int(np.diff(wins).max()) if n else 1
    scratch = _scratch(lib.sp_fit_pack_scratch_words(max(longest, 1), len(lims)), np.int64)
    nb = lib.sp_fit_pack(_ptr(sizes), n, a.cost.code, a.lim_i, a.lim_d, a.max_samples, a.multiple, a.q, a.pad,
                         _ptr(rec), nrec, _ptr(caps), _ptr(lims), len(lims), _ptr(wins), len(wins) - 1,
                         _ptr(order), _ptr(bounds), _ptr(scratch))
    if nb < 0:
        raise ValueError("fit_pack: sizes and measures must be non-negative")  # pragma: no cover - checked above
    return order, bounds[:nb + 1].copy()


class _Bin:
    """The running state of one bin in the numpy fallback: what the C kernel's ``gp_state`` holds."""

    def __init__(self, a: _Options):
        self.a = a
        self.count = 0
        self.top = 0  # the largest size
        self.total = 0  # the sum of sizes
        self.fs = 0.0  # the quadratic budget's running float sum, added in the order samples join
        self.sums = np.zeros(0 if a.lims is None else len(a.lims), np.int64)

    def fits(self, s: np.ndarray, vals: np.ndarray) -> np.ndarray:
        """Return which candidates (sizes ``s``, measures ``vals``: K x len(s)) fit the bin, as ``gp_fits`` says."""
        a, c1 = self.a, self.count + 1
        if a.max_samples > 0 and c1 > a.max_samples:
            return np.zeros(len(s), bool)
        lims = a.lims if a.lims is not None else np.zeros(0, np.int64)
        # sums of non-negative int64s past 2**63 - 1 wrap below 0 and never fit (gp_fits' checked additions)
        if len(lims):
            t = self.sums[:, None] + vals
            ok = ((t >= 0) & (t <= lims[:, None])).all(axis=0)
        else:
            ok = np.ones(len(s), bool)
        if a.cost.per_slot or a.rounding:
            L = _round_np(np.maximum(s, self.top), a)
            if a.cost.quadratic:
                Lf = L.astype(np.float64)
                return ok & (np.float64(c1) * (Lf + _square_f64(L) / a.q) <= a.lim_d)
            return ok & (L <= a.lim_i // c1)  # c1 * L <= lim_i without the product, which may pass int64
        if not a.cost.quadratic:
            t = self.total + s
            return ok & (t >= 0) & (t <= a.lim_i)
        return ok & (self.fs + (s.astype(np.float64) + _square_f64(s) / a.q) <= a.lim_d)

    def add(self, s: int, vals: np.ndarray) -> None:
        """Take a sample of size ``s`` and measures ``vals``."""
        a = self.a
        self.top = s if self.count == 0 else max(self.top, s)
        self.total += s
        self.sums = self.sums + vals
        if a.cost.quadratic and not a.cost.per_slot and not a.rounding:
            self.fs += float(np.float64(s) + np.float64(s * s) / a.q)
        self.count += 1


_BLOCK = 128  # samples per block of the fallback's two-level search (the C kernel's segment tree, flattened)


class _Window:
    """The unplaced samples of one window, by blocks: each block's least size and least measures (placed ones out)."""

    def __init__(self, sizes: np.ndarray, caps: np.ndarray):
        self.sizes, self.caps = sizes, caps
        self.free = np.ones(len(sizes), bool)
        nb = -(-len(sizes) // _BLOCK)
        self.least = np.zeros((1 + len(caps), nb), np.int64)
        self.live = np.ones(nb, bool)
        for b in range(nb):
            self._block(b)

    def _block(self, b: int) -> None:
        """Recompute block ``b``'s least values over its unplaced samples."""
        lo, hi = b * _BLOCK, min(len(self.sizes), (b + 1) * _BLOCK)
        free = self.free[lo:hi]
        self.live[b] = bool(free.any())
        if self.live[b]:
            self.least[0, b] = self.sizes[lo:hi][free].min()
            if len(self.caps):
                self.least[1:, b] = self.caps[:, lo:hi][:, free].min(axis=1)

    def take(self, i: int, placed: bool = True) -> None:
        """Mark sample ``i`` placed (or unplaced again)."""
        self.free[i] = not placed
        self._block(i // _BLOCK)

    def first_fit(self, b: _Bin) -> int:
        """Return the first unplaced sample that fits bin ``b``, or -1: blocks whose least values cannot fit are
        skipped (the budget and the caps are monotone), then a block's samples are tested at once."""
        blocks = np.flatnonzero(self.live)
        if not len(blocks):
            return -1
        maybe = blocks[b.fits(self.least[0, blocks], self.least[1:, blocks])]
        for k in maybe.tolist():
            lo, hi = k * _BLOCK, min(len(self.sizes), (k + 1) * _BLOCK)
            ok = b.fits(self.sizes[lo:hi], self.caps[:, lo:hi]) & self.free[lo:hi]
            if ok.any():
                return lo + int(np.argmax(ok))
        return -1


def _fit_fallback(sizes: np.ndarray, a: _Options, wins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``fit_pack`` with numpy work per block per sample taken (a Python step per sample)."""
    caps = a.caps if a.caps is not None else np.zeros((0, len(sizes)), np.int64)
    order: list[np.ndarray] = []
    bounds = [0]
    for lo, hi in zip(wins[:-1].tolist(), wins[1:].tolist()):
        w = _Window(sizes[lo:hi], caps[:, lo:hi])
        first = 0
        while True:
            while first < hi - lo and not w.free[first]:
                first += 1
            if first >= hi - lo:
                break
            taken, b = [], _Bin(a)
            j = first
            while j >= 0:
                b.add(int(w.sizes[j]), w.caps[:, j])
                w.take(j)
                taken.append(j)
                j = w.first_fit(b)
            keep = len(taken) if len(taken) < a.multiple else a.multiple * (len(taken) // a.multiple)
            for j in taken[keep:]:  # --batch-multiple: the last ones taken go back to the window
                w.take(j, placed=False)
            order.append(np.asarray(taken[:keep], np.int64) + lo)
            bounds.append(bounds[-1] + keep)
    flat = np.concatenate(order) if order else np.zeros(0, np.int64)
    return flat, np.asarray(bounds, np.int64)
