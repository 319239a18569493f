"""The distributed sort over real ranks: a permutation, in total order, balanced by shards."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from sortpack.parallel import get_comm
from sortpack.stages.samples import SampleColumns
from sortpack.stages.sort import SortOptions, sort_samples


@pytest.mark.parametrize("n,keyspace,key,descending", [
    (5000, 20, "size", False),        # heavy duplicates
    (4000, 10**6, "size", True),
    (3000, 0, "difficulty", False),   # float keys: the (key, id) pair path
    (7, 5, "size", False),            # fewer samples than splitter samples
])
def test_distributed_sort(n, keyspace, key, descending):
    comm = get_comm()
    rng = np.random.default_rng(11)
    size = rng.integers(0, max(keyspace, 2), size=n)
    diff = rng.random(n) if keyspace == 0 else size
    # rank r holds an uneven contiguous slice, as analyze may leave it
    cuts = np.sort(rng.integers(0, n + 1, size=comm.size - 1))
    bounds = np.concatenate(([0], cuts, [n]))
    a, b = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    mine = SampleColumns(a, n, np.arange(a, b), size[a:b], diff[a:b])
    rows = 100
    out = sort_samples(comm, mine, SortOptions(key=key, descending=descending), rows)
    ids = np.concatenate(comm.allgather_obj(out.sample_id))
    k = (diff if key == "difficulty" else size).astype(np.float64)
    expect = np.lexsort((np.arange(n), -k if descending else k))
    assert np.array_equal(ids, expect)
    sizes = np.concatenate(comm.allgather_obj(out.size))
    assert np.array_equal(sizes, size[expect])
    counts = comm.allgather_obj(len(out.sample_id))
    assert max(counts) - min(counts) <= rows
    assert out.start == sum(counts[:comm.rank])


@pytest.mark.parametrize("n,keyspace", [(3000, 5), (2500, 10**9), (3, 2), (0, 2)])
def test_exact_splitters_land_each_rank_on_its_targets(n, keyspace):
    from sortpack.stages.sample_sort import SortHints, sample_sort

    comm = get_comm()
    rng = np.random.default_rng(5)
    size = rng.integers(0, keyspace, size=n).astype(np.uint64)
    bits = max(1, int(max(n, 1) - 1).bit_length())
    packed = (size << np.uint64(bits)) | np.arange(n, dtype=np.uint64)  # unique keys, as the sort packs them
    cuts = np.sort(rng.integers(0, n + 1, size=comm.size - 1))
    bounds = np.concatenate(([0], cuts, [n]))
    a, b = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    # uneven targets, some ranks empty
    inner = np.sort(rng.integers(0, n + 1, size=comm.size - 1))
    targets = np.concatenate(([0], inner, [n])).astype(np.int64)
    out = sample_sort(comm, packed[a:b].copy(), None, {}, SortHints(targets=targets))
    assert len(out.hi) == targets[comm.rank + 1] - targets[comm.rank]
    np.testing.assert_array_equal(np.concatenate(comm.allgather_obj(out.hi)), np.sort(packed))


@pytest.mark.parametrize("stages", [1, 3])
def test_sort_lands_on_output_shards_without_a_second_exchange(stages, monkeypatch):
    import sortpack.stages.sort as sort_mod
    from sortpack.partition import owner_starts

    comm = get_comm()
    n, rows = 4000, 64
    rng = np.random.default_rng(17)
    size = rng.integers(1, 50, size=n)
    bounds = np.linspace(0, n, comm.size + 1).astype(np.int64)
    a, b = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    moved = []
    real = sort_mod.redistribute

    def spy(c, columns, my_start, dest):
        out = real(c, columns, my_start, dest)
        moved.append(any(out[k] is not columns[k] for k in columns))
        return out

    monkeypatch.setattr(sort_mod, "redistribute", spy)
    mine = SampleColumns(a, n, np.arange(a, b), size[a:b], size[a:b])
    out = sort_samples(comm, mine, SortOptions(stages=stages), rows)
    assert moved == [False]  # every rank already held its whole shards
    assert out.start == owner_starts(n, rows, comm.size)[comm.rank]
    ids = np.concatenate(comm.allgather_obj(out.sample_id))
    if stages == 1:
        np.testing.assert_array_equal(ids, np.lexsort((np.arange(n), size)))
    else:
        assert sorted(ids.tolist()) == list(range(n))


@pytest.mark.parametrize("first_share", [0.3, 0.7])
def test_a_consumed_sort_of_uneven_ranks_is_the_total_order(first_share):
    # the consumed path receives into the codes' own buffer and merges there or into the radix scratch
    # (two ranks: within the received codes, the own run read where it was sent from)
    comm = get_comm()
    n = 60_000
    size = np.random.default_rng(5).integers(0, 4000, n)
    bounds = np.linspace(0, n, comm.size + 1).astype(np.int64)
    bounds[1] = int(n * first_share / max(comm.size - 1, 1)) if comm.size > 1 else n
    a, b = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    out = sort_samples(comm, SampleColumns(a, n, np.arange(a, b), size[a:b].copy(), size[a:b].copy()), SortOptions(),
                       1000, consume=True)
    ref = np.lexsort((np.arange(n), size))
    assert np.array_equal(np.concatenate(comm.allgather_obj(out.sample_id)), ref)
    assert np.array_equal(np.concatenate(comm.allgather_obj(out.size)), size[ref])


@pytest.mark.parametrize("first_share", [0.5, 0.3])
def test_a_consumed_sort_holds_no_array_beyond_its_two_buffers(first_share):
    # numpy's allocations are traced: at its peak a rank holds the codes' buffer and the radix scratch (each
    # 8 bytes a sample of the larger of its input and its target range), which end as the sorted sizes and
    # ids, and the stage column; the exchange and the merge land in them (a third array was 1.4-2.3x more)
    comm = get_comm()
    per_rank = 1 << 17
    n = per_rank * comm.size
    size = np.random.default_rng(9).integers(1, 4000, n).astype(np.int32)
    bounds = np.linspace(0, n, comm.size + 1).astype(np.int64)
    bounds[1] = int(bounds[1] * first_share * 2) if comm.size > 1 else n
    a, b = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    mine = SampleColumns(a, n, np.arange(a, b), size[a:b].copy(), None)
    mine.difficulty = mine.size
    rows = 3 << 12  # shards that do not split evenly: a rank may receive more than it sent
    tracemalloc.start()
    try:
        out = sort_samples(comm, mine, SortOptions(), rows, consume=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    room = max(b - a, len(out.sample_id))
    assert peak <= 16 * room + 2 * len(out.sample_id) + (1 << 16), (peak, room)
    ref = np.lexsort((np.arange(n), size))
    assert np.array_equal(np.concatenate(comm.allgather_obj(out.sample_id)), ref)
