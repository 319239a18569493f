"""Collectives of the job's communicator; runs at 1 rank in-process and at 2-4 under mpiexec."""
from __future__ import annotations

import time

import numpy as np
import pytest

from sortpack import parallel
from sortpack.errors import SortpackError
from sortpack.parallel import get_comm


@pytest.fixture(scope="module")
def comm():
    return get_comm()


@pytest.mark.parametrize("max_count", [None, 3])
def test_alltoallv_delivers_in_rank_order(comm, max_count):
    if max_count is not None:
        comm.max_count = max_count  # forces several rounds: the large-count path
    try:
        p, r = comm.size, comm.rank
        # rank r sends (r + d) % 5 + d elements to rank d, valued r * 1000 + d
        counts = np.array([(r + d) % 5 + d for d in range(p)], dtype=np.int64)
        send = np.concatenate([np.full(c, r * 1000 + d, np.int64) for d, c in enumerate(counts)])
        got = comm.alltoallv(send, counts)
        expect = np.concatenate([np.full((s + r) % 5 + r, s * 1000 + r, np.int64) for s in range(p)])
        assert np.array_equal(got, expect)
        structured = np.zeros(len(send), dtype=[("a", np.int32), ("b", np.float64)])
        structured["a"] = send
        assert np.array_equal(comm.alltoallv(structured, counts)["a"], expect)
    finally:
        if max_count is not None:
            comm.max_count = 2**31 - 1


@pytest.mark.parametrize("skip_self", [False, True])
def test_alltoallv_receives_into_the_callers_memory(comm, skip_self):
    p, r = comm.size, comm.rank
    counts = np.array([(r + d) % 3 + 1 for d in range(p)], dtype=np.int64)
    send = np.concatenate([np.full(c, r * 1000 + d, np.int64) for d, c in enumerate(counts)])
    blocks = [np.full((s + r) % 3 + 1, s * 1000 + r, np.int64) for s in range(p)]
    out = np.full(sum(len(b) for b in blocks), -1, np.int64)
    got = comm.alltoallv(send, counts, out=out, skip_self=skip_self)
    assert got is out  # no new array
    if skip_self:  # this rank's own block is left as it was: the caller reads it where it lies
        blocks[r] = np.full(len(blocks[r]), -1, np.int64)
    assert np.array_equal(got, np.concatenate(blocks))
    with pytest.raises(ValueError, match="out must be"):
        comm.alltoallv(send, counts, out=np.zeros(len(out) + 1, np.int64))


def test_scans_and_gathers(comm):
    p, r = comm.size, comm.rank
    assert comm.exscan(r + 1) == sum(range(1, r + 1))
    assert comm.allreduce(r, "max") == p - 1
    assert np.array_equal(comm.allreduce(np.array([r, 1]), "sum"), np.array([p * (p - 1) // 2, p]))
    assert np.array_equal(comm.allgatherv(np.arange(r)), np.concatenate([np.arange(k) for k in range(p)]))
    assert comm.allgather_obj(r) == list(range(p))


def test_check_raises_the_same_error_everywhere(comm):
    err = SortpackError(f"bad value on rank {comm.rank}") if comm.rank == comm.size - 1 else None
    with pytest.raises(SortpackError, match=f"bad value on rank {comm.size - 1}") as info:
        comm.check(err)
    assert info.value.collective
    comm.check(None)


def test_a_rank_that_arrives_first_waits_asleep(comm, monkeypatch):
    # the first ranks at a barrier sleep between tests of the request (growing naps, at most 1 ms)
    if comm.size > 1:
        late = 0.2 if comm.rank == 0 else 0.0
        time.sleep(late)  # rank 0 comes late: the others wait for it
        started = time.process_time()
        t0 = time.perf_counter()
        comm.barrier()
        waited, cpu = time.perf_counter() - t0, time.process_time() - started
        if comm.rank != 0 and waited > 0.1:
            assert cpu < 0.5 * waited  # asleep, not spinning in MPI's progress loop
    naps = []

    class Request:
        def __init__(self):
            self.tests = 0

        def Test(self):
            self.tests += 1
            return self.tests > 12

    monkeypatch.setattr(parallel.time, "sleep", naps.append)
    parallel._wait_sleeping(Request())
    assert len(naps) == 12 and naps[0] == 1e-5 and max(naps) == 1e-3 and naps == sorted(naps)
