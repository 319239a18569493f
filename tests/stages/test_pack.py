"""Packing: the default padded budget equals the sequential greedy; the other budgets,
shapes, groups and oversize policies keep their promises."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.errors import SortpackError
from sortpack.parallel import SerialComm
from sortpack.stages.pack import PackOptions, pack_samples
from sortpack.stages.samples import SampleColumns

from support import greedy_oracle as oracle


def sorted_samples(sizes, stage=None) -> SampleColumns:
    sizes = np.asarray(sizes, dtype=np.int64)
    order = np.lexsort((np.arange(len(sizes)), sizes))
    return SampleColumns(0, len(sizes), order.astype(np.int64), sizes[order], sizes[order],
                   None if stage is None else np.asarray(stage, np.int16)[order])


def microbatches(mbs):
    return [mbs.sample_ids[a:b].tolist() for a, b in zip(mbs.offsets[:-1], mbs.offsets[1:])]


def pack(sizes, **kw):
    samples = sorted_samples(sizes)
    return samples, pack_samples(SerialComm(), samples, PackOptions(**kw))


@given(sizes=st.lists(st.integers(1, 300), min_size=0, max_size=400),
       max_tokens=st.integers(300, 3000), max_samples=st.sampled_from([0, 1, 3, 17]),
       batch_multiple=st.integers(1, 8))
def test_padded_budget_equals_sequential_greedy(sizes, max_tokens, max_samples, batch_multiple):
    samples, mbs = pack(sizes, max_tokens=max_tokens, max_samples=max_samples, batch_multiple=batch_multiple)
    ordered = samples.size.tolist()
    expect = [[int(samples.sample_id[j]) for j in b] for b in oracle(ordered, max_tokens, max_samples,
                                                                        batch_multiple)]
    assert microbatches(mbs) == expect
    got = mbs.columns
    assert np.all(got["num_samples"].astype(np.int64) * got["max_size"] <= max_tokens)
    if batch_multiple > 1:
        counts = got["num_samples"][:-1]  # the last micro-batch takes whatever is left
        assert np.all((counts % batch_multiple == 0) | (counts < batch_multiple))


def test_200k_uniform_matches_greedy_count_and_padding():
    rng = np.random.default_rng(0)
    sizes = rng.integers(128, 4096, size=200_000)
    samples, mbs = pack(sizes, max_tokens=500_000)
    s = np.sort(sizes).tolist()
    # the plain greedy on ascending sizes: the current sample is the max
    count, start, padded = 0, 0, 0
    for i, v in enumerate(s):
        if (i - start + 1) * v > 500_000:
            padded += (i - start) * s[i - 1]
            count += 1
            start = i
    padded += (len(s) - start) * s[-1]
    count += 1
    assert mbs.stats["num_microbatches"] == count
    assert mbs.stats["padding_ratio"] == pytest.approx(1 - sum(s) / padded, abs=1e-12)
    assert sorted(mbs.sample_ids.tolist()) == list(range(200_000))


def cost(batch, budget, q=None):
    batch = np.asarray(batch, dtype=np.float64)
    if budget == "padded":
        return len(batch) * batch.max()
    if budget == "tokens":
        return batch.sum()
    return (batch + batch * batch / q).sum()


@pytest.mark.parametrize("budget", ["padded", "tokens", "quadratic"])
def test_every_budget_is_respected_and_maximal(budget):
    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 2000, size=3000)
    q = 512.0 if budget == "quadratic" else None
    samples, mbs = pack(sizes, max_tokens=20_000, budget=budget, quadratic_scale=q)
    order = samples.size
    bounds = mbs.offsets
    for a, b in zip(bounds[:-1], bounds[1:]):
        assert cost(order[a:b], budget, q) <= 20_000
        if b < len(order):
            assert cost(order[a:b + 1], budget, q) > 20_000
    assert sorted(mbs.sample_ids.tolist()) == list(range(3000))


def test_segments_restart_greedy_and_stages_never_mix():
    rng = np.random.default_rng(2)
    sizes = rng.integers(1, 100, size=1000)
    stage = (np.arange(1000) * 3) // 1000
    samples = SampleColumns(0, 1000, np.arange(1000), np.sort(sizes), np.sort(sizes), stage.astype(np.int16))
    mbs = pack_samples(SerialComm(), samples, PackOptions(max_tokens=1000, segment_size=256))
    for a, b in zip(mbs.offsets[:-1], mbs.offsets[1:]):
        assert len(set(stage[a:b])) == 1
        assert a // 256 == (b - 1) // 256
    assert mbs.sample_ids.tolist() == list(range(1000))


def test_pad_to_multiple_and_shapes_round_padded_length():
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 1000, size=2000)
    _, mbs = pack(sizes, max_tokens=8192, pad_to_multiple=64)
    ps, ns = mbs.columns["padded_size"], mbs.columns["num_samples"].astype(np.int64)
    assert np.all(ps % 64 == 0) and np.all(ps >= mbs.columns["max_size"]) and np.all(ns * ps <= 8192)
    shapes = (128, 256, 512, 1024)
    _, mbs = pack(sizes, max_tokens=8192, shapes=shapes)
    ps, ns = mbs.columns["padded_size"], mbs.columns["num_samples"]
    assert set(ps.tolist()) <= set(shapes)
    assert np.all(ns.astype(np.int64) * ps <= 8192)
    assert mbs.stats["distinct_shapes"] <= len(shapes) * len(np.unique(ns))


def test_an_empty_same_shape_microbatch_takes_its_own_groups_stage():
    # stage 0 holds one sample: its group of 3 micro-batches has 2 empty ones, which must not
    # take the stage of the next group's first sample (a mixture's groups then straddle sources)
    size = np.array([7, 3, 4, 5, 6, 8], dtype=np.int64)
    stage = np.array([0, 1, 1, 1, 1, 1], dtype=np.int16)
    samples = SampleColumns(0, 6, np.arange(6, dtype=np.int64), size, size, stage)
    mbs = pack_samples(SerialComm(), samples, PackOptions(max_tokens=1000, group_size=3, same_shape=True))
    c = mbs.columns
    assert c["num_samples"][:3].tolist() == [1, 0, 0]
    assert c["stage"].reshape(-1, 3).tolist() == [[0, 0, 0]] + [[1, 1, 1]] * (len(c["stage"]) // 3 - 1)


def test_same_shape_groups_share_shape_and_mark_padding():
    rng = np.random.default_rng(4)
    sizes = rng.integers(1, 500, size=1234)
    samples, mbs = pack(sizes, max_tokens=4000, group_size=4, same_shape=True)
    c = mbs.columns
    m = len(c["num_samples"])
    assert m % 4 == 0
    bs, ps = c["batch_size"].reshape(-1, 4), c["padded_size"].reshape(-1, 4)
    assert np.all(bs == bs[:, :1]) and np.all(ps == ps[:, :1])
    assert np.all(c["num_samples"] <= c["batch_size"])
    assert np.all(c["batch_size"].astype(np.int64) * c["padded_size"] <= 4000)
    assert np.all(c["max_size"] <= c["padded_size"])
    ids = mbs.sample_ids.tolist()
    assert sorted(ids) == list(range(1234)) and len(ids) == len(set(ids))


def test_oversize_policies():
    sizes = [10, 20, 5000, 30, 7000]
    with pytest.raises(SortpackError, match="2 samples do not fit"):
        pack(sizes, max_tokens=100)
    samples, mbs = pack(sizes, max_tokens=100, oversize="skip")
    assert sorted(mbs.sample_ids.tolist()) == [0, 1, 3] and mbs.stats["skipped"] == 2
    samples, mbs = pack(sizes, max_tokens=100, oversize="truncate")
    assert sorted(mbs.sample_ids.tolist()) == [0, 1, 2, 3, 4] and mbs.stats["truncated"] == 2
    assert mbs.columns["max_size"].max() == 100


def test_edge_cases_single_sample_and_equal_sizes():
    _, mbs = pack([42], max_tokens=100)
    assert microbatches(mbs) == [[0]]
    _, mbs = pack([10] * 95, max_tokens=100)
    assert [len(b) for b in microbatches(mbs)] == [10] * 9 + [5]
    _, mbs = pack([], max_tokens=100)
    assert microbatches(mbs) == []


@pytest.mark.parametrize("bad", [dict(max_tokens=0), dict(max_tokens=10, budget="quadratic"),
                                 dict(max_tokens=10, pad_to_multiple=8, shapes=(8, 16)),
                                 dict(max_tokens=10, shapes=(16, 8)), dict(max_tokens=10, same_shape=True),
                                 dict(max_tokens=10, batch_multiple=0)])
def test_bad_options_are_refused(bad):
    with pytest.raises(SortpackError):
        PackOptions(**bad).validate()


def lognormal_sizes(n, seed=5):
    rng = np.random.default_rng(seed)
    return np.clip(np.ceil(rng.lognormal(np.log(300), 1.0, n)), 1, 8192).astype(np.int64)


@pytest.mark.parametrize("max_segments", [0, 8])
def test_row_packing_fills_rows_and_keeps_every_sample_once(max_segments):
    sizes = lognormal_sizes(100_000)
    samples, mbs = pack(sizes, rows=8192, rows_per_microbatch=2, max_segments=max_segments)
    ids = mbs.sample_ids
    assert np.array_equal(np.sort(ids), np.arange(len(sizes)))
    c = mbs.columns
    assert np.all(c["padded_size"] == 8192) and np.all(c["batch_size"] <= 2)
    # rows: consecutive groups of sample ids; check each row's length and segment count
    row_sizes = mbs.row_sizes
    assert row_sizes.sum() == len(ids) and len(row_sizes) == c["batch_size"].sum()
    row_tokens = np.add.reduceat(sizes[ids], np.concatenate(([0], np.cumsum(row_sizes)[:-1])))
    assert row_tokens.max() <= 8192
    if max_segments:
        assert row_sizes.max() <= max_segments
    fill = sizes.sum() / (len(row_sizes) * 8192)
    if max_segments == 0:
        assert fill >= 0.997
    else:  # 8 samples of median 300 cannot fill 8192: most rows close on the segment cap
        assert np.mean(row_sizes == max_segments) > 0.8


def test_row_packing_oversize_and_options():
    with pytest.raises(SortpackError, match="--rows 100"):
        pack([10, 200, 30], rows=100)
    _, mbs = pack([10, 200, 30], rows=100, oversize="truncate")
    assert mbs.columns["tokens"].sum() == 140
    with pytest.raises(SortpackError, match="does not apply"):
        PackOptions(max_tokens=None, rows=100, same_shape=True, group_size=2).validate()
    with pytest.raises(SortpackError, match="need --rows"):
        PackOptions(max_tokens=100, max_segments=3).validate()


@pytest.mark.parametrize("budget,q", [("tokens", None), ("quadratic", 300.0)])
def test_same_shape_groups_respect_every_budget_per_microbatch(budget, q):
    rng = np.random.default_rng(6)
    sizes = rng.integers(1, 600, size=2000)
    _, mbs = pack(sizes, max_tokens=6000, budget=budget, quadratic_scale=q, group_size=3, same_shape=True)
    c = mbs.columns
    b, length = c["batch_size"].astype(np.float64), c["padded_size"].astype(np.float64)
    per_mb = b * length if budget == "tokens" else b * (length + length * length / q)
    assert np.all(per_mb <= 6000)
    assert np.all(c["batch_size"].reshape(-1, 3) == c["batch_size"].reshape(-1, 3)[:, :1])


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 5000), st.integers(1, 30)), max_size=40))
def test_distinct_shapes_are_numpys_unique_pairs(runs):
    """Runs of one shape (as micro-batches of sorted sizes come) and shapes in any order: the pairs np.unique finds."""
    from sortpack.stages.pack.packed import distinct_shapes

    b = np.array([x for x, _, k in runs for _ in range(k)], np.int64)
    p = np.array([y for _, y, k in runs for _ in range(k)], np.int64)
    want = np.unique(np.stack([b, p]), axis=1) if len(b) else np.zeros((2, 0), np.int64)
    assert np.array_equal(distinct_shapes(b.astype(np.int32), p), want)


@given(st.lists(st.integers(-50, 50), max_size=30), st.lists(st.integers(0, 30), max_size=8),
       st.sampled_from([np.add, np.maximum, np.minimum]))
def test_segment_reduce_is_each_segments_reduce(values, cuts, ufunc):
    """With and without empty segments (0 there), the one-call path and the scattered one alike."""
    from sortpack.stages.pack.packed import segment_reduce

    vals = np.array(values, np.int64)
    offsets = np.concatenate(([0], np.sort([c for c in cuts if c <= len(vals)]), [len(vals)])).astype(np.int64)
    want = [int(ufunc.reduce(vals[a:b])) if b > a else 0 for a, b in zip(offsets[:-1], offsets[1:])]
    got = segment_reduce(ufunc, vals, offsets)
    assert got.tolist() == want and got.dtype == vals.dtype
