"""The partitioning policy: shards cut at fixed rows, ranks own whole shards, inputs split by weight."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sortpack.partition import (
    balanced_blocks,
    deal_windows,
    even_range,
    index_shard_cuts,
    index_shard_owners,
    owned,
    owner_starts,
    rank_of,
    rank_run,
    reader_blocks,
    round_robin,
    shard_starts,
    split_rows,
    unit_owners,
    value_owners,
)


@given(total=st.integers(0, 5000), rows=st.integers(1, 700), ranks=st.integers(1, 9))
def test_owners_hold_whole_shards_within_one_of_even(total, rows, ranks):
    starts = shard_starts(total, rows)
    owners = owner_starts(total, rows, ranks)
    assert starts[0] == 0 and starts[-1] == total and np.all(np.diff(starts)[:-1] == rows)
    assert len(owners) == ranks + 1 and owners[0] == 0 and owners[-1] == total
    assert np.all(np.diff(owners) >= 0)
    assert set(owners.tolist()) <= set(starts.tolist())  # every owner starts at a shard boundary
    shards_owned = np.diff(np.searchsorted(starts, owners))
    assert shards_owned.max() - shards_owned.min() <= 1


def test_empty_and_exact_layouts():
    assert shard_starts(0, 10).tolist() == [0]
    assert shard_starts(20, 10).tolist() == [0, 10, 20]
    assert shard_starts(21, 10).tolist() == [0, 10, 20, 21]
    assert owner_starts(21, 10, 2).tolist() == [0, 10, 21]
    assert owner_starts(5, 10, 3).tolist() == [0, 0, 0, 5]


# --- balanced_blocks --------------------------------------------------------------------


def test_balanced_blocks_balances_by_weight():
    assert balanced_blocks(np.array([1, 1, 1, 1]), 2).tolist() == [0, 2, 4]
    assert balanced_blocks(np.array([10, 1, 1, 1, 1]), 2).tolist() == [0, 1, 5]
    assert balanced_blocks(np.array([5, 5]), 4).tolist() == [0, 0, 1, 1, 2]
    assert balanced_blocks(np.array([], dtype=np.int64), 3).tolist() == [0, 0, 0, 0]
    assert balanced_blocks(np.zeros(4), 2).tolist() == [0, 2, 4]


@given(st.lists(st.integers(0, 1000), max_size=40), st.integers(1, 9))
def test_balanced_blocks_covers_every_unit_in_order(weights, ranks):
    b = balanced_blocks(np.array(weights, dtype=np.float64), ranks)
    assert len(b) == ranks + 1 and b[0] == 0 and b[-1] == len(weights)
    assert np.all(np.diff(b) >= 0)
    w = np.array(weights, dtype=np.float64)
    if w.sum() > 0:
        # no rank's share exceeds an even share by more than one unit's weight
        shares = np.array([w[b[r]:b[r + 1]].sum() for r in range(ranks)])
        assert shares.max() <= w.sum() / ranks + w.max() + 1e-9


# --- split_rows --------------------------------------------------------------------------


def _rank_rows(weights, splittable, ranks):
    """Return each rank's row count under split_rows, checking the runs tile every unit in order."""
    unit, off = split_rows(np.array(weights, dtype=np.int64), np.array(splittable, dtype=bool), ranks)
    w = np.array(weights, dtype=np.int64)
    assert unit[0] == 0 and off[0] == 0 and unit[-1] == len(w) and off[-1] == 0
    pos = np.concatenate(([0], np.cumsum(w)))[unit] + off  # global row where each run starts
    assert np.all(np.diff(pos) >= 0)
    assert all(off[r] == 0 or splittable[unit[r]] for r in range(ranks + 1))  # unknown units stay whole
    return np.diff(pos)


