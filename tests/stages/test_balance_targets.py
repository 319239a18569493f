"""``--balance targets``: rows composed by their targets keep best fit's rows, and the order ends where it starts."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sortpack import kernels
from sortpack.parallel import SerialComm
from sortpack.stages.pack import PackOptions, pack_samples
from sortpack.stages.pack.balance import compose_rows, targets_spread
from sortpack.stages.samples import SampleColumns

ROW = 64


def _rows(order: np.ndarray, splits: np.ndarray, values: np.ndarray) -> list[list[int]]:
    return [sorted(values[order[a:b]].tolist()) for a, b in zip(splits[:-1], splits[1:])]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, ROW), st.integers(0, 100)), min_size=1, max_size=300))
def test_composed_rows_hold_best_fit_s_sizes_and_targets_nearer_their_mean(pairs):
    sizes = np.array([p[0] for p in pairs], np.int64)
    targets = np.array([min(p[1], p[0]) for p in pairs], np.int64)
    spread = targets_spread(sizes, targets)
    assert sorted(spread.tolist()) == list(range(len(sizes))) and np.array_equal(sizes[spread], sizes)
    order, splits = kernels.pack_rows(sizes, ROW)
    plain = kernels.pack_rows(sizes[spread], ROW)
    assert np.array_equal(plain[1], splits) and _rows(*plain, sizes[spread]) == _rows(order, splits, sizes)
    composed = compose_rows(sizes[spread], targets[spread], *plain)
    assert sorted(composed.tolist()) == list(range(len(sizes)))
    # every row holds the sizes best fit gave it: the same fill and padding
    assert _rows(composed, splits, sizes[spread]) == _rows(order, splits, sizes)
    # and its targets are no farther from the mean than before (each exchange is the best for its group)
    row = np.repeat(np.arange(len(splits) - 1), np.diff(splits))
    before = np.bincount(row, targets[spread][plain[0]]).astype(float)
    after = np.bincount(row, targets[spread][composed]).astype(float)
    assert ((after - after.mean()) ** 2).sum() <= ((before - before.mean()) ** 2).sum() + 1e-6


def test_composition_evens_rows_of_equal_sizes():
    # 64 samples of 16 tokens, 4 a row: half of them all targets, half none; best fit in order makes rows of 0
    # and rows of 64 targets, the composed rows hold 32 each
    sizes = np.full(64, 16, np.int64)
    targets = np.where(np.arange(64) < 32, 16, 0).astype(np.int64)
    order, splits = kernels.pack_rows(sizes, ROW)
    assert sorted(np.add.reduceat(targets[order], splits[:-1]).tolist()) == [0] * 8 + [64] * 8
    spread = targets_spread(sizes, targets)
    order = spread[compose_rows(sizes[spread], targets[spread], *kernels.pack_rows(sizes[spread], ROW))]
    assert np.add.reduceat(targets[order], splits[:-1]).tolist() == [32] * 16


def test_the_order_is_a_circle_of_the_sorted_targets():
    rng = np.random.default_rng(0)
    sizes = rng.integers(8, ROW + 1, 3000).astype(np.int64)
    targets = (sizes * rng.uniform(0, 1, len(sizes))).astype(np.int64)
    order = np.lexsort((np.arange(len(sizes)), sizes))
    samples = SampleColumns(0, len(sizes), order.astype(np.int64), sizes[order], sizes[order], None,
                            measures={"targets": targets[order]})
    mbs = pack_samples(SerialComm(), samples, PackOptions(rows=ROW, balance="targets"))
    t = mbs.columns["targets"]
    n = len(t)
    # every other one of the sorted targets ascending, then the rest descending: the plan ends where it starts
    ranked = np.sort(t)
    assert t.tolist() == np.concatenate((ranked[0::2], ranked[1::2][::-1])).tolist()
    assert t[0] == ranked[0] and t[-1] == ranked[1] and t[n // 2] >= ranked[-2]
