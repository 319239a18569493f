"""Exact splitters of the sample sort, as pure planning against an oracle (one rank holds every key)."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sortpack.parallel import SerialComm
from sortpack.stages.sample_sort import SortHints, exact_cuts, narrow, probe_values, sample_sort


@given(st.data())
def test_exact_cuts_land_on_every_target(data):
    # unique keys anywhere in uint64 (ends included), any rising targets including 0 and the total
    anywhere = st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 40), st.integers(2**64 - 40, 2**64 - 1))
    keys = data.draw(st.sets(anywhere, max_size=200))
    hi = np.array(sorted(keys), dtype=np.uint64)
    n = len(hi)
    inner = sorted(data.draw(st.lists(st.integers(0, n), max_size=6)))
    targets = np.array([0, *inner, n], dtype=np.int64)
    cuts = exact_cuts(SerialComm(), hi, targets)
    # one rank: its cut for each target is the target itself
    np.testing.assert_array_equal(cuts, targets)


@given(st.integers(1, 3), st.integers(1, 500), st.integers(1, 9))
def test_probe_search_finds_the_least_value_reaching_each_target(step, n, probes):
    keys = np.arange(n, dtype=np.uint64) * np.uint64(step) + np.uint64(7)  # count(keys < v) known in closed form
    targets = np.unique(np.linspace(1, n, 5).astype(np.int64))
    below = np.full(len(targets), 6, dtype=object)  # count(keys < 6) = 0 < every target
    above = np.full(len(targets), int(keys[-1]) + 1, dtype=object)
    rounds = 0
    while np.any(above - below > 1):
        vals = probe_values(below, above, probes)
        assert all(b < v < a for row, b, a in zip(vals, below, above) if a - b > 1 for v in row)
        assert all(list(row) == sorted(row) for row in vals)
        counts = np.searchsorted(keys, vals.astype(np.uint64), side="left")
        below, above = narrow(below, above, vals, counts, targets)
        rounds += 1
        assert rounds < 200
    # the splitter of target t is the least v with count(keys < v) >= t: one past key t-1
    np.testing.assert_array_equal(above.astype(np.uint64), keys[targets - 1] + np.uint64(1))


def test_one_rank_sample_sort_with_targets_sorts():
    rng = np.random.default_rng(3)
    hi = rng.permutation(1000).astype(np.uint64) << np.uint64(20)
    out = sample_sort(SerialComm(), hi.copy(), None, {}, SortHints(targets=np.array([0, 1000])))
    np.testing.assert_array_equal(out.hi, np.sort(hi))
