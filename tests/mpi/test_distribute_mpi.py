"""Moving rows and ragged micro-batches between ranks; 1 rank in-process, 2-4 under mpiexec."""
from __future__ import annotations

import numpy as np
import pytest

from sortpack.distribute import global_start, move_ragged, redistribute
from sortpack.parallel import get_comm


@pytest.fixture(scope="module")
def comm():
    return get_comm()


def _my_range(comm, total, seed):
    """Return an uneven split of [0, total) over ranks (the same on every rank)."""
    cuts = np.sort(np.random.default_rng(seed).integers(0, total + 1, comm.size - 1))
    starts = np.concatenate(([0], cuts, [total])).astype(np.int64)
    return starts, int(starts[comm.rank]), int(starts[comm.rank + 1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_redistribute_keeps_global_order(comm, seed):
    total = 57
    _, a, b = _my_range(comm, total, seed)
    dest, da, db = _my_range(comm, total, seed + 100)
    got = redistribute(comm, {"x": np.arange(a, b, dtype=np.int64) * 3}, a, dest)
    assert np.array_equal(got["x"], np.arange(da, db, dtype=np.int64) * 3)
    assert global_start(comm, b - a) == (a, total)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_move_ragged_delivers_the_owned_micro_batches(comm, seed):
    total_mb = 23
    lengths_all = np.random.default_rng(seed).integers(0, 5, total_mb)  # empty micro-batches too
    flat_off = np.concatenate(([0], np.cumsum(lengths_all)))
    values_all = np.arange(flat_off[-1], dtype=np.int64) * 7
    _, first, end = _my_range(comm, total_mb, seed)
    dest, da, db = _my_range(comm, total_mb, seed + 50)
    mine = values_all[flat_off[first]:flat_off[end]]
    got = move_ragged(comm, mine, lengths_all[first:end], first, dest)
    assert np.array_equal(got, values_all[flat_off[da]:flat_off[db]])