def test_split_rows_cuts_one_row_group_over_every_rank():
    assert _rank_rows([1000], [True], 4).tolist() == [250, 250, 250, 250]
    assert _rank_rows([10, 3], [True, True], 4).tolist() == [3, 3, 3, 4]
    # a whole-file unit (rows unknown) goes whole to the rank holding its midpoint
    assert _rank_rows([10, 100, 10], [True, False, True], 3).tolist() == [10, 100, 10]
    assert _rank_rows([], [], 3).tolist() == [0, 0, 0]
    # empty units (rows 0 as far as known) are still read, each by one rank
    assert split_rows(np.zeros(2, np.int64), np.ones(2, bool), 2)[0].tolist() == [0, 1, 2]


@given(st.lists(st.tuples(st.integers(0, 5000), st.booleans()), max_size=30), st.integers(1, 16))
def test_split_rows_balances_known_rows_exactly(units, ranks):
    weights = [w for w, _ in units]
    splittable = [s for _, s in units]
    rows = _rank_rows(weights, splittable, ranks)
    total = sum(weights)
    if total and all(splittable):
        assert rows.max() - rows.min() <= 1  # within one row of N/P, whatever the row groups
    elif total:
        biggest = max([w for w, s in units if not s], default=0)
        assert rows.max() <= total / ranks + biggest + 1


# --- the input side's deals: analyze's files and runs, the digests, row packing's windows ---

