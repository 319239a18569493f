"""Index shard layout and analyze's row split across real ranks (1 rank in-process, 2-4 under mpiexec)."""
from __future__ import annotations

import numpy as np
import pytest

from sortpack.format.shards import balanced_blocks, index_shard_layout
from sortpack.parallel import get_comm


@pytest.fixture(scope="module")
def comm():
    return get_comm()


def _layout_oracle(counts: np.ndarray, rows: int, per: int) -> np.ndarray:
    # sequential rule: a shard ends after the micro-batch whose samples reach a multiple of `per`
    # and after every `rows` micro-batches
    starts, run = [0], 0
    for m, c in enumerate(counts):
        before, run = run, run + int(c)
        if (run // per > before // per or (m + 1) % rows == 0) and m + 1 < len(counts):
            starts.append(m + 1)
    starts.append(len(counts))
    return np.asarray(starts if len(counts) else [0])


@pytest.mark.parametrize("m,rows,per", [(0, 5, 10), (1, 5, 10), (200, 7, 50), (500, 1000, 97), (64, 4, 1)])
def test_index_shards_do_not_depend_on_the_rank_split(comm, m, rows, per):
    rng = np.random.default_rng(m)
    counts = rng.integers(0, 40, m)
    counts[::3] = rng.integers(100, 300, len(counts[::3]))  # short and long micro-batches alike
    # an uneven split of the micro-batches over ranks, as pack leaves them
    cuts = np.sort(rng.integers(0, m + 1, comm.size - 1)) if m else np.zeros(comm.size - 1, np.int64)
    bounds = np.concatenate(([0], cuts, [m])).astype(np.int64)
    lo, hi = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    starts, dest = index_shard_layout(comm, counts[lo:hi], lo, m, rows, per)
    assert np.array_equal(starts, _layout_oracle(counts, rows, per))
    assert dest[0] == 0 and dest[-1] == m and np.all(np.diff(dest) >= 0)
    assert set(dest.tolist()) <= set(starts.tolist())  # ranks own whole shards
    if len(starts) - 1 >= 4 * comm.size:
        assert np.all(np.diff(dest) > 0)  # with enough shards, every rank writes


def test_balanced_blocks_spread_by_weight():
    assert balanced_blocks(np.ones(8), 4).tolist() == [0, 2, 4, 6, 8]
    # the heavy item, midpoint in the second half, goes with the items after it
    assert balanced_blocks(np.array([1, 1, 1, 10, 1, 1, 1.0]), 2).tolist() == [0, 3, 7]
    assert balanced_blocks(np.zeros(0), 3).tolist() == [0, 0, 0, 0]
