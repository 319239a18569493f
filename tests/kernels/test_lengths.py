"""The exact choice of padded lengths (``optimal_lengths``) against a brute-force oracle, C
against numpy, a log-normal figure, and ``batch_capacity`` against the greedy."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack import kernels as K
from sortpack.kernels import _loader
from sortpack.kernels.lengths import _optimal_lengths_fallback

from support import lognormal, rounding_padding


def padded_total(values, counts, lengths):
    lengths = np.asarray(lengths)
    return int((np.asarray(counts) * lengths[np.searchsorted(lengths, values)]).sum())


def brute_force(values, counts, k):
    """Return the least padded total over every choice of at most k lengths that covers the max."""
    values, counts = np.asarray(values), np.asarray(counts)
    best = None
    for r in range(min(k, len(values))):
        for sub in itertools.combinations(values[:-1].tolist(), r):
            total = padded_total(values, counts, np.array(sorted(sub) + [values[-1]]))
            best = total if best is None else min(best, total)
    return best


# --- the kernel -------------------------------------------------------------------------------------
@given(hist=st.dictionaries(st.integers(1, 60), st.integers(1, 9), min_size=1, max_size=9), k=st.integers(1, 6))
def test_optimal_lengths_equal_brute_force(hist, k):
    values = np.array(sorted(hist), np.int64)
    counts = np.array([hist[v] for v in values], np.int64)
    got = K.optimal_lengths(values, counts, k)
    assert 1 <= len(got) <= k and got[-1] == values[-1]
    assert np.all(np.isin(got, values)) and np.all(np.diff(got) > 0)
    assert padded_total(values, counts, got) == brute_force(values, counts, k)
    if k < len(values):
        # the numpy fallback runs the same DP with the same tie-breaking: identical lengths
        prefix = np.concatenate(([0], np.cumsum(counts)))
        assert np.array_equal(_optimal_lengths_fallback(values, prefix, k), got)


def test_c_and_numpy_agree_on_large_histograms(fallback, monkeypatch):
    rng = np.random.default_rng(1)
    values = np.unique(rng.integers(1, 200_000, 20_000))
    counts = rng.integers(1, 30, len(values))
    numpy_result = [K.optimal_lengths(values, counts, k) for k in (2, 7, 16)]
    lib = _loader._load_clib()
    if lib is None:
        pytest.skip("compiled kernels not built")
    monkeypatch.setattr(_loader, "_clib", lib)
    for k, want in zip((2, 7, 16), numpy_result):
        assert np.array_equal(K.optimal_lengths(values, counts, k), want)


def test_lognormal_optimum_beats_powers_of_two():
    # the figure: 200k log-normal sizes (median 300, max 4096), K = 8
    sizes = lognormal(200_000)
    values, counts = np.unique(sizes, return_counts=True)
    lengths = K.optimal_lengths(values, counts, 8)
    assert len(lengths) == 8 and lengths[-1] == 4096
    assert rounding_padding(sizes, lengths) == pytest.approx(0.214, abs=0.002)
    assert rounding_padding(sizes, [256, 512, 1024, 2048, 4096]) == pytest.approx(0.325, abs=0.002)
    assert rounding_padding(sizes, 2 ** np.arange(0, 13)) == pytest.approx(0.295, abs=0.002)
    # no 8 powers of two do better than the optimum, and neither does one more length removed
    assert rounding_padding(sizes, 2 ** np.arange(5, 13)) > rounding_padding(sizes, lengths) + 0.07
    assert padded_total(values, counts, K.optimal_lengths(values, counts, 7)) > padded_total(values, counts, lengths)


def test_optimal_lengths_edge_cases():
    assert K.optimal_lengths([], [], 3).tolist() == []
    assert K.optimal_lengths([5, 9], [1, 1], 8).tolist() == [5, 9]  # k >= d: every size, no padding
    assert K.optimal_lengths([5, 9], [1, 1], 1).tolist() == [9]
    for bad in (([3, 2], [1, 1], 2), ([0, 2], [1, 1], 2), ([1, 2], [1, 0], 2), ([1, 2], [1, 1], 0)):
        with pytest.raises(ValueError):
            K.optimal_lengths(*bad)
    with pytest.raises(ValueError, match="62 bits"):
        K.optimal_lengths([2**40], [2**30], 2)


@given(length=st.integers(1, 500), max_tokens=st.integers(1, 5000),
       budget=st.sampled_from((*K.BUDGETS, K.KernelCost(True, True))), q=st.sampled_from([1.0, 7.0, 300.0]),
       max_samples=st.sampled_from([0, 3, 50]))
def test_batch_capacity_is_what_the_greedy_packs_at_that_length(length, max_tokens, budget, q, max_samples):
    cap = int(K.batch_capacity([length], max_tokens, budget, q, max_samples)[0])
    # cap + 1 samples of exactly that length, rounded to themselves: the greedy's first micro-batch
    bounds = K.greedy_pack([length] * (cap + 1), max_tokens, budget, max_samples, quadratic_scale=q,
                           shapes=[length])
    if cap == 0:
        alone = length + length * length / q if K.COSTS.get(budget, budget)[1] else length
        assert alone > max_tokens
    else:
        assert bounds[1] == cap