@given(n=st.integers(0, 500), size=st.integers(1, 12))
def test_even_range_tiles_the_items_within_one_of_even(n, size):
    parts = [even_range(n, rank=r, size=size) for r in range(size)]
    assert parts[0][0] == 0 and parts[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    lengths = [hi - lo for lo, hi in parts]
    assert max(lengths) - min(lengths) <= 1


def test_rank_run_and_unit_owners_read_split_rows_cuts():
    # units of 10, 3 and 7 rows over 4 ranks: 5 rows each
    cut_unit, cut_off = split_rows(np.array([10, 3, 7]), np.ones(3, bool), 4)
    assert [rank_run(cut_unit, cut_off, rank=r) for r in range(4)] == \
        [(0, 0, 0, 5), (0, 5, 1, 0), (1, 0, 2, 2), (2, 2, 3, 0)]
    # unit 0 is cut between ranks 0 and 1: the last of them owns it
    assert unit_owners(cut_unit, np.array([0, 1, 2]), size=4).tolist() == [1, 2, 3]
    assert owned(np.array([1, 2, 1, 0]), rank=1) == [0, 2] and owned(np.array([]), rank=0) == []


@given(st.lists(st.integers(0, 40), min_size=1, max_size=5), st.integers(1, 9), st.integers(1, 9))
def test_deal_windows_spreads_each_stage_over_its_windows_and_ranks_in_blocks(per_stage, window, size):
    per_stage = np.array(per_stage, dtype=np.int64)
    stage = np.repeat(np.arange(len(per_stage)), per_stage)
    pos = np.arange(len(stage), dtype=np.int64)
    of, dest = deal_windows(pos, stage, per_stage, window, size=size)
    windows = -(-per_stage // window)
    for s in range(len(per_stage)):
        mine = of[stage == s]
        first = int(windows[:s].sum())
        # the stage's k-th sample goes to its window k mod windows: windows hold at most `window` samples
        assert mine.tolist() == [first + k % max(windows[s], 1) for k in range(per_stage[s])]
        if len(mine):
            assert np.bincount(mine - first).max() <= window
    # ranks take windows in contiguous blocks: a window has one rank, ranks rise with windows
    assert np.all(np.diff(dest[np.argsort(of, kind="stable")]) >= 0)
    assert dest.min(initial=0) >= 0 and dest.max(initial=0) < size
    # the windows are the same for any rank count
    assert np.array_equal(of, deal_windows(pos, stage, per_stage, window, size=1)[0])


# --- the write side's deals: round_robin, reader_blocks, rank_of, index shards ---------

@given(n=st.integers(0, 50), size=st.integers(1, 9))
def test_round_robin_deals_every_item_to_one_rank_in_turn(n, size):
    shares = [round_robin(n, rank=r, size=size) for r in range(size)]
    assert sorted(i for s in shares for i in s) == list(range(n))
    assert all(i % size == r for r, s in enumerate(shares) for i in s)
    assert round_robin(5, rank=1, size=2) == [1, 3]


@given(st.lists(st.integers(0, 1000), max_size=30), st.integers(1, 9))
def test_reader_blocks_give_whole_units_and_their_first_rows(rows, size):
    bounds, starts = reader_blocks(np.array(rows, dtype=np.int64), size=size)
    assert bounds.tolist() == balanced_blocks(np.array(rows, dtype=np.float64), size).tolist()
    cum = np.concatenate(([0], np.cumsum(rows, dtype=np.int64)))
    assert starts.tolist() == cum[bounds].tolist() and starts.dtype == np.int64
    # every global row is read by the rank whose block of units holds it
    for row in range(int(cum[-1])):
        unit = int(np.searchsorted(cum, row, side="right")) - 1
        r = int(rank_of(np.array([row]), starts)[0])
        assert bounds[r] <= unit < bounds[r + 1]


def test_rank_of_skips_empty_ranks():
    starts = np.array([0, 4, 4, 9])  # rank 1 holds nothing
    assert rank_of(np.array([0, 3, 4, 8]), starts).tolist() == [0, 0, 2, 2]


def _cuts_by_hand(counts, rows_per_shard, samples_per_shard):
    """Micro-batches after which a shard ends, walking the plan one micro-batch at a time."""
    mb_cuts, sample_cuts, seen = [], [], 0
    for i, c in enumerate(counts):
        before, seen = seen, seen + c
        if i + 1 < len(counts) and (seen // samples_per_shard > before // samples_per_shard
                                    or (i + 1) % rows_per_shard == 0):
            mb_cuts.append(i + 1)
            sample_cuts.append(seen)
    return mb_cuts, sample_cuts


@given(counts=st.lists(st.integers(0, 40), max_size=60), rows=st.integers(1, 12), per=st.integers(1, 100),
       size=st.integers(1, 5), data=st.data())
def test_index_shard_cuts_do_not_depend_on_how_micro_batches_are_dealt(counts, rows, per, size, data):
    m = len(counts)
    splits = sorted(data.draw(st.lists(st.integers(0, m), min_size=size - 1, max_size=size - 1)))
    bounds = [0, *splits, m]
    n = np.array(counts, dtype=np.int64)
    parts = [index_shard_cuts(n[a:b], a, m, int(n[:a].sum()), rows, per) for a, b in zip(bounds, bounds[1:])]
    cut_mb = np.concatenate([p[0] for p in parts])
    cut_samples = np.concatenate([p[1] for p in parts])
    want_mb, want_samples = _cuts_by_hand(counts, rows, per)
    assert cut_mb.tolist() == want_mb and cut_samples.tolist() == want_samples
    starts, dest = index_shard_owners(cut_mb, cut_samples, m, int(n.sum()), size=size)
    assert starts.tolist() == ([0, *want_mb, m] if m else [0])
    # each rank writes a contiguous block of whole shards, in rank order, and the blocks tile the plan
    assert len(dest) == size + 1 and dest[0] == 0 and dest[-1] == starts[-1]
    assert np.all(np.diff(dest) >= 0) and set(dest.tolist()) <= set(starts.tolist())


def test_index_shard_owners_deal_shards_by_bytes():
    # four shards of 10 micro-batches: the first holds 1000 samples, the rest 10 each
    starts, dest = index_shard_owners(np.array([10, 20, 30]), np.array([1000, 1010, 1020]), 40, 1030, size=2)
    assert starts.tolist() == [0, 10, 20, 30, 40]
    assert dest.tolist() == [0, 10, 40]  # the heavy first shard alone, the light three together
    assert index_shard_owners(np.zeros(0, np.int64), np.zeros(0, np.int64), 0, 0, size=3)[1].tolist() == [0] * 4


@given(values=st.lists(st.integers(0, 10**12), max_size=40), size=st.integers(1, 9))
def test_value_owners_send_equal_values_to_one_rank_in_range(values, size):
    owners = value_owners(np.array(values, dtype=np.int64), size=size)
    assert owners.shape == (len(values),) and (owners >= 0).all() and (owners < size).all()
    seen: dict[int, int] = {}
    for v, o in zip(values, owners):
        assert seen.setdefault(v, int(o)) == o
