"""The distributed sort over real ranks: a permutation, in total order, balanced by shards."""
from __future__ import annotations

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
