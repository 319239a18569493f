"""The mixture stage's communicating halves: the union's numbering and the move to the writers; 1 rank
in-process, 2-4 under mpiexec (the pure halves: tests/stages/mixture/test_mixture_stage.py)."""
from __future__ import annotations

import numpy as np
import pytest

from sortpack.parallel import get_comm
from sortpack.partition import balanced_blocks
from sortpack.stages.mixture import IndexShards, gather_packed, global_ids, move_to_writers, union_sources
from sortpack.stages.pack import Microbatches
from sortpack.stages.samples import SampleColumns


@pytest.fixture(scope="module")
def comm():
    return get_comm()


def _cuts(comm, total, seed):
    """Return this rank's [a, b) of [0, total) dealt by random weights (uneven, some ranks empty; any rank alike)."""
    lo = balanced_blocks(np.random.default_rng(seed).pareto(1.0, total), comm.size)
    return int(lo[comm.rank]), int(lo[comm.rank + 1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_union_maps_back_to_global_ids_at_any_rank_count(comm, seed):
    rows = [11, 3, 7]
    bases = np.concatenate(([0], np.cumsum(rows)))
    parts, expect = [], []
    for k, n in enumerate(rows):
        a, b = _cuts(comm, n, seed * 10 + k)
        size = np.arange(a, b, dtype=np.int64) + 100 * k
        # a float difficulty on one source only: every rank must agree on the union's kind
        difficulty = size.astype(np.float64) / 2 if k == 1 else size
        parts.append(SampleColumns(a, n, np.arange(a, b, dtype=np.int64), size, difficulty))
        expect.append(bases[k] + np.arange(a, b))
    union, groups, table, got_bases, _ = union_sources(comm, parts)
    assert got_bases.tolist() == bases.tolist() and union.total == sum(rows)
    assert union.difficulty.dtype == np.float64
    assert np.array_equal(global_ids(table, union.sample_id.copy()), np.concatenate(expect))
    assert np.array_equal(groups, np.repeat(np.arange(3), [len(e) for e in expect]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_plan_micro_batch_reaches_its_writer_with_its_ids(comm, seed):
    rng = np.random.default_rng(seed)
    total = 17
    ns_all = rng.integers(1, 5, total)
    a, b = _cuts(comm, total, seed + 7)
    ns = ns_all[a:b].astype(np.int32)
    ids = [np.arange(j * 10, j * 10 + ns_all[j]) for j in range(a, b)]
    offsets = np.concatenate(([0], np.cumsum(ns))).astype(np.int64)
    cols = {"num_samples": ns, "batch_size": ns, "padded_size": np.full(b - a, 8, np.int32),
            "tokens": (np.arange(a, b) * 3).astype(np.int64), "stage": np.zeros(b - a, np.int16)}
    flat = np.concatenate(ids + [np.zeros(0, np.int64)]).astype(np.int64)
    # --oversize split's piece ranges, parallel to the ids: begin = 7 * id, end = begin + 1
    mbs = Microbatches(a, total, flat, offsets, cols, {}, begin=flat * 7, end=flat * 7 + 1)
    packed = gather_packed(comm, mbs, 1)
    g = rng.integers(0, total, 40)  # repeats too
    first, got, got_ids, _, ranges = move_to_writers(comm, mbs, packed, g, IndexShards(5, 30))
    mine = g[first:first + len(got["tokens"])]
    assert np.array_equal(got["tokens"], mine * 3)
    assert np.array_equal(got_ids, np.concatenate([np.arange(j * 10, j * 10 + ns_all[j]) for j in mine] + [[]]))
    assert np.array_equal(ranges[0], got_ids * 7) and np.array_equal(ranges[1], got_ids * 7 + 1)
    assert first == comm.exscan(len(mine)) and comm.allreduce(len(mine), "sum") == len(g)  # blocks in plan order
