"""The deal of items to k parts of equal count (``kernels.deal.deal_equal``): the textbook largest differencing
method as the oracle, the compiled kernel and its numpy fallback alike, equal counts always."""
from __future__ import annotations

import heapq

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sortpack.kernels import _loader
from sortpack.kernels.deal import deal_equal


def ldm_oracle(cost: list[float], k: int) -> list[frozenset[int]]:
    """Return the parts of the largest differencing method with equal counts, written plainly (Python objects).

    Items by cost descending in runs of k; a state is k (sum, items) parts heaviest first; the state of
    largest spread is merged with the next, heaviest part with lightest, until one is left.
    """
    order = sorted(range(len(cost)), key=lambda i: (-cost[i], i))
    heap = []
    for s in range(len(order) // k):
        parts = [(cost[i], [i]) for i in order[s * k:(s + 1) * k]]
        heap.append((-(parts[0][0] - parts[-1][0]), s, parts))
    heapq.heapify(heap)
    while len(heap) > 1:
        _, s, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(x[0] + y[0], x[1] + y[1]) for x, y in zip(a, reversed(b))]
        merged = [merged[i] for i in sorted(range(k), key=lambda i: (-merged[i][0], i))]
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), s, merged))
    return [frozenset(items) for _, items in heap[0][2]] if heap else [frozenset()] * k


def _parts(part: np.ndarray, k: int) -> list[frozenset[int]]:
    return [frozenset(np.flatnonzero(part == j).tolist()) for j in range(k)]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(0, 8), st.integers(0, 2**32 - 1))
def test_the_kernel_is_the_largest_differencing_method(k, groups, seed):
    cost = np.random.default_rng(seed).random(k * groups) * 1000  # distinct: no tie decides anything
    part = deal_equal(cost, k, rounds=0)  # the differencing alone: no swap after it
    assert _parts(part, k) == ldm_oracle(cost.tolist(), k)
    assert np.bincount(part, minlength=k).tolist() == [groups] * k


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 9), st.lists(st.integers(0, 6), min_size=0, max_size=60), st.booleans(), st.integers(0, 8),
       st.sampled_from([0, 3, None]))
def test_the_fallback_gives_the_kernels_parts_ties_and_swaps_included(monkeypatch_module, k, values, spread,
                                                                       fillers, rounds):
    cost = np.asarray(values[:len(values) // k * k], dtype=np.float64)  # many ties: both break them alike
    if spread:
        cost = cost ** 4 + cost / 7  # a few far heavier than the rest: the swaps have work
    real = max(len(cost) - min(fillers, k - 1), 0)
    compiled = deal_equal(cost, k, real=real, rounds=rounds)
    with monkeypatch_module.context() as m:
        m.setattr(_loader, "_clib", None)
        m.setattr(_loader, "_warned", True)
        fallback = deal_equal(cost, k, real=real, rounds=rounds)
    assert compiled.tolist() == fallback.tolist()
    assert np.bincount(compiled, minlength=k).tolist() == [len(cost) // k] * k
    if rounds == 0 and len(cost):
        sums = np.bincount(compiled, cost, minlength=k)
        assert np.all(np.diff(sums) <= 0)  # part 0 is the heaviest


def test_swaps_close_what_the_differencing_leaves_and_never_move_fillers():
    rng = np.random.default_rng(0)
    cost = np.concatenate((rng.integers(70, 75, 499).astype(float), [474.0], [0.0] * 4))  # one row far heavier
    alone = np.bincount(deal_equal(cost, 8, real=500, rounds=0), cost, minlength=8)
    part = deal_equal(cost, 8, real=500)
    swapped = np.bincount(part, cost, minlength=8)
    assert swapped.max() / swapped.mean() < alone.max() / alone.mean()
    assert len(set(part[500:].tolist())) == 4  # the four fillers stay one a part, where the deal put them
    assert part[500:].tolist() == deal_equal(cost, 8, real=500, rounds=0)[500:].tolist()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_a_count_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="equal count"):
        deal_equal(np.ones(5), 2)


def test_equal_counts_balance_row_costs_closely():
    # 64 ranks x 90 rows of costs spread as packed rows' are (C*s + s^2 of nearly full rows)
    rng = np.random.default_rng(3)
    cost = 6144 * 32768 + rng.random(64 * 90) * 32768**2
    sums = np.bincount(deal_equal(cost, 64), cost, minlength=64)
    assert sums.max() / sums.mean() < 1.00001
