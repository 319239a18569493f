"""The WF2Q interleave of a mixture's sources (``blend.plan_blend``): the compiled kernel, and
the pure-Python loop it replaces as the fallback (identical picks, about 2 us per unit)."""
from __future__ import annotations

import numpy as np

from ._loader import _c, _i64, _ptr

# The kernel compares integer prefixes with the float targets as doubles, which is exact
# (as Python's int/float comparison is) only while every prefix is below 2**53.
_EXACT = 1 << 53


def wf2q_interleave(starts: list[np.ndarray], finishes: list[np.ndarray], sizes: list[np.ndarray], total: float,
                    stop_at: list[int] | None = None) -> np.ndarray:
    """Return the source (int16) of each unit in WF2Q order until the run is complete.

    Source s offers its units in stream order; unit j starts at prefix ``starts[s][j]`` and
    finishes at ``finishes[s][j]`` (float64) and holds ``sizes[s][j]`` tokens. The next unit is,
    among the sources whose next unit has started (start <= tokens so far), the one that
    finishes first (ties: the lower source); when none has started (rounding), the one that
    starts first. The run ends before the first unit that would pass ``total`` tokens, or when
    every source gave ``stop_at[s]`` units (default: its whole stream).
    """
    k = len(starts)
    st = [np.ascontiguousarray(a, dtype=np.float64) for a in starts]
    fi = [np.ascontiguousarray(a, dtype=np.float64) for a in finishes]
    sz = [_i64(a) for a in sizes]
    lens = [len(a) for a in st]
    if any(len(f) != n or len(m) != n for f, m, n in zip(fi, sz, lens)):
        raise ValueError("wf2q_interleave: a source's starts, finishes and sizes differ in length")
    ends = [min(int(e), n) for e, n in zip(stop_at, lens)] if stop_at is not None else lens
    lib = _c()
    offered = sum(int(m[:e].sum()) for m, e in zip(sz, ends))
    if lib is not None and offered < _EXACT and all(int(m[:e].min(initial=0)) >= 0 for m, e in zip(sz, ends)):
        offsets = _i64(np.concatenate(([0], np.cumsum(lens))))
        s_all = np.concatenate(st) if k else np.zeros(0)
        f_all = np.concatenate(fi) if k else np.zeros(0)
        m_all = np.concatenate(sz) if k else np.zeros(0, np.int64)
        ends_a = _i64(ends)
        cap = int(ends_a.sum())
        picks = np.empty(max(cap, 1), dtype=np.int16)
        n = lib.sp_wf2q(_ptr(s_all), _ptr(f_all), _ptr(m_all), _ptr(offsets), _ptr(ends_a), k, float(total),
                        _ptr(picks), cap)
        if n < 0:
            raise MemoryError("wf2q_interleave: the compiled kernel could not allocate its state")
        return picks[:n].copy()
    return np.asarray(wf2q_reference([a.tolist() for a in st], [a.tolist() for a in fi], [a.tolist() for a in sz],
                                     total, ends), dtype=np.int16)


def wf2q_reference(starts: list[list[float]], finishes: list[list[float]], sizes: list[list[int]], total: float,
                   ends: list[int]) -> list[int]:
    """Return the picks of ``wf2q_interleave`` computed by a pure-Python loop (the fallback and the test oracle)."""
    k = len(starts)
    inf = float("inf")
    # the next unit of each source: its start, finish and size (inf start: the source gave all it may)
    ptr = [0] * k
    cur_s = [starts[s][0] if ends[s] > 0 else inf for s in range(k)]
    cur_f = [finishes[s][0] if ends[s] > 0 else inf for s in range(k)]
    cur_m = [sizes[s][0] if ends[s] > 0 else 0 for s in range(k)]
    live = [s for s in range(k) if ends[s] > 0]
    x = 0
    picks: list[int] = []
    append = picks.append
    while live:
        best, best_f, wait, wait_src = -1, inf, inf, -1
        for s in live:
            sj = cur_s[s]
            if sj <= x:
                if cur_f[s] < best_f or best < 0:  # a started unit that never finishes (inf) beats waiting
                    best_f, best = cur_f[s], s
            elif sj < wait:
                wait, wait_src = sj, s
        if best < 0:  # rounding left no unit started: the one that starts first
            best = wait_src
        if best < 0:
            break
        m = cur_m[best]
        if x + m > total:
            break
        x += m
        append(best)
        j = ptr[best] = ptr[best] + 1
        if j >= ends[best]:  # a source that gave all it may gives no more
            live.remove(best)
        else:
            cur_s[best], cur_f[best], cur_m[best] = starts[best][j], finishes[best][j], sizes[best][j]
    return picks
