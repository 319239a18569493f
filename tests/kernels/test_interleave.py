"""wf2q_interleave: the compiled kernel against the Python loop (its fallback), and through plan_blend."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack import kernels as K
from sortpack.errors import SortpackError
from sortpack.inputs.mixture import Schedule
from sortpack.kernels import _loader
from sortpack.stages.mixture.blend import plan_blend

needs_c = pytest.mark.skipif(K.backend() != "c", reason="the compiled kernels are not built")
INF = float("inf")


@st.composite
def streams(draw):
    """Return (starts, finishes, sizes, total, stop_at): arbitrary streams, ties, infinities and stops included."""
    k = draw(st.integers(1, 6))
    grid = draw(st.sampled_from([1.0, 0.5, 0.1, 7.0]))  # a coarse grid makes ties frequent
    starts, finishes, sizes = [], [], []
    for _ in range(k):
        n = draw(st.integers(0, 30))
        m = np.array(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)), dtype=np.int64)
        # starts are the targets' inverse at the tokens before each unit: non-decreasing, maybe
        # past the prefix (rounding) or infinite (a source whose weight ends at zero)
        steps = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
        s = np.cumsum(np.array(steps, dtype=np.float64)) * grid
        f = s + np.array(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)), dtype=np.float64) * grid
        if n and draw(st.booleans()):
            cut = draw(st.integers(0, n - 1))
            f[cut:] = INF
            if draw(st.booleans()):
                s[cut + 1:] = INF
        starts.append(s)
        finishes.append(f)
        sizes.append(m)
    total = draw(st.one_of(st.integers(0, 2000).map(float), st.floats(0, 2000, allow_nan=False), st.just(INF)))
    stop_at = draw(st.one_of(st.none(), st.lists(st.integers(0, 30), min_size=k, max_size=k)))
    return starts, finishes, sizes, total, stop_at


def _both(monkeypatch, *args):
    compiled = K.wf2q_interleave(*args)
    with monkeypatch.context() as m:
        m.setattr(_loader, "_clib", None)
        m.setattr(_loader, "_warned", True)
        fallback = K.wf2q_interleave(*args)
    return compiled, fallback


def _picks_equal_the_python_loop(monkeypatch, case):
    """Check both backends against the pure-Python reference on one drawn case."""
    starts, finishes, sizes, total, stop_at = case
    compiled, fallback = _both(monkeypatch, starts, finishes, sizes, total, stop_at)
    assert compiled.dtype == fallback.dtype == np.int16
    assert compiled.tolist() == fallback.tolist()
    ends = stop_at if stop_at is not None else [len(s) for s in starts]
    ref = K.wf2q_reference([s.tolist() for s in starts], [f.tolist() for f in finishes],
                           [m.tolist() for m in sizes], total, [min(e, len(s)) for e, s in zip(ends, starts)])
    assert fallback.tolist() == ref


# the reference is pure Python: the profile's cases (tests/conftest.py; the full run in CI draws more)
test_compiled_picks_equal_the_python_loop = needs_c(given(streams())(_picks_equal_the_python_loop))


@needs_c
def test_edge_cases_compiled_and_fallback(monkeypatch):
    one = [np.array([0.0]), np.array([0.0])]
    cases = [
        # no source offers a unit
        ([np.zeros(0), np.zeros(0)], [np.zeros(0), np.zeros(0)], [np.zeros(0, np.int64)] * 2, 10.0, None, []),
        # a total below the first unit: nothing
        (one, [np.array([5.0]), np.array([5.0])], [np.array([100]), np.array([100])], 50.0, None, []),
        # equal finishes: the lower source first
        (one, [np.array([5.0]), np.array([5.0])], [np.array([5]), np.array([5])], 10.0, None, [0, 1]),
        # nothing started (rounding): the one that starts first, even past the prefix
        ([np.array([3.0]), np.array([2.0])], [np.array([4.0]), np.array([9.0])], [np.array([1]), np.array([1])],
         10.0, None, [1, 0]),
        # a started unit that never finishes beats a later start
        ([np.array([0.0]), np.array([1.0])], [np.array([INF]), np.array([2.0])], [np.array([1]), np.array([1])],
         10.0, None, [0, 1]),
        # every start infinite: stop
        ([np.array([INF]), np.array([INF])], [np.array([INF]), np.array([INF])], [np.array([1]), np.array([1])],
         10.0, None, []),
        # stop_at leaves a source out after its first unit
        ([np.array([0.0, 1.0]), np.array([0.0, 5.0])], [np.array([1.0, 2.0]), np.array([5.0, 9.0])],
         [np.array([1, 1]), np.array([4, 4])], 100.0, [1, 2], [0, 1, 1]),
        # the last unit that fits exactly ends the run at the total
        ([np.array([0.0, 3.0])], [np.array([3.0, 6.0])], [np.array([3, 3])], 6.0, None, [0, 0]),
        ([np.array([0.0, 3.0])], [np.array([3.0, 6.0])], [np.array([3, 3])], 5.999, None, [0]),
    ]
    for starts, finishes, sizes, total, stop_at, want in cases:
        compiled, fallback = _both(monkeypatch, starts, finishes, sizes, total, stop_at)
        assert compiled.tolist() == fallback.tolist() == want


def test_prefixes_past_2_53_fall_back_to_the_exact_loop(monkeypatch):
    """Beyond 2**53 a double cannot hold every prefix: the Python loop (exact int/float compares) decides."""
    big = 1 << 53
    # after the first unit the prefix is big + 3, which a double rounds to big + 4: source 1's
    # unit (start big + 4) has not started yet, so source 2's goes first
    starts = [np.array([0.0]), np.array([float(big + 4)]), np.array([0.0])]
    finishes = [np.array([1.0]), np.array([float(big + 5)]), np.array([2.0 ** 60])]
    sizes = [np.array([big + 3]), np.array([1]), np.array([1])]
    compiled, fallback = _both(monkeypatch, starts, finishes, sizes, INF, None)
    assert compiled.tolist() == fallback.tolist() == [0, 2, 1]


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="differ in length"):
        K.wf2q_interleave([np.zeros(2)], [np.zeros(1)], [np.zeros(2, np.int64)], 5.0)


@st.composite
def mixtures(draw):
    """Return plan_blend's arguments over random sources, schedules (zero weights too) and totals."""
    k = draw(st.integers(2, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    biggest = draw(st.sampled_from([1, 7, 100, 5000]))
    tokens = [rng.integers(1, biggest + 1, draw(st.integers(1, 60))).astype(np.int64) for _ in range(k)]
    stages = [np.sort(rng.integers(0, draw(st.integers(1, 3)), len(t))).astype(np.int16) for t in tokens]
    phases = draw(st.integers(1, 4))
    ends = np.array(sorted(set(draw(st.lists(st.floats(0.01, 0.99), min_size=phases - 1,
                                             max_size=phases - 1)))) + [1.0])
    w = rng.choice([0.0, 0.0, 0.05, 0.3, 1.0, 3.0], size=(len(ends), k))
    w[:, 0] += w.sum(axis=1) == 0
    w[0, w.sum(axis=0) == 0] = 0.5
    w /= w.sum(axis=1, keepdims=True)
    held = sum(int(t.sum()) for t in tokens)
    total = draw(st.one_of(st.none(), st.integers(max(1, held // 4), held * 6)))
    return tokens, stages, Schedule(ends, w), total, draw(st.integers(0, 2**32))


@needs_c
@given(mixtures())
def test_plan_blend_is_the_same_with_either_backend(monkeypatch, mix):
    tokens, stages, schedule, total, seed = mix
    try:
        a = plan_blend(tokens, stages, schedule, total, seed)
    except SortpackError:  # a total below the first micro-batch: the fallback refuses it too
        a = None
    with monkeypatch.context() as m:
        m.setattr(_loader, "_clib", None)
        m.setattr(_loader, "_warned", True)
        if a is None:
            with pytest.raises(SortpackError):
                plan_blend(tokens, stages, schedule, total, seed)
            return
        b = plan_blend(tokens, stages, schedule, total, seed)
    assert np.array_equal(a.source, b.source) and np.array_equal(a.unit, b.unit)
    assert np.array_equal(a.passes, b.passes) and a.total == b.total
