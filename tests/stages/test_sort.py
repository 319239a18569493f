"""Sorting on one rank: total order on (key, sample_id), directions, float keys, stages."""
from __future__ import annotations

import numpy as np
import pytest

from sortpack.errors import SortpackError
from sortpack.parallel import SerialComm
from sortpack.stages.samples import SampleColumns
from sortpack.stages.sort import SortOptions, _rising, sort_samples


def samples_of(size, difficulty=None, start=0, total=None):
    size = np.asarray(size, dtype=np.int64)
    diff = size if difficulty is None else np.asarray(difficulty)
    ids = np.arange(start, start + len(size), dtype=np.int64)
    return SampleColumns(start, total or len(size), ids, size, diff)


def expected_order(key, descending=False):
    ids = np.arange(len(key))
    k = -np.asarray(key, dtype=np.float64) if descending else np.asarray(key, dtype=np.float64)
    return np.lexsort((ids, k))


@pytest.mark.parametrize("descending", [False, True])
def test_size_sort_is_total_order_with_id_ties(descending):
    rng = np.random.default_rng(0)
    size = rng.integers(0, 50, size=5000)  # heavy duplicates
    out = sort_samples(SerialComm(), samples_of(size), SortOptions(descending=descending), 1 << 20)
    assert out.sample_id.tolist() == expected_order(size, descending).tolist()
    assert out.size.tolist() == size[out.sample_id].tolist()
    assert np.all(out.stage == 0)


def test_float_difficulty_uses_pair_sort():
    rng = np.random.default_rng(1)
    size = rng.integers(1, 1000, size=3000)
    diff = rng.normal(size=3000).round(2)  # negative floats and ties
    diff = np.abs(diff)
    out = sort_samples(SerialComm(), samples_of(size, diff), SortOptions(key="difficulty"), 1 << 20)
    assert out.sample_id.tolist() == expected_order(diff).tolist()
    assert np.array_equal(out.difficulty, diff[out.sample_id])
    assert np.array_equal(out.size, size[out.sample_id])


def test_stages_are_exact_quantiles_ordered_by_size_inside():
    rng = np.random.default_rng(2)
    n, k = 1000, 4
    size = rng.integers(1, 100, size=n)
    diff = rng.integers(0, 30, size=n).astype(np.float64)
    out = sort_samples(SerialComm(), samples_of(size, diff), SortOptions(key="difficulty", stages=k), 1 << 20)
    by_difficulty = expected_order(diff)
    expect_stage = np.empty(n, np.int64)
    expect_stage[by_difficulty] = (np.arange(n) * k) // n
    assert np.array_equal(out.stage, expect_stage[out.sample_id])
    assert np.all(np.diff(out.stage) >= 0)
    for s in range(k):
        inside = out.size[out.stage == s]
        assert np.all(np.diff(inside) >= 0)
    assert sorted(out.sample_id.tolist()) == list(range(n))


def test_bad_sort_options():
    with pytest.raises(SortpackError):
        SortOptions(key="nope").validate()
    with pytest.raises(SortpackError):
        SortOptions(stages=0).validate()


@pytest.mark.parametrize("n", [0, 1, 2, 5, 8, 9])
def test_rising_ids_are_checked_a_block_at_a_time(n):
    ids = np.arange(10, 10 + n, dtype=np.int64)
    for block in (1, 2, 3, 8, 100):
        assert _rising(ids, block)
        for i in range(n - 1):  # a tie anywhere, a block's edge included
            tied = ids.copy()
            tied[i + 1] = tied[i]
            assert not _rising(tied, block)
