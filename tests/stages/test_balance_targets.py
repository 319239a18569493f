"""``--balance targets``: rows composed by their targets keep best fit's rows, and the order ends where it starts."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sortpack import kernels
from sortpack.parallel import SerialComm
from sortpack.stages.pack import PackOptions, pack_samples
from sortpack.stages.pack.compose import compose_rows, exchange_heavy, targets_spread
from sortpack.stages.samples import SampleColumns

ROW = 64


def _rows(order: np.ndarray, splits: np.ndarray, values: np.ndarray) -> list[list[int]]:
    return [sorted(values[order[a:b]].tolist()) for a, b in zip(splits[:-1], splits[1:])]


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


def _row_sums(order: np.ndarray, splits: np.ndarray, values: np.ndarray) -> np.ndarray:
    row = np.repeat(np.arange(len(splits) - 1), np.diff(splits))
    return np.bincount(row, values[order], minlength=len(splits) - 1).astype(np.int64)


@given(st.lists(st.tuples(st.integers(1, ROW), st.floats(0, 1)), min_size=2, max_size=400),
       st.sampled_from([0, 3, 6]))
def test_exchanges_keep_every_row_in_its_room_and_bring_rows_nearer_the_mean(pairs, max_segments):
    sizes = np.array([p[0] for p in pairs], np.int64)
    # targets of very different shares, the shape of chats: some samples nearly all answer
    targets = np.array([int(p[0] * p[1] ** 3) for p in pairs], np.int64)
    order, splits = kernels.pack_rows(sizes, ROW, max_segments)
    order = compose_rows(sizes, targets, order, splits)
    new, new_splits = exchange_heavy(sizes, targets, order, splits, (ROW, max_segments))
    assert sorted(new.tolist()) == list(range(len(sizes)))
    # as many rows, each within the row length (and the segment cap), none empty: the same fill and padding
    assert len(new_splits) == len(splits)
    counts = np.diff(new_splits)
    assert counts.min() >= 1 and (not max_segments or counts.max() <= max_segments)
    assert _row_sums(new, new_splits, sizes).max() <= ROW
    # each exchange lowers the larger of its two rows below the heavier one's targets and keeps their sum, so the
    # heaviest row never gets heavier, the lightest never lighter, and the spread never grows
    before, after = _row_sums(order, splits, targets), _row_sums(new, new_splits, targets)
    assert after.max() <= before.max() and after.min() >= before.min()
    assert ((after - after.mean()) ** 2).sum() <= ((before - before.mean()) ** 2).sum() + 1e-6
    # a row's samples in window order
    assert all(np.all(np.diff(new[a:b]) > 0) for a, b in zip(new_splits[:-1], new_splits[1:]))


def test_a_row_of_two_long_answers_trades_one_for_short_prompts_of_its_room():
    # rows of 64: one row holds two 30-token samples that are all answer; the rest hold 3-4 short ones with no
    # targets; no one or two samples elsewhere sum to 30, but several do
    sizes = np.array([30, 30, 4] + [16] * 12 + [10] * 18, np.int64)
    targets = np.array([30, 30, 0] + [0] * 12 + [0] * 18, np.int64)
    order, splits = kernels.pack_rows(sizes, ROW)
    assert _row_sums(order, splits, targets).max() == 60
    new, new_splits = exchange_heavy(sizes, targets, order, splits, (ROW, 0))
    sums = _row_sums(new, new_splits, targets)
    assert sums.max() == 30 and sorted(sums.tolist())[-2:] == [30, 30]
    assert _row_sums(new, new_splits, sizes).max() <= ROW and len(new_splits) == len(splits)


def _chats(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (tokens, targets) of n chat-like samples: 1-4 exchanges, half with a system turn, each turn of
    log-normal length (3 tokens of template), the answers' tokens the targets; prompts and answers vary apart."""
    rng = np.random.default_rng(seed)
    exchanges, system = rng.integers(1, 5, n), rng.random(n) < 0.5
    turns = 2 * exchanges + system
    lengths = np.maximum(1, rng.lognormal(3.0, 1.0, int(turns.sum()))).astype(np.int64).clip(1, 2000) + 3
    chat = np.repeat(np.arange(n), turns)
    place = np.arange(len(chat)) - np.concatenate(([0], np.cumsum(turns)[:-1]))[chat] - system[chat]
    answer = (place >= 0) & (place % 2 == 1)
    tokens = np.bincount(chat, lengths, n).astype(np.int64)
    return tokens, np.bincount(chat, np.where(answer, lengths - 2, 0), n).astype(np.int64)


def test_rows_by_targets_even_what_trains_in_each_step_of_64_ranks():
    from sortpack.report.inspect import imbalance, step_costs

    tokens, targets = _chats(100_000, seed=2)
    keep = tokens <= 4096
    tokens, targets = tokens[keep], targets[keep]
    order = np.lexsort((np.arange(len(tokens)), tokens))
    got = {}
    for balance in ("none", "targets"):
        samples = SampleColumns(0, len(tokens), order.astype(np.int64), tokens[order], tokens[order], None,
                                measures={"targets": targets[order]})
        mbs = pack_samples(SerialComm(), samples, PackOptions(rows=4096, balance=balance))
        got[balance] = (imbalance(step_costs(mbs.columns["targets"], 64, 1)), len(mbs.columns["targets"]))
    (default, rows), (balanced, balanced_rows) = got["none"], got["targets"]
    assert default["p99"] >= 2.0
    # the goal: at most 1.10 where token-only packing gives 2x; as many rows of 4096: the same fill
    assert balanced["p99"] <= 1.10 and balanced["max"] <= 1.2 and balanced["weighted"] <= 1.01
    assert balanced_rows == rows
