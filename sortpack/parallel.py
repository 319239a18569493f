"""The communicator: the only module that touches mpi4py.

Stages receive a ``Comm`` and call plain methods on numpy arrays (``alltoallv``,
``allgather``, ``exscan`` ...). ``SerialComm`` implements the same interface for one
process, so a stage reads the same with or without MPI. ``get_comm()`` picks MPI when
mpi4py can load an MPI library and falls back to one rank with a one-line warning.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from .env import env_flag, env_text
from .errors import SortpackError, one_line

# MPI counts and displacements are C ints; one round of an exchange moves at most this
# many elements per peer, further rounds carry the rest (the "64-bit counts" guard).
_MAX_COUNT = 2**31 - 1


class Comm:
    """Interface shared by the MPI and the one-rank communicator."""

    rank: int = 0
    size: int = 1
    max_count: int = _MAX_COUNT

    # --- primitives, implemented by subclasses -------------------------------------
    def allgather_obj(self, obj: Any) -> list:
        """Return the list of every rank's ``obj`` (small Python objects only)."""
        raise NotImplementedError

    def bcast_obj(self, obj: Any, root: int = 0) -> Any:
        """Return root's ``obj`` on every rank."""
        raise NotImplementedError

    def allreduce(self, value, op: str = "sum"):
        """Return the reduction (sum, max, min) of a scalar or numpy array over ranks."""
        raise NotImplementedError

    def exscan(self, value: int) -> int:
        """Return the sum of ``value`` over lower ranks (0 on rank 0)."""
        raise NotImplementedError

    bytes_sent: int = 0  # payload bytes this rank sent to other ranks by alltoallv

    def exchange_counts(self, sendcounts) -> np.ndarray:
        """Return, per source rank, how many elements it sends here (an Alltoall of counts)."""
        raise NotImplementedError

    def alltoallv(self, arr: np.ndarray, sendcounts, recvcounts=None, out: np.ndarray | None = None,
                  skip_self: bool = False) -> np.ndarray:
        """Return what every rank sent here, concatenated in rank order.

        ``arr`` is ordered by destination; ``sendcounts[p]`` elements go to rank p.
        Pass ``recvcounts`` from ``exchange_counts`` to skip exchanging the counts again.
        ``out`` (1-D, ``arr``'s dtype, C-contiguous, as long as what arrives, not overlapping
        ``arr``) receives in place of a new array: memory the caller already holds, not fresh
        pages. ``skip_self`` leaves this rank's own block of the result unwritten (the caller
        reads it where it already lies): no copy of it is made.
        """
        raise NotImplementedError

    def allgatherv(self, arr: np.ndarray) -> np.ndarray:
        """Return every rank's 1-D ``arr`` concatenated in rank order (small arrays)."""
        raise NotImplementedError

    def barrier(self) -> None:
        """Wait for every rank."""

    def node_size(self) -> int:
        """Return how many ranks of the job share this rank's node (its memory and cores)."""
        return 1

    def abort(self, code: int) -> None:
        """End every rank of the job with exit status ``code``."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    # --- helpers built on the primitives ---------------------------------------------
    def check(self, error: BaseException | None) -> None:
        """Raise, on every rank, the lowest rank's user error if any rank had one.

        Call it after local work that may fail on some ranks only: all ranks then
        leave together with the same message instead of hanging in the next collective.
        """
        self.barrier()  # after local work ranks arrive apart: the first ones wait without spinning
        messages = self.allgather_obj(None if error is None else one_line(error))
        for msg in messages:
            if msg is not None:
                raise SortpackError(msg, collective=True)

    def collectively(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """Return ``fn(*args, **kwargs)``, turning a user error on any rank into one on all.

        For checks that every rank runs (option validation, reading a manifest), so the
        job exits with one ``Error:`` line instead of one per rank.
        """
        err, out = None, None
        try:
            out = fn(*args, **kwargs)
        except SortpackError as exc:
            err = exc
        self.check(err)
        return out

    def alltoallv_many(self, arrays: dict[str, np.ndarray], sendcounts) -> dict[str, np.ndarray]:
        """Return ``alltoallv`` of each array (all ordered by destination, same counts)."""
        recv = self.exchange_counts(sendcounts)
        return {k: self.alltoallv(a, sendcounts, recv) for k, a in arrays.items()}

    def is_root(self) -> bool:
        """Return whether this is rank 0."""
        return self.rank == 0


class SerialComm(Comm):
    """One rank, no MPI: every collective is the identity."""

    def allgather_obj(self, obj):
        return [obj]

    def bcast_obj(self, obj, root=0):
        return obj

    def allreduce(self, value, op="sum"):
        return value.copy() if isinstance(value, np.ndarray) else value

    def exscan(self, value):
        return 0

    def exchange_counts(self, sendcounts):
        return np.asarray(sendcounts, dtype=np.int64).copy()

    def alltoallv(self, arr, sendcounts, recvcounts=None, out=None, skip_self=False):
        # one rank keeps its data: returned as is, not copied (unless asked to land in ``out``)
        counts = np.asarray(sendcounts, dtype=np.int64)
        if counts.shape != (1,) or counts[0] != len(arr):
            raise ValueError("sendcounts must hold len(arr) for the one rank")
        if out is None:
            return arr
        out = _receive_buffer(out, arr.dtype, len(arr))
        if not skip_self:
            out[...] = arr
        return out

    def allgatherv(self, arr):
        return np.asarray(arr)


class MPIComm(Comm):
    """mpi4py behind the ``Comm`` interface, on a private duplicate of the world."""

    def __init__(self, mpi_comm=None):
        from mpi4py import MPI

        self._MPI = MPI
        self._c = (mpi_comm or MPI.COMM_WORLD).Dup()
        self.rank = self._c.Get_rank()
        self.size = self._c.Get_size()
        self._ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}

    def allgather_obj(self, obj):
        return self._c.allgather(obj)

    def bcast_obj(self, obj, root=0):
        return self._c.bcast(obj, root=root)

    def allreduce(self, value, op="sum"):
        if isinstance(value, np.ndarray):
            value = np.ascontiguousarray(value)
            out = np.empty_like(value)
            self._c.Allreduce(value, out, op=self._ops[op])
            return out
        return self._c.allreduce(value, op=self._ops[op])

    def exscan(self, value):
        out = self._c.exscan(int(value), op=self._MPI.SUM)
        return 0 if self.rank == 0 or out is None else int(out)

    def barrier(self):
        _wait_sleeping(self._c.Ibarrier())

    def node_size(self):
        node = self._c.Split_type(self._MPI.COMM_TYPE_SHARED)
        try:
            return node.Get_size()
        finally:
            node.Free()

    def abort(self, code):
        sys.stdout.flush()
        sys.stderr.flush()
        self._c.Abort(code)

    def _elem_type(self, dtype: np.dtype):
        # One MPI element per numpy element keeps counts small (bytes would overflow
        # the int count 8x sooner) and works for structured dtypes too.
        t = self._MPI.BYTE.Create_contiguous(dtype.itemsize)
        t.Commit()
        return t

    def exchange_counts(self, sendcounts):
        if self.size == 1:
            return np.asarray(sendcounts, dtype=np.int64).copy()
        send = np.ascontiguousarray(sendcounts, dtype=np.int64)
        recv = np.empty(self.size, dtype=np.int64)
        self._c.Alltoall(send, recv)
        return recv

    def alltoallv(self, arr, sendcounts, recvcounts=None, out=None, skip_self=False):
        if self.size == 1:
            return SerialComm().alltoallv(arr, sendcounts, out=out, skip_self=skip_self)
        arr = np.ascontiguousarray(arr)
        if arr.ndim != 1:
            raise ValueError("alltoallv takes 1-D arrays")
        send = np.ascontiguousarray(sendcounts, dtype=np.int64)
        if send.shape != (self.size,) or int(send.sum()) != len(arr):
            raise ValueError("sendcounts must have one entry per rank and sum to len(arr)")
        recv = self.exchange_counts(send) if recvcounts is None else np.asarray(recvcounts, np.int64)
        self.bytes_sent += int(send.sum() - send[self.rank]) * arr.dtype.itemsize
        out = np.empty(int(recv.sum()), dtype=arr.dtype) if out is None else \
            _receive_buffer(out, arr.dtype, int(recv.sum()))
        if arr.dtype.itemsize == 0:
            return out
        sdispl = np.concatenate(([0], np.cumsum(send)[:-1]))
        rdispl = np.concatenate(([0], np.cumsum(recv)[:-1]))
        local_rounds = -(-max(int(send.max()), int(recv.max())) // self.max_count)
        rounds = max(1, self._c.allreduce(local_rounds, op=self._MPI.MAX))
        etype = self._elem_type(arr.dtype)
        sbuf = arr.view(np.uint8) if arr.size else np.empty(0, np.uint8)
        rbuf = out.view(np.uint8) if out.size else np.empty(0, np.uint8)
        try:
            for k in range(rounds):
                off = k * self.max_count
                sc = np.clip(send - off, 0, self.max_count)
                rc = np.clip(recv - off, 0, self.max_count)
                if skip_self:
                    sc[self.rank] = rc[self.rank] = 0
                # Displacements past 2**31 elements need MPI-4 large-count routines,
                # which mpi4py picks when the values do not fit a C int.
                self._c.Alltoallv(
                    [sbuf, (sc, sdispl + np.minimum(off, send)), etype],
                    [rbuf, (rc, rdispl + np.minimum(off, recv)), etype],
                )
        finally:
            etype.Free()
        return out

    def allgatherv(self, arr):
        arr = np.ascontiguousarray(arr)
        counts = np.asarray(self._c.allgather(len(arr)), dtype=np.int64)
        if counts.max(initial=0) > self.max_count or counts.sum() > self.max_count:
            raise ValueError("allgatherv is for small arrays")
        out = np.empty(int(counts.sum()), dtype=arr.dtype)
        if out.size == 0:
            return out
        etype = self._elem_type(arr.dtype)
        displ = np.concatenate(([0], np.cumsum(counts)[:-1]))
        sbuf = arr.view(np.uint8) if arr.size else np.empty(0, np.uint8)
        try:
            self._c.Allgatherv([sbuf, len(arr), etype], [out.view(np.uint8), (counts, displ), etype])
        finally:
            etype.Free()
        return out


def _wait_sleeping(request) -> None:
    """Wait for a non-blocking MPI request, sleeping between tests (10 us, doubling up to 1 ms).

    A rank that reaches a collective first gives its core away instead of spinning in MPI's
    progress loop: on a node shared with other jobs (or more ranks than cores) the ranks still
    working get it. The cost is at most a millisecond after the last rank arrives.
    """
    delay = 1e-5
    while not request.Test():
        time.sleep(delay)
        delay = min(delay * 2, 1e-3)


def _receive_buffer(out: np.ndarray, dtype: np.dtype, n: int) -> np.ndarray:
    """Return ``out`` checked to receive ``n`` elements of ``dtype`` in place (ValueError if it cannot)."""
    if out.ndim != 1 or out.dtype != dtype or len(out) != n or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"alltoallv: out must be a writeable C-contiguous 1-D {dtype} array of {n} elements")
    return out


_WORLD: Comm | None = None


def get_comm() -> Comm:
    """Return the job's communicator: MPI when a launcher started this process and an MPI library loads, else one
    rank.

    A process with no launcher's variable set (``launcher.launched``: a plain shell's, a
    notebook's) is a job of one rank: MPI is not loaded (its import and singleton start cost
    about 0.02 s of a small run's start-up CPU); ``SORTPACK_MPI=1`` loads it anyway (a
    launcher that sets none of those variables). ``SORTPACK_NO_MPI=1`` forces the one-rank
    communicator. When MPI cannot load but the launcher's environment says the job has several
    ranks, raises ``SortpackError``: each rank would otherwise run the whole job alone and
    replace the others' output. So does a launcher variable that is set but wrong
    (``launcher.LauncherError``).
    """
    global _WORLD
    if _WORLD is not None:
        return _WORLD
    from .env import check_integers
    from .launcher import launched, launcher

    launcher()  # a launcher variable that is set but wrong is an error even when MPI knows better
    try:  # so is a SORTPACK_* integer that is not one: before any work, on every rank alike
        check_integers()
    except ValueError as exc:
        raise SortpackError(str(exc)) from None
    if env_flag("SORTPACK_NO_MPI") or (launched() is None and not env_flag("SORTPACK_MPI")):
        _WORLD = SerialComm()
        return _WORLD
    try:
        _WORLD = MPIComm()
    except Exception as exc:  # ImportError, or RuntimeError when libmpi cannot load
        from .launcher import launcher_size

        ranks, var = launcher_size()
        if ranks > 1:
            raise SortpackError(f"the launcher started {ranks} ranks ({var}={ranks}) but MPI cannot load "
                                f"({one_line(exc)}); each rank would run the whole job alone. Fix mpi4py "
                                f"(it must be built against the launcher's MPI) or run one process") from None
        print(
            f"sortpack: warning: MPI unavailable ({one_line(exc)}); running as one rank",
            file=sys.stderr,
        )
        _WORLD = SerialComm()
    return _WORLD


def run_guarded(comm: Comm, fn: Callable[[], Any], echo: Callable[[str], None]) -> int:
    """Run ``fn`` and turn errors into exit codes without ever leaving ranks hanging.

    A user error raised together on every rank exits 2 after rank 0 prints it once. A
    user error on one rank prints its line there and aborts the job with status 2; any
    other exception prints its traceback and aborts with status 1.
    """
    try:
        fn()
        return 0
    except SortpackError as exc:
        if exc.collective or comm.size == 1:
            if comm.rank == 0:
                echo(f"Error: {one_line(exc)}")
            return 2
        echo(f"Error: {one_line(exc)}")
        comm.abort(2)
        return 2
    except KeyboardInterrupt:
        if comm.size > 1:
            comm.abort(130)
        raise
    except BaseException as exc:  # noqa: BLE001 - every other failure must end all ranks
        if isinstance(exc, SystemExit) and comm.size == 1:
            raise
        traceback.print_exc()
        sys.stderr.write(f"sortpack: rank {comm.rank} failed; aborting all ranks\n")
        comm.abort(1)
        return 1


def fault_point(comm: Comm, name: str) -> None:
    """Raise here on the rank that ``SORTPACK_FAULT=name:rank`` names (fault-injection for tests).

    Tests use it to prove that one failing rank ends the whole job instead of hanging it;
    ``name:rank:kill`` sends that rank SIGKILL instead (a job killed at that very point),
    ``name:rank:stall`` makes it wait 10 minutes (a job to be signalled there).
    """
    spec = env_text("SORTPACK_FAULT")
    if spec and spec == f"{name}:{comm.rank}":
        raise RuntimeError(f"injected fault at {name} on rank {comm.rank}")
    if spec and spec == f"{name}:{comm.rank}:kill":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if spec and spec == f"{name}:{comm.rank}:stall":
        import time

        time.sleep(600)
