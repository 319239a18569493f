"""pack_rows / pack_rows_windows: validity, the oracle, fill, determinism."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack import kernels as K


def lognormal(n, seed=0, median=300.0, sigma=1.0, cap=8192):
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(median), sigma, n)), 1, cap).astype(np.int64)


def check_valid(sizes, order, splits, row_len, max_segments):
    n = len(sizes)
    assert order.dtype == np.int64 and splits.dtype == np.int64
    np.testing.assert_array_equal(np.sort(order), np.arange(n))  # every sample exactly once
    assert splits[0] == 0 and splits[-1] == n
    counts = np.diff(splits)
    assert np.all(counts > 0)
    if max_segments:
        assert counts.max(initial=0) <= max_segments
    if n:
        tokens = np.add.reduceat(sizes[order], splits[:-1])
        assert tokens.max() <= row_len


def windowed_reference(sizes, row_len, max_segments, window):
    n = len(sizes)
    w = n if window <= 0 or window > n else window
    orders, splits = [], [np.zeros(1, np.int64)]
    for w0 in range(0, n, max(w, 1)):
        o, s = K.pack_rows_reference(sizes[w0:w0 + w], row_len, max_segments)
        orders.append(o + w0)
        splits.append(s[1:] + w0)
    return (np.concatenate(orders) if orders else np.zeros(0, np.int64)), np.concatenate(splits)


@given(st.integers(1, 120).flatmap(lambda R: st.tuples(
    st.just(R), st.lists(st.integers(0, R), max_size=80), st.sampled_from([0, 0, 1, 2, 3, 7]),
    st.sampled_from([0, 1, 5, 16, 1000]))))
def test_matches_reference_and_is_valid(case):
    row_len, sizes, max_segments, window = case
    sizes = np.asarray(sizes, dtype=np.int64)
    order, splits = K.pack_rows_windows(sizes, row_len, max_segments, window)
    check_valid(sizes, order, splits, row_len, max_segments)
    ref_order, ref_splits = windowed_reference(sizes, row_len, max_segments, window)
    np.testing.assert_array_equal(order, ref_order)
    np.testing.assert_array_equal(splits, ref_splits)


def test_output_order_is_documented_one():
    sizes = np.array([5, 1, 9, 3, 4, 6, 2], dtype=np.int64)
    order, splits = K.pack_rows(sizes, 10)
    rows = [order[a:b].tolist() for a, b in zip(splits[:-1], splits[1:])]
    # by size: 9 opens A (room 1), 6 opens B (room 4), 5 opens C (room 5); 4 -> B, the
    # tightest room >= 4; 3 -> C (rooms 0, 1, 5); 2 -> C (room 2); 1 -> A (room 1)
    # rows by the position of their first (largest) sample, samples by position
    assert rows == [[0, 3, 6], [1, 2], [4, 5]]


def test_fill_lognormal_default_window():
    sizes = lognormal(100_000, seed=1)
    order, splits = K.pack_rows_windows(sizes, 8192)
    check_valid(sizes, order, splits, 8192, 0)
    fill = sizes.sum() / ((len(splits) - 1) * 8192)
    assert fill >= 0.997, fill


def test_windows_are_independent_and_deterministic():
    sizes = lognormal(20_000, seed=2, median=600, cap=4096)
    order, splits = K.pack_rows_windows(sizes, 4096, 8, 5000)
    again = K.pack_rows_windows(sizes.copy(), 4096, 8, 5000)
    np.testing.assert_array_equal(order, again[0])
    np.testing.assert_array_equal(splits, again[1])
    # the third window packed alone gives the same rows, shifted
    o3, s3 = K.pack_rows(sizes[10_000:15_000], 4096, 8)
    first = np.searchsorted(splits, 10_000)
    last = np.searchsorted(splits, 15_000)
    np.testing.assert_array_equal(order[10_000:15_000], o3 + 10_000)
    np.testing.assert_array_equal(splits[first:last + 1], s3 + 10_000)


def test_small_window_long_rows_uses_comparison_sort():
    # window * 4 < row_len switches the visit order to a comparison sort: same result
    rng = np.random.default_rng(5)
    sizes = rng.integers(0, 100_000, 300)
    got = K.pack_rows_windows(sizes, 100_000, 0, 50)
    ref = windowed_reference(sizes, 100_000, 0, 50)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])


def test_errors_and_edges():
    with pytest.raises(ValueError, match="outside"):
        K.pack_rows([5, 11], 10)
    with pytest.raises(ValueError, match="outside"):
        K.pack_rows([5, -1], 10)
    with pytest.raises(ValueError, match="max_segments"):
        K.pack_rows([5], 10, -1)
    order, splits = K.pack_rows(np.zeros(0, np.int64), 10)
    assert len(order) == 0 and splits.tolist() == [0]
    order, splits = K.pack_rows([0, 0, 10, 0], 10)
    check_valid(np.array([0, 0, 10, 0]), order, splits, 10, 0)
    assert len(splits) == 2  # zero-size samples join the full row
    order, splits = K.pack_rows([3, 3, 3], 10, max_segments=1)
    assert splits.tolist() == [0, 1, 2, 3]
