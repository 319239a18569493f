"""Items dealt to k parts of equal count and balanced cost: the largest differencing method (Karmarkar-Karp)
over runs of k items, the compiled kernel and its numpy fallback, which give the same parts."""
from __future__ import annotations

import heapq
import operator

import numpy as np

from ._loader import _c, _ptr

# the swaps after the deal: the heaviest part this close to the mean (relative) is balanced; it may swap with
# this many of the lightest parts, lightest first
TIGHT = 1e-5
LIGHTEST = 4


def deal_equal(cost: np.ndarray, k: int, real: int | None = None, rounds: int | None = None) -> np.ndarray:
    """Return the part (int64, 0..k-1) of each item: k parts of ``len(cost) / k`` items each, their cost sums balanced.

    Items go in order of cost, highest first (ties: the lower index); each run of k is a state of k
    parts of one item each. The state whose heaviest and lightest parts differ most (ties: the
    earlier state) takes the next such state, its i-th heaviest part the other's i-th lightest,
    until one state is left (the largest differencing method with equal counts, as verl's and
    slime's ``karmarkar_karp(equal_size=True)``); part 0 is then the heaviest. Equal counts let it
    close a gap only by the spread of the run it merges, so then, at most ``rounds`` times
    (default 4k + 64), the heaviest part swaps one item with one of the ``LIGHTEST`` lightest parts:
    the pair whose costs differ nearest half their gap (``_swaps_numpy``), until the heaviest is
    within ``TIGHT`` of the mean. Items from ``real`` on (fillers) never swap. ``len(cost)`` must
    be a multiple of k (ValueError); costs are finite and non-negative (the caller's).

    Examples:
        >>> deal_equal(np.array([8.0, 7.0, 6.0, 5.0, 4.0, 3.0]), 2, rounds=0).tolist()  # {7, 6, 4}: 17, {8, 5, 3}: 16
        [1, 0, 0, 1, 0, 1]
    """
    k = operator.index(k)
    cost = np.ascontiguousarray(cost, dtype=np.float64)
    m = len(cost)
    if k < 1 or m % k:
        raise ValueError(f"deal_equal: {m} items do not make parts of equal count for k={k}")
    real = m if real is None else int(real)
    rounds = 4 * k + 64 if rounds is None else int(rounds)
    part = np.empty(m, dtype=np.int64)
    lib = _c()
    if lib is not None and lib.sp_deal_equal(_ptr(cost), m, k, real, rounds, TIGHT, LIGHTEST, _ptr(part)) == 0:
        return part
    part = _deal_numpy(cost, k)
    return _swaps_numpy(cost, part, k, real, rounds) if rounds > 0 and k > 1 and m else part


def _deal_numpy(cost: np.ndarray, k: int) -> np.ndarray:
    """Return ``deal_equal`` computed with numpy and a heap: one merge of two states per step, as the kernel."""
    m = len(cost)
    if m == 0:
        return np.zeros(0, np.int64)
    order = np.lexsort((np.arange(m), -cost))
    part = np.empty(m, np.int64)
    part[order] = differencing(cost[order].reshape(m // k, k).copy())
    return part


def differencing(sums: np.ndarray) -> np.ndarray:
    """Return the part (0..k-1, 0 the heaviest) of each slot ``s * k + j`` of the states ``sums`` (each row a state
    of k parts' cost sums, heaviest first) after the largest differencing method merges them: the state whose
    heaviest and lightest parts differ most (ties: the earlier) takes the next, its i-th heaviest part the other's
    i-th lightest, until one is left (``sums`` is consumed)."""
    n, k = sums.shape
    slots = np.arange(n * k, dtype=np.int64).reshape(n, k)  # each state's parts, heaviest first
    parent = np.arange(n * k, dtype=np.int64)
    heap = [(-float(sums[s, 0] - sums[s, -1]), s) for s in range(n)]
    heapq.heapify(heap)
    while len(heap) > 1:
        a, b = heapq.heappop(heap)[1], heapq.heappop(heap)[1]
        parent[slots[b, ::-1]] = slots[a]
        merged = sums[a] + sums[b, ::-1]
        by = np.argsort(-merged, kind="stable")
        slots[a], sums[a] = slots[a, by], merged[by]
        heapq.heappush(heap, (-float(sums[a, 0] - sums[a, -1]), a))
    rank = np.empty(n * k, np.int64)
    rank[slots[heap[0][1]]] = np.arange(k)
    while True:  # every slot's root: pointer jumping
        up = parent[parent]
        if np.array_equal(up, parent):
            break
        parent = up
    return rank[parent]


def _best_swap(cost: np.ndarray, mine: np.ndarray, theirs: np.ndarray, gap: float, real: int
               ) -> tuple[int, int, float]:
    """Return (place in ``mine``, place in ``theirs``, what moves) of the swap of two items whose costs differ by
    nearest ``gap / 2`` within (0, gap): the one that brings the heavier part lowest (-1, -1, 0 when none helps).
    ``theirs`` is sorted by (cost, index)."""
    have = cost[theirs]
    at = np.searchsorted(have, cost[mine] - gap / 2)
    best = (-1, -1, 0.0, gap)
    for pick in (np.maximum(at - 1, 0), np.minimum(at, len(theirs) - 1)):
        moved = cost[mine] - have[pick]
        ok = (moved > 0) & (moved < gap) & (mine < real) & (theirs[pick] < real)
        worse = np.where(ok, np.maximum(gap - moved, moved), np.inf)
        j = int(np.argmin(worse))
        if worse[j] < best[3]:
            best = (j, int(pick[j]), float(moved[j]), float(worse[j]))
    return best[0], best[1], best[2]


def _swaps_numpy(cost: np.ndarray, part: np.ndarray, k: int, real: int, rounds: int) -> np.ndarray:
    """Return ``part`` after the kernel's swaps, computed with numpy (the same sums in the same order)."""
    held = np.lexsort((np.arange(len(cost)), cost, part)).reshape(k, -1)  # each part's items by (cost, index)
    sums = np.cumsum(cost[held], axis=1)[:, -1].copy()  # sequential sums, as the kernel adds
    for _ in range(rounds):
        h = int(np.argmax(sums))
        mean = float(np.cumsum(sums)[-1]) / k
        if sums[h] - mean <= mean * TIGHT:
            break
        for light in np.argsort(sums, kind="stable")[:LIGHTEST]:
            x, y, moved = _best_swap(cost, held[h], held[light], float(sums[h] - sums[light]), real)
            if x >= 0:
                held[h, x], held[light, y] = held[light, y], held[h, x]
                for r in (h, light):
                    held[r] = held[r][np.lexsort((held[r], cost[held[r]]))]
                sums[h] -= moved
                sums[light] += moved
                break
        else:
            break
    out = np.empty(len(cost), np.int64)
    out[held] = np.arange(k)[:, None]
    return out
