"""The store shuffle's planning half (write/store/plan.py) and its result (result.py), without MPI.

Every rank's part is computed here for a whole simulated world: what the collectives would
carry between them is routed by hand, so the plan is checked against its oracle directly.
"""
from __future__ import annotations

import json
import os
from unittest import mock

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sortpack.inputs.source_file import SourceFile
from sortpack.write.owned import PieceRanges
from sortpack.write.store.plan import file_units, memory_budget, position_requests, read_plan, row_uses
from sortpack.write.store.result import ExchangeStats, StoreResult

GiB, MiB = 1 << 30, 1 << 20


def test_the_memory_limit_is_spent_an_eighth_per_round_and_half_on_received_rows():
    b = memory_budget(8 * GiB, piece=2 * GiB)
    assert (b.limit, b.round, b.held, b.spill_batch) == (8 * GiB, GiB, 4 * GiB, 64 * MiB)
    # spill batches: at least 1 MiB, at most one gathered piece
    assert memory_budget(64 * MiB, piece=2 * GiB).spill_batch == MiB
    assert memory_budget(8 * GiB, piece=5 * MiB).spill_batch == 5 * MiB
    tiny = memory_budget(5, piece=2 * GiB)
    assert (tiny.round, tiny.held) == (1, 2)  # never a zero budget


def test_file_units_take_rows_from_the_units_or_the_fingerprint():
    srcs = [SourceFile("a.parquet", "parquet", 1, unit_rows=[3, 0, 4]), SourceFile("b.jsonl", "jsonl", 1),
            SourceFile("c.arrow", "arrow", 1, unit_rows=[])]
    files = [{"rows": 7}, {"rows": 11}, {"rows": 0}]
    units, rows = file_units(srcs, files)
    assert units == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert rows.tolist() == [3, 0, 4, 11] and rows.dtype == np.int64


@given(rows=st.lists(st.integers(0, 30), min_size=1, max_size=12), size=st.integers(1, 5))
def test_every_unit_is_read_once_in_order_and_each_rank_knows_its_first_row(rows, size):
    units = [(0, u) for u in range(len(rows))]
    unit_rows = np.array(rows, dtype=np.int64)
    plans = [read_plan(units, unit_rows, rank=r, size=size) for r in range(size)]
    assert [u for p in plans for u in p.units] == units
    cum = np.concatenate(([0], np.cumsum(unit_rows)))
    for r, p in enumerate(plans):
        assert p.reader_starts.tolist() == plans[0].reader_starts.tolist() and p.first_row == p.reader_starts[r]
        if p.units:  # a reader's rows start at its first unit's
            assert p.first_row == cum[p.units[0][1]]
    assert plans[0].reader_starts[0] == 0 and plans[0].reader_starts[-1] == cum[-1]


def _simulate(ids_by_rank, reader_starts, ranges_by_rank, cut):
    """Route every rank's requests to the readers as the Alltoallv would; return each reader's RowPositions."""
    size = len(ids_by_rank)
    pos0 = np.concatenate(([0], np.cumsum([len(i) for i in ids_by_rank])))
    sent = [position_requests(ids, int(pos0[r]), reader_starts, ranges_by_rank[r], size)
            for r, ids in enumerate(ids_by_rank)]
    uses = []
    for reader in range(size):
        got = {}
        for asked, counts in sent:
            at = np.concatenate(([0], np.cumsum(counts)))
            for k, v in asked.items():
                got.setdefault(k, []).append(v[at[reader]:at[reader + 1]])
        got = {k: np.concatenate(v) for k, v in got.items()}
        uses.append(row_uses(got, int(reader_starts[reader]), cut))
    return uses


@given(data=st.data(), size=st.integers(1, 4), n_rows=st.integers(1, 40), split=st.booleans())
def test_each_reader_learns_every_position_of_its_rows(data, size, n_rows, split):
    # a plan may repeat rows (a mixture) and leave some out (--oversize skip), in any order
    plan = np.array(data.draw(st.lists(st.integers(0, n_rows - 1), max_size=60)), dtype=np.int64)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(plan)), min_size=size - 1, max_size=size - 1)))
    bounds = [0, *cuts, len(plan)]
    reader_cuts = sorted(data.draw(st.lists(st.integers(0, n_rows), min_size=size - 1, max_size=size - 1)))
    reader_starts = np.array([0, *reader_cuts, n_rows], dtype=np.int64)
    begin = np.arange(len(plan), dtype=np.int64) * 10
    parts = [plan[a:b] for a, b in zip(bounds, bounds[1:])]
    ranges = [PieceRanges(begin[a:b], begin[a:b] + 5) if split else None
              for a, b in zip(bounds, bounds[1:])]
    uses = _simulate(parts, reader_starts, ranges, ("text",) if split else None)
    for r, u in enumerate(uses):
        lo, hi = reader_starts[r], reader_starts[r + 1]
        want = sorted((int(row - lo), p) for p, row in enumerate(plan) if lo <= row < hi)
        assert list(zip(u.rows.tolist(), u.positions.tolist())) == want
        if split:
            assert u.cut == ("text",) and u.begin.tolist() == [10 * p for _, p in want]
            assert (u.end - u.begin).tolist() == [5] * len(want)
        else:
            assert u.begin is None and u.cut == ()


