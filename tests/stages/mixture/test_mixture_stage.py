"""The mixture stage's pure halves (no MPI: ranks simulated with rank=/size= arithmetic) and, on one rank,
its communicating halves; 2-4 ranks: tests/mpi/test_mixture_mpi.py."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.errors import SortpackError
from sortpack.inputs.mixture import parse_mixture
from sortpack.parallel import SerialComm
from sortpack.partition import balanced_blocks
from sortpack.stages.analyze import AnalyzeOptions
from sortpack.stages.mixture import (
    IndexShards,
    MixturePacking,
    PackedUnits,
    Sources,
    Union,
    blend_mixture,
    blend_units,
    concat_microbatches,
    gather_packed,
    global_ids,
    held_tokens,
    holdout_plan,
    mixture_record,
    move_plan,
    move_to_writers,
    piece_sources,
    plan_order,
    segment_table,
    source_bases,
    source_of,
    split_source,
    split_union,
    take_runs,
    union_segments,
    union_sources,
)
from sortpack.stages.pack import Microbatches, PackOptions, pack_samples
from sortpack.stages.plan_options import PlanOptions
from sortpack.stages.samples import SampleColumns


def _mix(total_tokens=None, **holdouts):
    sources = [{"name": n, "inputs": [f"{n}/"], "weight": w, **({"holdout": holdouts[n]} if n in holdouts else {})}
               for n, w in (("web", 70), ("code", 30))]
    return parse_mixture({"sources": sources, "total_tokens": total_tokens, "seed": 5})


# --- the union -----------------------------------------------------------------------------
def test_source_bases_count_each_source_s_files_and_refuse_an_empty_source():
    assert source_bases(np.array([3, 4, 5]), [2, 1], ["a", "b"]).tolist() == [0, 7, 12]
    with pytest.raises(SortpackError, match="mixture source 'b': its inputs hold no rows"):
        source_bases(np.array([3, 4, 0, 0]), [2, 2], ["a", "b"])


def test_source_of_a_rank_s_contiguous_slice():
    samples = SampleColumns(5, 20, np.arange(5, 12), np.ones(7, np.int64), np.ones(7, np.int64))
    assert source_of(samples, np.array([0, 8, 9, 20])).tolist() == [0, 0, 0, 1, 2, 2, 2]


@given(st.integers(1, 4), st.lists(st.integers(0, 9), min_size=1, max_size=4), st.integers(0, 2**32))
def test_the_segment_table_maps_contiguous_numbers_back_to_global_ids(size, rows, seed):
    # each source dealt to `size` ranks in uneven blocks, as analyze does; each rank numbers its runs
    # contiguously after the ranks before it (the exscan), and the table maps every number back
    rng = np.random.default_rng(seed)
    bases = np.concatenate(([0], np.cumsum(rows))).astype(np.int64)
    cuts = [np.concatenate(([0], np.sort(rng.integers(0, r + 1, size - 1)), [r])) for r in rows]
    starts = [[int(c[rank]) for c in cuts] for rank in range(size)]
    counts = [[int(c[rank + 1] - c[rank]) for c in cuts] for rank in range(size)]
    vstarts = np.concatenate(([0], np.cumsum([sum(c) for c in counts])))
    table = segment_table([union_segments(starts[r], counts[r], bases, int(vstarts[r])) for r in range(size)])
    expect = np.concatenate([bases[k] + np.arange(starts[r][k], starts[r][k] + counts[r][k])
                             for r in range(size) for k in range(len(rows))] + [np.zeros(0, np.int64)])
    ids = np.arange(int(vstarts[-1]), dtype=np.int64)
    assert np.array_equal(global_ids(table, ids.copy()), expect)
    assert sorted(expect.tolist()) == list(range(int(bases[-1])))  # every global id once


def test_union_sources_on_one_rank_numbers_and_keeps_the_difficulty_kind():
    a = SampleColumns(0, 3, np.arange(3), np.array([5, 6, 7]), np.array([0.5, 0.25, 1.0]), files=[{"rows": 3}])
    size = np.array([1, 2])
    b = SampleColumns(0, 2, np.arange(2), size, size, files=[{"rows": 2}])
    union, groups, table, bases, files = union_sources(SerialComm(), [a, b])
    assert union.sample_id.tolist() == [0, 1, 2, 3, 4] and union.size.tolist() == [5, 6, 7, 1, 2]
    assert union.difficulty.dtype == np.float64 and union.difficulty.tolist() == [0.5, 0.25, 1.0, 1.0, 2.0]
    assert groups.tolist() == [0, 0, 0, 1, 1] and bases.tolist() == [0, 3, 5] and len(files) == 2
    assert global_ids(table, np.array([4, 0, 3])).tolist() == [4, 0, 3]


def test_holdout_plan_a_source_s_own_holdout_wins_and_the_seed_falls_back_to_the_mixture_s():
    bases = np.array([0, 100, 150])
    assert holdout_plan(_mix(), None, None, bases) is None
    plan = holdout_plan(_mix(code=5), 0.1, None, bases)
    assert plan is not None and plan.counts.tolist() == [10, 5] and plan.seed == 0
    assert holdout_plan(_mix(), 3, 9, bases).seed == 9


# --- the packed units ----------------------------------------------------------------------
@given(st.lists(st.integers(0, 6), min_size=0, max_size=8), st.integers(0, 2**32))
def test_take_runs_is_the_runs_concatenated(lengths, seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(-9, 9, 40).astype(np.int32)
    starts = np.array([int(rng.integers(0, 40 - n + 1)) for n in lengths], np.int64)
    expect = [int(v) for a, n in zip(starts, lengths) for v in values[a:a + n]]
    assert take_runs(values, starts, np.array(lengths, np.int64)).tolist() == expect


def _units(tokens, source, part=None, samples=None, stage=None) -> PackedUnits:
    n = len(tokens)
    tokens = np.asarray(tokens, np.int64)
    samples = np.ones(n, np.int64) if samples is None else np.asarray(samples, np.int64)
    return PackedUnits(tokens, samples, tokens + 1, np.asarray(source, np.int64),
                       np.zeros(n, np.int64) if stage is None else np.asarray(stage, np.int64),
                       np.zeros(n, bool) if part is None else np.asarray(part, bool), np.array([0, n]))


def test_units_and_held_tokens_count_the_whole_packing_only():
    packed = _units([5, 6, 7, 8, 9, 1], [0, 1, 0, 1, 0, 0], part=[0, 0, 0, 0, 0, 1])
    assert packed.units(0, False, 1).ravel().tolist() == [0, 2, 4] and packed.units(0, True, 1).ravel().tolist() == [5]
    assert held_tokens(packed, ["web", "code"], 1).tolist() == [21, 14]
    with pytest.raises(SortpackError, match="mixture source 'code': no micro-batches"):
        held_tokens(_units([5], [0]), ["web", "code"], 1)


def test_blend_units_point_at_packed_micro_batches_of_their_source():
    # web holds 300 tokens and needs 700: two whole passes and a part pass of 100 (held: 120); code once
    packed = _units([100] * 6 + [60, 60], [0, 0, 0, 1, 1, 1, 0, 0], part=[0] * 6 + [1, 1])
    blended = blend_units(packed, _mix(total_tokens=1000), 1)
    blend, g = blended.blend, blended.g
    assert len(g) == len(blend)
    assert np.array_equal(packed.source[g], blend.source)  # each plan unit is one of its source's micro-batches
    web = packed.tokens[g][blend.source == 0].sum()
    assert abs(web - 700) <= 100 and abs(packed.tokens[g].sum() - 1000) <= 100


def _mbs(columns: dict, ids: list[list[int]], first=0, total=None, rows=None) -> Microbatches:
    offsets = np.concatenate(([0], np.cumsum([len(x) for x in ids]))).astype(np.int64)
    flat = np.array([i for x in ids for i in x], np.int64)
    cols = {k: np.asarray(v) for k, v in columns.items()}
    return Microbatches(first, len(ids) if total is None else total, flat, offsets, cols, {}, rows)


def test_concat_and_split_source():
    a = _mbs({"num_samples": [1, 2], "stage": [0, 4]}, [[7], [8, 9]], rows=np.array([1, 2]))
    b = _mbs({"num_samples": [1], "stage": [5]}, [[3]], rows=np.array([1]))
    both = concat_microbatches(a, b)
    assert both.sample_ids.tolist() == [7, 8, 9, 3] and both.offsets.tolist() == [0, 1, 3, 4]
    assert both.total == 3 and both.row_sizes.tolist() == [1, 2, 1]
    split_source(both, 3)
    assert both.columns["source"].tolist() == [0, 1, 1] and both.columns["stage"].tolist() == [0, 1, 2]


# --- the move ------------------------------------------------------------------------------
@given(st.integers(1, 4), st.lists(st.integers(0, 3), min_size=1, max_size=12), st.integers(0, 2**32))
def test_every_plan_micro_batch_is_sent_once_to_the_rank_that_writes_it(size, per_rank_m, seed):
    per_rank_m = (per_rank_m * size)[:size]  # micro-batches packed by each rank
    firsts = np.concatenate(([0], np.cumsum(per_rank_m))).astype(np.int64)
    packed = int(firsts[-1])
    rng = np.random.default_rng(seed)
    g = rng.integers(0, max(packed, 1), int(rng.integers(0, 20))) if packed else np.zeros(0, np.int64)
    writers = balanced_blocks(np.ones(len(g)), size)
    sent = []
    for rank in range(size):
        sel, dest, loc = move_plan(g, int(firsts[rank]), int(per_rank_m[rank]), writers)
        assert np.array_equal(loc + firsts[rank], g[sel])  # the local micro-batch it names is the packed one
        assert np.all((writers[dest] <= sel) & (sel < writers[dest + 1]))  # to the rank whose block holds it
        sent.extend(sel.tolist())
    assert sorted(sent) == list(range(len(g)))  # every use once: a repeat is sent once per use


def test_plan_order_sorts_received_micro_batches_with_their_ids_and_rows():
    cols = {"num_samples": np.array([2, 1, 3]), "batch_size": np.array([1, 1, 2]), "tokens": np.array([20, 10, 30])}
    ids = np.array([5, 6, 1, 7, 8, 9])
    rows = np.array([2, 1, 1, 2])
    out, got_ids, got_rows, _ = plan_order(np.array([2, 4, 9]), cols, ids, rows)
    assert out is cols and got_ids is ids  # already in order: nothing moves
    out, got_ids, got_rows, ranges = plan_order(np.array([9, 2, 4]), cols, ids, rows)
    assert out["tokens"].tolist() == [10, 30, 20] and got_ids.tolist() == [1, 7, 8, 9, 5, 6]
    assert got_rows.tolist() == [1, 1, 2, 2] and ranges is None


# --- the blend on one rank, end to end -----------------------------------------------------
def _sorted_union(sizes: list[list[int]]) -> SampleColumns:
    ids, size, code, base = [], [], [], 0
    for s, sz in enumerate(sizes):
        sz = np.asarray(sz, np.int64)
        order = np.lexsort((np.arange(len(sz)), sz))
        ids.append(base + order)
        size.append(sz[order])
        code.append(np.full(len(sz), s, np.int16))
        base += len(sz)
    size_all = np.concatenate(size)
    return SampleColumns(0, len(size_all), np.concatenate(ids), size_all, size_all, np.concatenate(code), [])


def test_blend_mixture_on_one_rank_gives_each_source_its_share_and_a_record_that_adds_up():
    rng = np.random.default_rng(1)
    union = _sorted_union([rng.integers(1, 300, 400).tolist(), rng.integers(1, 300, 300).tolist()])
    comm, mix = SerialComm(), _mix(total_tokens=60_000)
    mbs = pack_samples(comm, union, PackOptions(max_tokens=2048))
    packed = gather_packed(comm, mbs, 1)
    how = MixturePacking(mix, PackOptions(max_tokens=2048), "size", 1, Sources(np.array([0, 400, 700]), [], [1, 1]))
    plan, record = blend_mixture(comm, mbs, packed, how, IndexShards(1000, 10**6))
    assert plan.total == len(plan.offsets) - 1 == sum(s["microbatches"] for s in record["sources"])
    assert int(plan.columns["tokens"].sum()) == record["tokens"] == sum(s["tokens"] for s in record["sources"])
    assert record["max_deviation_tokens"] <= record["bound_tokens"]
    for s, src in enumerate(record["sources"]):
        ids = plan.sample_ids[np.repeat(plan.columns["source"] == s, plan.columns["num_samples"].astype(np.int64))]
        assert np.all((ids >= src["first_sample"]) & (ids < src["first_sample"] + src["num_rows"]))
    assert mixture_record(how, blend_units(packed, mix, 1)) == record  # the pure half alone gives the same record


def test_move_to_writers_on_one_rank_lays_out_the_plan_in_order():
    mbs = _mbs({"num_samples": np.array([1, 2, 1], np.int32), "batch_size": np.array([1, 2, 1], np.int32),
                "tokens": np.array([4, 6, 8])}, [[10], [11, 12], [13]])
    packed = _units([4, 6, 8], [0, 0, 0], samples=[1, 2, 1])
    first, cols, ids, rows, ranges = move_to_writers(SerialComm(), mbs, packed, np.array([2, 0, 2, 1]),
                                                     IndexShards(1000, 10**6))
    assert first == 0 and cols["tokens"].tolist() == [8, 4, 8, 6] and ids.tolist() == [13, 10, 13, 11, 12]
    assert rows is None and ranges is None


# --- --oversize split ----------------------------------------------------------------------
def test_piece_sources_from_global_and_contiguous_ids():
    bases = np.array([0, 10, 25, 30])
    assert piece_sources(np.array([0, 0, 9, 10, 24, 24, 25, 29]), bases).tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    # contiguous numbers 0..4 are source 0's ids 3..7, 5..6 source 2's ids 25..26 (a rank's runs, numbered in turn)
    table = segment_table([[(0, 3, 5), (5, 25, 2)]])
    ids = np.array([0, 4, 4, 5, 6])
    assert piece_sources(ids, bases, table).tolist() == [0, 0, 0, 2, 2]
    assert ids.tolist() == [0, 4, 4, 5, 6]  # the caller's ids are left as they are (the sort needs them)


def test_split_union_cuts_each_source_and_keeps_its_group():
    size = np.array([3, 25, 4, 12, 2], np.int64)  # source 0: ids 0, 1; source 1: ids 2, 3, 4
    union = SampleColumns(0, 5, np.arange(5, dtype=np.int64), size, size, None, [])
    bases = np.array([0, 2, 5])
    whole = Union(union, source_of(union, bases), Sources(bases, [], [1, 1]))
    def cutting(budget: int) -> PlanOptions:
        return PlanOptions(AnalyzeOptions(), pack=PackOptions(max_tokens=budget, oversize="split"))

    cut, split = split_union(SerialComm(), whole, cutting(10))
    out, groups = cut.samples, cut.groups
    assert out.sample_id.tolist() == [0, 1, 1, 1, 2, 3, 3, 4] and out.begin.tolist() == [0, 0, 10, 20, 0, 0, 10, 0]
    assert out.size.tolist() == [3, 10, 10, 5, 4, 10, 2, 2] and groups.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert split == {"split": 2, "split_pieces": 5, "split_tokens": 37}
    kept, split = split_union(SerialComm(), whole, cutting(30))
    same, groups = kept.samples, kept.groups
    assert same is union and same.begin is None and split["split"] == 0 and groups.tolist() == [0, 0, 1, 1, 1]


def _pieces(mbs: Microbatches, begin: list[int]) -> Microbatches:
    mbs.begin = np.asarray(begin, np.int64)
    mbs.end = mbs.begin + 100
    return mbs


def test_piece_ranges_travel_with_their_ids():
    a = _pieces(_mbs({"num_samples": [1, 2], "stage": [0, 0]}, [[7], [8, 8]]), [0, 0, 64])
    b = _pieces(_mbs({"num_samples": [1], "stage": [1]}, [[3]]), [5])
    both = concat_microbatches(a, b)
    assert both.begin.tolist() == [0, 0, 64, 5] and both.end.tolist() == [100, 100, 164, 105]
    assert concat_microbatches(_mbs({"num_samples": [1]}, [[1]]), _mbs({"num_samples": [1]}, [[2]])).begin is None
    cols = {"num_samples": np.array([2, 1]), "batch_size": np.array([2, 1]), "tokens": np.array([20, 10])}
    ranges = (np.array([0, 64, 9]), np.array([64, 70, 12]))
    _, ids, _, got = plan_order(np.array([5, 1]), cols, np.array([8, 8, 3]), None, ranges)
    assert ids.tolist() == [3, 8, 8] and got[0].tolist() == [9, 0, 64] and got[1].tolist() == [12, 64, 70]
    mbs = _pieces(_mbs({"num_samples": np.array([1, 2], np.int32), "batch_size": np.array([1, 2], np.int32),
                        "tokens": np.array([4, 6])}, [[10], [11, 11]]), [3, 0, 50])
    packed = _units([4, 6], [0, 0], samples=[1, 2])
    _, _, ids, _, got = move_to_writers(SerialComm(), mbs, packed, np.array([1, 0, 1]), IndexShards(1000, 10**6))
    assert ids.tolist() == [11, 11, 10, 11, 11] and got[0].tolist() == [0, 50, 3, 0, 50]
    assert got[1].tolist() == [100, 150, 103, 100, 150]
