"""merge_sorted_runs / merge_sorted_runs2 against numpy's stable sorts."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack import kernels as K

TOP = np.iinfo(np.uint64).max


@st.composite
def runs(draw, max_k=40):
    """Return (runs of keys as lists, lo values) with many duplicates and empty runs."""
    k = draw(st.integers(1, max_k))
    span = draw(st.sampled_from([1, 3, 10, 2**64 - 1]))
    key = st.integers(0, span - 1) if span < 2**64 - 1 else st.sampled_from([0, 1, 2**63, TOP - 1, int(TOP)])
    return [draw(st.lists(key, max_size=25)) for _ in range(k)]


def as_runs(lists, lo_span=3, seed=0):
    """Return (hi, lo, offsets): each run sorted by (hi, lo)."""
    rng = np.random.default_rng(seed)
    his, los = [], []
    for run in lists:
        hi = np.asarray(run, dtype=np.uint64)
        lo = rng.integers(0, lo_span, len(hi)).astype(np.uint64)
        o = np.lexsort((lo, hi))
        his.append(hi[o])
        los.append(lo[o])
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in lists])]).astype(np.int64)
    def cat(xs):
        return np.concatenate(xs) if xs else np.zeros(0, np.uint64)
    return cat(his), cat(los), offsets


@given(runs())
def test_merge_matches_stable_argsort(lists):
    hi, lo, offsets = as_runs(lists)
    merged, perm = K.merge_sorted_runs(hi, offsets)
    ref = np.argsort(hi, kind="stable")
    np.testing.assert_array_equal(perm, ref)
    np.testing.assert_array_equal(merged, hi[ref])
    assert perm.dtype == np.int64 and merged.dtype == np.uint64
    np.testing.assert_array_equal(K.merge_sorted_runs2(hi, lo, offsets), np.lexsort((lo, hi)))


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 33, 64, 200])
def test_merge_larger(k):
    rng = np.random.default_rng(k)
    lens = rng.integers(0, 4000, k)
    lens[rng.integers(0, k)] = 0
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    hi = np.concatenate([np.sort(rng.integers(0, 50, m).astype(np.uint64)) for m in lens])
    lo = np.empty_like(hi)
    for a, b in zip(offsets[:-1], offsets[1:]):
        lo[a:b] = rng.integers(0, 2**64, b - a, dtype=np.uint64, endpoint=False)
        o = np.lexsort((lo[a:b], hi[a:b]))
        hi[a:b], lo[a:b] = hi[a:b][o], lo[a:b][o]
    merged, perm = K.merge_sorted_runs(hi, offsets)
    ref = np.argsort(hi, kind="stable")
    np.testing.assert_array_equal(perm, ref)
    np.testing.assert_array_equal(merged, hi[ref])
    np.testing.assert_array_equal(K.merge_sorted_runs2(hi, lo, offsets), np.lexsort((lo, hi)))


@given(st.lists(st.lists(st.integers(0, 6), max_size=12), min_size=1, max_size=6))
def test_unsorted_runs_still_give_the_stable_sort(lists):
    hi = np.asarray([x for run in lists for x in run], dtype=np.uint64)
    lo = (hi * np.uint64(7)) % np.uint64(3)
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in lists])]).astype(np.int64)
    merged, perm = K.merge_sorted_runs(hi, offsets)
    np.testing.assert_array_equal(perm, np.argsort(hi, kind="stable"))
    np.testing.assert_array_equal(merged, np.sort(hi, kind="stable"))
    np.testing.assert_array_equal(K.merge_sorted_runs2(hi, lo, offsets), np.lexsort((lo, hi)))


def test_bad_offsets():
    keys = np.arange(5, dtype=np.uint64)
    for offsets in ([0, 3], [1, 5], [0, 4, 3, 5], []):
        with pytest.raises(ValueError, match="offsets"):
            K.merge_sorted_runs(keys, offsets)
        with pytest.raises(ValueError, match="offsets"):
            K.merge_sorted_runs2(keys, keys, offsets)
    with pytest.raises(ValueError, match="same length"):
        K.merge_sorted_runs2(keys, keys[:3], [0, 5])


def test_empty():
    merged, perm = K.merge_sorted_runs(np.zeros(0, np.uint64), [0])
    assert len(merged) == len(perm) == 0
    assert len(K.merge_sorted_runs2(np.zeros(0, np.uint64), np.zeros(0, np.uint64), [0, 0, 0])) == 0


@given(runs())
def test_merge_keys_alone_equals_the_sort(lists):
    hi, _, offsets = as_runs(lists)
    merged = K.merge_sorted_keys(hi, offsets)
    assert merged.dtype == np.uint64
    np.testing.assert_array_equal(merged, np.sort(hi))


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_merge_keys_alone_large_unsorted_and_fallback(k, fallback):
    rng = np.random.default_rng(k)
    keys = rng.integers(0, 2**62, 50_000, dtype=np.uint64)
    offsets = np.linspace(0, len(keys), k + 1).astype(np.int64)
    runs_sorted = np.concatenate([np.sort(keys[a:b]) for a, b in zip(offsets[:-1], offsets[1:])])
    np.testing.assert_array_equal(fallback.merge_sorted_keys(runs_sorted, offsets), np.sort(keys))


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_merge_keys_alone_large_and_unsorted_runs(k):
    rng = np.random.default_rng(k)
    keys = rng.integers(0, 2**62, 50_000, dtype=np.uint64)
    offsets = np.linspace(0, len(keys), k + 1).astype(np.int64)
    runs_sorted = np.concatenate([np.sort(keys[a:b]) for a, b in zip(offsets[:-1], offsets[1:])])
    np.testing.assert_array_equal(K.merge_sorted_keys(runs_sorted, offsets), np.sort(keys))
    # runs that are not sorted still give the sort (the kernel notices and falls back)
    np.testing.assert_array_equal(K.merge_sorted_keys(keys, offsets), np.sort(keys))
    with pytest.raises(ValueError):
        K.merge_sorted_keys(keys, [0, 5])
