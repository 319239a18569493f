"""fit_pack (best fit over the budget and every cap) against its oracle, and the greedy under several caps."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_greedy import pack_cases

from sortpack import kernels as K
from sortpack.kernels.greedy import MAX_CAPS


@st.composite
def fit_cases(draw):
    """Return (sizes, kw) of greedy_pack's cases with K caps and windows."""
    sizes, kw = draw(pack_cases())
    n = len(sizes)
    k = draw(st.integers(0, 3))
    caps = np.asarray(draw(st.lists(st.lists(st.integers(0, 50), min_size=n, max_size=n), min_size=k, max_size=k)),
                      np.int64).reshape(k, n)
    cuts = sorted(set(draw(st.lists(st.integers(0, n), max_size=3))) | {0, n})
    kw = dict(kw, sizes2=caps if k else None, max2=draw(st.lists(st.integers(0, 150), min_size=k, max_size=k)),
              windows=cuts if n else None)
    return sizes, kw


def _same(got, want):
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@given(case=fit_cases())
def test_compiled_matches_reference(case):
    sizes, kw = case
    _same(K.fit_pack(sizes, **kw), K.fit_pack_reference(sizes, **kw))


@given(case=fit_cases())
def test_fallback_matches_reference(case, fallback):
    sizes, kw = case
    _same(fallback.fit_pack(sizes, **kw), K.fit_pack_reference(sizes, **kw))


@given(case=fit_cases())
def test_every_sample_once_each_bin_in_its_window_and_under_every_cap(case):
    sizes, kw = case
    order, bounds = K.fit_pack(sizes, **kw)
    assert sorted(order.tolist()) == list(range(len(sizes)))
    windows = np.asarray(kw["windows"] if kw["windows"] is not None else [0, len(sizes)])
    caps = kw["sizes2"]
    for a, b in zip(bounds[:-1], bounds[1:]):
        members = order[a:b]
        assert len(set(np.searchsorted(windows, members, side="right").tolist())) == 1
        if b - a > 1 and caps is not None:  # a sample alone may be over a cap: the stage filters those first
            assert (caps[:, members].sum(axis=1) <= np.asarray(kw["max2"])).all()


def test_a_bin_takes_the_largest_sample_that_still_fits():
    # window in visiting order: 6 opens, 5 does not fit beside it (cap 10), 4 does; then 3 opens the next
    order, bounds = K.fit_pack([6, 5, 4, 3, 1], 10, "tokens")
    assert [order[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])] == [[0, 2], [1, 3, 4]]


def test_caps_bind_on_other_samples_than_the_budget():
    # a sorted order holds runs of one kind: text-heavy samples, then image-heavy ones; the greedy's runs
    # waste room under the cap that binds on the other kind, best fit pairs one of each
    sizes = np.array([900, 900, 900, 900, 100, 100, 100, 100])
    images = np.array([0, 0, 0, 0, 90, 90, 90, 90])
    assert len(K.greedy_pack(sizes, 1000, "tokens", sizes2=[images], max2=[100])) - 1 == 7
    order, bounds = K.fit_pack(sizes, 1000, "tokens", sizes2=[images], max2=[100])
    assert len(bounds) - 1 == 4
    assert all(sorted(sizes[order[a:b]].tolist()) == [100, 900] for a, b in zip(bounds[:-1], bounds[1:]))


def test_batch_multiple_gives_back_the_rest():
    order, bounds = K.fit_pack([5, 5, 5, 5, 5], 15, "tokens", batch_multiple=2)
    assert np.diff(bounds).tolist() == [2, 2, 1]


def test_several_caps_in_the_greedy_match_its_reference():
    rng = np.random.default_rng(3)
    sizes = rng.integers(0, 60, 400)
    caps = rng.integers(0, 30, (3, 400))
    got = K.greedy_pack(sizes, 300, "tokens", sizes2=caps, max2=[100, 80, 120])
    np.testing.assert_array_equal(got, K.greedy_pack_reference(sizes, 300, "tokens", sizes2=caps,
                                                               max2=[100, 80, 120]))
    for a, b in zip(got[:-1], got[1:]):
        assert (caps[:, a:b].sum(axis=1) <= [100, 80, 120]).all()


@pytest.mark.parametrize("bad", [
    dict(sizes2=np.zeros((2, 3), np.int64), max2=[1]),  # a cap count unlike the rows'
    dict(sizes2=np.zeros((1, 4), np.int64), max2=[1]),  # not one value per sample
    dict(sizes2=np.zeros((MAX_CAPS + 1, 3), np.int64), max2=[1] * (MAX_CAPS + 1)),
    dict(windows=[0, 2]),  # windows that do not cover the samples
    dict(sizes2=-np.ones((1, 3), np.int64), max2=[1]),
])
def test_bad_arguments_are_refused(bad):
    with pytest.raises(ValueError):
        K.fit_pack([1, 2, 3], 10, "tokens", **bad)


@pytest.mark.parametrize("budget", K.BUDGETS)
@pytest.mark.parametrize("max_tokens", [2**62, 2**63 - 1, 1e18])
def test_the_fallback_never_fits_a_sum_past_int64(budget, max_tokens, fallback):
    # sums, products and squares past int64 never fit (the compiled kernel's checked arithmetic); the fallback's
    # wrapped below 0 and took samples the reference leaves out
    sizes = np.asarray([2**61, 2**61, 2**62, 5, 3037000500, 2**40, 2**62, 0, 1, 2**62 + 7], np.int64)
    for kw in ({}, {"pad_multiple": 8}, {"sizes2": sizes[::-1].copy(), "max2": 2**63 - 1}):
        _same(fallback.fit_pack(sizes, max_tokens, budget, **kw), K.fit_pack_reference(sizes, max_tokens, budget, **kw))
