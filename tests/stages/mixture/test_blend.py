"""The blend: the prefix bound and exact seeded repeats, as properties over random mixtures."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.errors import SortpackError
from sortpack.inputs.schedule import Schedule, deviations
from sortpack.stages.mixture.blend import pass_order, plan_blend


@st.composite
def mixtures(draw):
    """Return (unit tokens per source, unit stages per source, schedule, total_tokens or None, seed)."""
    k = draw(st.integers(2, 5))
    biggest = draw(st.sampled_from([1, 7, 100, 5000]))
    tokens, stages = [], []
    for _ in range(k):
        n = draw(st.integers(1, 40))
        kind = draw(st.sampled_from(["random", "constant", "one big"]))
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        if kind == "random":
            t = rng.integers(1, biggest + 1, n)
        elif kind == "constant":
            t = np.full(n, int(rng.integers(1, biggest + 1)))
        else:
            t = np.ones(n, np.int64)
            t[rng.integers(n)] = biggest
        tokens.append(t.astype(np.int64))
        stages.append(np.sort(rng.integers(0, draw(st.integers(1, 3)), n)).astype(np.int16))
    phases = draw(st.integers(1, 4))
    cuts = sorted(set(draw(st.lists(st.floats(0.01, 0.99), min_size=phases - 1, max_size=phases - 1))))
    ends = np.array(cuts + [1.0])
    w = np.array([[draw(st.sampled_from([0.0, 0.0, 0.05, 0.3, 1.0, 3.0])) for _ in range(k)]
                  for _ in range(len(ends))])
    w[:, 0] += w.sum(axis=1) == 0  # every phase has some weight
    for s in range(k):
        if w[:, s].sum() == 0:
            w[draw(st.integers(0, len(ends) - 1)), s] = 0.5  # every source has some share
    w /= w.sum(axis=1, keepdims=True)
    held = sum(int(t.sum()) for t in tokens)
    total = draw(st.one_of(st.none(), st.integers(max(1, held // 4), held * 6)))
    return tokens, stages, Schedule(ends, w), total, draw(st.integers(0, 2**32))


def _plan_tokens(tokens, blend):
    out = np.zeros(len(blend), np.int64)
    for s, t in enumerate(tokens):
        mine = blend.source == s
        out[mine] = t[blend.unit[mine]]
    return out
@given(mixtures())
@pytest.mark.slow
def test_every_prefix_is_within_the_largest_microbatch_of_the_schedule(mix):
    tokens, stages, schedule, total, seed = mix
    try:
        blend = plan_blend(tokens, stages, schedule, total, seed)
    except SortpackError as exc:
        assert "smaller than the first micro-batch" in str(exc) or "passes over its" in str(exc)
        return
    planned = _plan_tokens(tokens, blend)
    largest = max(int(t.max()) for t in tokens)
    assert blend.bound == largest
    dev = deviations(planned, blend.source, schedule, blend.total)
    # the bound is the largest micro-batch the sources' packing made, at every prefix and breakpoint
    assert dev.max() <= largest + 1e-9 * blend.total, (dev, largest)
    assert planned.sum() <= blend.total + 1e-9
    if total is not None:
        assert planned.sum() > total - max(int(t.max()) for t in tokens)  # the run stops within a unit of it
@given(mixtures())
@pytest.mark.slow
def test_repeats_are_whole_passes_plus_a_seeded_part_pass(mix):
    tokens, stages, schedule, total, seed = mix
    try:
        blend = plan_blend(tokens, stages, schedule, total, seed)
    except SortpackError:
        return
    for s, t in enumerate(tokens):
        mine = blend.source == s
        uses = np.bincount(blend.unit[mine], minlength=len(t))
        r = int(t[blend.unit[mine]].sum()) / int(t.sum())
        # every sample of the source (every unit's samples) appears floor(r) or ceil(r) times
        assert set(uses.tolist()) <= {math.floor(r), math.ceil(r)}, (uses, r)
        if total is None:
            assert uses.max() <= 1  # without total_tokens no sample is used twice
        # what a source gives is a prefix of its visiting order: whole passes, then the start of
        # the next pass's seeded order
        whole = int(uses.min())
        extra = np.flatnonzero(uses > whole)
        order = pass_order(len(t), seed, s, whole)
        assert sorted(extra.tolist()) == sorted(order[:len(extra)].tolist())
        # each use records its pass: the c-th use of a unit is pass c
        for p in range(int(uses.max()) if len(uses) else 0):
            in_pass = blend.unit[mine & (blend.passes == p)]
            assert len(np.unique(in_pass)) == len(in_pass)


def test_most_behind_first_breaks_the_bound_that_wf2q_keeps():
    """The rule "the source most behind goes next" lets a source fall over a micro-batch behind."""
    weights = np.array([0.954, 0.045, 0.001])
    rng = np.random.default_rng(2475)
    streams = [rng.integers(1, 101, 400), np.full(400, 100), rng.integers(1, 101, 400)]
    schedule = Schedule(np.array([1.0]), weights[None, :])
    # the greedy by largest deficit
    x, got, worst, largest = 0, np.zeros(3), 0.0, 0
    ptr = [0, 0, 0]
    for _ in range(300):
        s = int(np.argmax(weights * x - got))
        m = int(streams[s][ptr[s]])
        ptr[s] += 1
        got[s] += m
        x += m
        largest = max(largest, m)
        worst = max(worst, float(np.abs(weights * x - got).max()))
    blend = plan_blend([np.asarray(t) for t in streams], [np.zeros(400, np.int16)] * 3, schedule, x, 0)
    planned = _plan_tokens(streams, blend)
    assert deviations(planned, blend.source, schedule, blend.total).max() <= planned.max()
    assert worst > largest, "the counterexample no longer breaks the greedy rule"


def test_stages_order_a_source_while_it_gives_a_uniform_subset():
    tokens = [np.full(400, 10, np.int64), np.full(50, 10, np.int64)]
    stages = [np.repeat(np.arange(4, dtype=np.int16), 100), np.zeros(50, np.int16)]
    schedule = Schedule(np.array([1.0]), np.array([[0.5, 0.5]]))
    blend = plan_blend(tokens, stages, schedule, 1000, seed=3)  # 50 of source 0's 400 units
    used = blend.unit[blend.source == 0]
    assert len(used) == 50
    got = stages[0][used]
    assert np.all(np.diff(got[:-2]) >= 0)  # curriculum: stages ascend as the run advances
    assert len(np.unique(got)) >= 3  # the subset spans the stages, not the easiest alone


@pytest.mark.parametrize("total", [None, 3000])
def test_the_blend_depends_on_the_seed_only_through_the_orders(total):
    tokens = [np.arange(1, 41, dtype=np.int64), np.arange(1, 21, dtype=np.int64)]
    stages = [np.zeros(40, np.int16), np.zeros(20, np.int16)]
    schedule = Schedule(np.array([1.0]), np.array([[0.7, 0.3]]))
    a = plan_blend(tokens, stages, schedule, total, 1)
    b = plan_blend(tokens, stages, schedule, total, 1)
    c = plan_blend(tokens, stages, schedule, total, 2)
    assert np.array_equal(a.unit, b.unit) and np.array_equal(a.source, b.source)
    assert not np.array_equal(a.unit, c.unit)


def test_a_total_below_one_microbatch_is_refused():
    schedule = Schedule(np.array([1.0]), np.array([[0.5, 0.5]]))
    with pytest.raises(SortpackError, match="smaller than the first micro-batch"):
        plan_blend([np.full(3, 100, np.int64), np.full(3, 100, np.int64)], [np.zeros(3, np.int16)] * 2,
                   schedule, 50, 0)


@pytest.mark.parametrize("total, message", [(10**9, "1.67e\\+08 passes over its 3 tokens; at most 10000"),
                                            (2**40, "passes over its 3 tokens")])
def test_an_absurd_total_is_refused_before_planning(total, message):
    # a plan that needs 10**8+ passes per source is refused before any is built (no hang)
    schedule = Schedule(np.array([1.0]), np.array([[0.5, 0.5]]))
    tokens = [np.ones(3, np.int64), np.full(1000, 7, np.int64)]
    with pytest.raises(SortpackError, match=message):
        plan_blend(tokens, [np.zeros(3, np.int16), np.zeros(1000, np.int16)], schedule, total, 0, ["a", "b"])


def test_a_plan_of_too_many_units_is_refused(monkeypatch):
    from sortpack.stages.mixture import blend

    monkeypatch.setattr(blend, "MAX_PLAN_UNITS", 100)
    schedule = Schedule(np.array([1.0]), np.array([[1.0]]))
    with pytest.raises(SortpackError, match="about 200 micro-batches; at most 100"):
        plan_blend([np.ones(50, np.int64)], [np.zeros(50, np.int16)], schedule, 200, 0)
