"""Items dealt to k parts of equal count and balanced cost: the largest differencing method (Karmarkar-Karp)
over runs of k items, the compiled kernel and its numpy fallback, which give the same parts."""
from __future__ import annotations

import heapq
import operator

import numpy as np

from ._loader import _c, _ptr


def deal_equal(cost: np.ndarray, k: int) -> np.ndarray:
    """Return the part (int64, 0..k-1) of each item: k parts of ``len(cost) / k`` items each, their cost sums balanced.

    Items go in order of cost, highest first (ties: the lower index); each run of k is a state of k
    parts of one item each. The state whose heaviest and lightest parts differ most (ties: the
    earlier state) takes the next such state, its i-th heaviest part the other's i-th lightest,
    until one state is left (the largest differencing method with equal counts, as verl's and
    slime's ``karmarkar_karp(equal_size=True)``). Part 0 is the heaviest. ``len(cost)`` must be a
    multiple of k (ValueError); costs are finite and non-negative (the caller's).

    Examples:
        >>> deal_equal(np.array([8.0, 7.0, 6.0, 5.0, 4.0, 3.0]), 2).tolist()  # {7, 6, 4}: 17 and {8, 5, 3}: 16
        [1, 0, 0, 1, 0, 1]
    """
    k = operator.index(k)
    cost = np.ascontiguousarray(cost, dtype=np.float64)
    m = len(cost)
    if k < 1 or m % k:
        raise ValueError(f"deal_equal: {m} items do not make parts of equal count for k={k}")
    part = np.empty(m, dtype=np.int64)
    lib = _c()
    if lib is not None and lib.sp_deal_equal(_ptr(cost), m, k, _ptr(part)) == 0:
        return part
    return _deal_numpy(cost, k)


def _deal_numpy(cost: np.ndarray, k: int) -> np.ndarray:
    """Return ``deal_equal`` computed with numpy and a heap: one merge of two states per step, as the kernel."""
    m = len(cost)
    if m == 0:
        return np.zeros(0, np.int64)
    order = np.lexsort((np.arange(m), -cost))
    groups = m // k
    sets = np.arange(m, dtype=np.int64).reshape(groups, k)  # each state's parts, heaviest first (sorted places)
    sums = cost[order].reshape(groups, k).copy()
    parent = np.arange(m, dtype=np.int64)
    heap = [(-(sums[s, 0] - sums[s, -1]), s) for s in range(groups)]
    heapq.heapify(heap)
    while len(heap) > 1:
        a, b = heapq.heappop(heap)[1], heapq.heappop(heap)[1]
        parent[sets[b, ::-1]] = sets[a]
        merged = sums[a] + sums[b, ::-1]
        by = np.argsort(-merged, kind="stable")
        sets[a], sums[a] = sets[a, by], merged[by]
        heapq.heappush(heap, (-(sums[a, 0] - sums[a, -1]), a))
    rank = np.empty(m, np.int64)
    rank[sets[heap[0][1]]] = np.arange(k)
    while True:  # every part's root: pointer jumping
        up = parent[parent]
        if np.array_equal(up, parent):
            break
        parent = up
    part = np.empty(m, np.int64)
    part[order] = rank[parent]
    return part