def _result(**kw):
    stats = ExchangeStats(rounds=3, memory_limit=800, round_budget=100, spills=1, spill_batches=2,
                          seconds={"read": 0.5, "exchange": 0.25, "spill": 0.0, "write": 1.0})
    return StoreResult(columns=["text"], schema={"text": "string"}, rows_per_shard=300, num_rows=9,
                       shards=[{"file": "data-00000.arrow"}], exchange=stats, **kw)


def test_the_result_gives_the_manifest_data_and_keeps_the_exchange_out_of_it():
    data = _result().manifest_data()
    assert data == {"columns": ["text"], "schema": {"text": "string"}, "rows_per_shard": 300, "num_rows": 9,
                    "shards": [{"file": "data-00000.arrow"}]}
    assert "exchange" not in json.dumps(data) and not any(k.startswith("_") for k in data)
    full = _result(tokens={"column": "input_ids"}, pieces=["text"]).manifest_data()
    assert full["tokens"] == {"column": "input_ids"} and full["pieces"] == {"cut": ["text"]}
    assert _result().exchange.as_dict() == {
        "rounds": 3, "memory_limit": 800, "round_budget": 100, "spills": 1, "spill_batches": 2,
        "seconds": {"read": 0.5, "exchange": 0.25, "spill": 0.0, "write": 1.0}}


# --- the data shards' layout (layout.py): local shards per rank, merged and dealt by weight ---------

from sortpack.write.store.layout import ROW_WEIGHT, local_data_shards, merge_data_layout  # noqa: E402


@given(data=st.data(), counts=st.lists(st.integers(0, 9), min_size=1, max_size=30), size=st.integers(1, 4),
       per=st.integers(1, 12))
def test_the_data_layout_does_not_depend_on_how_index_shards_are_dealt(data, counts, size, per):
    m = len(counts)
    index_starts = sorted({0, *(data.draw(st.lists(st.integers(1, m - 1), max_size=5)) if m > 1 else [])})
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    sizes = np.array(data.draw(st.lists(st.integers(0, 100), min_size=m, max_size=m)), dtype=np.int64)

    def layout(owners):  # ranks hold whole index shards: owners are index shard starts, plus the end
        parts = [local_data_shards(a, offsets[a:b + 1] - offsets[a], int(offsets[a]), index_starts, sizes[a:b])
                 for a, b in zip(owners, owners[1:])]
        return merge_data_layout(parts, size=len(owners) - 1)

    firsts = sorted(data.draw(st.lists(st.sampled_from(index_starts), min_size=size - 1, max_size=size - 1)))
    with mock.patch.dict(os.environ, {"SORTPACK_TEST_DATA_ROWS": str(per)}):
        one, many = layout([0, m]), layout([0, *firsts, m])
    assert many.bounds.tolist() == one.bounds.tolist() and many.num_rows == offsets[-1]
    # every shard holds rows, at most `per` past a micro-batch boundary; writers take contiguous blocks
    assert np.all(np.diff(one.bounds[:, 0]) > 0) or len(one.bounds) == 1
    w = many.writer_starts
    assert len(w) == size + 1 and w[0] == 0 and w[-1] == len(one.bounds) - 1 and np.all(np.diff(w) >= 0)


def test_writers_are_balanced_by_sizes_plus_a_weight_per_row(monkeypatch):
    monkeypatch.setenv("SORTPACK_TEST_DATA_ROWS", "2")
    # four micro-batches of two rows: four shards; the last shard's rows are far longer
    offsets = np.array([0, 2, 4, 6, 8])
    sizes = np.array([1, 1, 1, 1000])
    local = local_data_shards(0, offsets, 0, [0], sizes)
    assert local.bounds.tolist() == [[0, 0], [2, 1], [4, 2], [6, 3]] and local.end.tolist() == [[8, 4]]
    assert local.weights.tolist() == [1 + 2 * ROW_WEIGHT] * 3 + [1000 + 2 * ROW_WEIGHT]
    layout = merge_data_layout([local], size=2)
    assert layout.writer_starts.tolist() == [0, 3, 4]  # the heavy shard alone
    assert layout.owner_starts.tolist() == [0, 6, 8] and layout.num_rows == 8
