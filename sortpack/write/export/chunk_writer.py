"""An export's tokens written a chunk of micro-batches at a time, two workers at once: ``write_chunks``.

A chunk's samples are gathered from where they lie (``PlanTokens.runs``: the mapped ``.bin``
of a Megatron input, the stored Arrow column) and converted to the output's dtype by the
compiled run copy (``kernels.runs.write_runs``) into a small buffer of the worker's own,
written at their offset with ``pwrite`` each time it is full: the buffer stays in the core's
cache, so the tokens cross memory as often as a plain write of them does. The kernel runs
with the GIL released, so the two workers copy and write chunks side by side. Where a
dataset lies behind a URL, each chunk is read whole (``PlanTokens.read``) and written the
same way.

The ``.bin`` is allocated at its final size before the first write (``reserve``): a full disk
fails there, before any token is copied, and the writes land in blocks already allocated.
"""
from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ...env import env_int
from ...format.megatron import IndexLayout
from ...kernels.runs import Runs, Sink, write_runs
from .plan_tokens import Located, PlanTokens

CHUNK_TOKENS = 1 << 20  # tokens of a chunk, a worker's task: enough that its calls cost little, few to share
SCRATCH_BYTES = 1 << 19  # a worker's buffer: within a core's L2 cache, large enough that a pwrite costs little
WORKERS = 2  # threads writing one rank's share (fewer where the process may run on fewer cores)


class Target(NamedTuple):
    """One dataset being written: its temporary files, its dtype, its layout, whether its values' range is measured."""

    bin: Path
    idx: Path
    dtype: np.dtype
    layout: IndexLayout
    measure: bool


class Share(NamedTuple):
    """One rank's part of the export: micro-batches from ``lo`` (``num_samples`` each), where its samples lie and
    where its part starts (its first sample in plan order, its first token in ``.bin``), cut into ``chunks``."""

    lo: int
    num_samples: np.ndarray  # per micro-batch
    first_row: int
    first_token: int
    where: Located
    chunks: list[tuple[int, int]]  # micro-batch ranges written at once

    def samples(self, a: int, b: int) -> tuple[int, int]:
        """Return the share's samples ``[s, t)`` that micro-batches ``[a, b)`` hold."""
        s = int(self.num_samples[:a - self.lo].sum())
        return s, s + int(self.num_samples[a - self.lo:b - self.lo].sum())


def chunk_tokens() -> int:
    """Return the tokens of a chunk (``SORTPACK_TEST_EXPORT_TOKENS``, read when used, in tests)."""
    return env_int("SORTPACK_TEST_EXPORT_TOKENS") or CHUNK_TOKENS


def chunks(lo: int, num_samples: np.ndarray, lengths: np.ndarray) -> list[tuple[int, int]]:
    """Return runs of micro-batches from ``lo`` of about ``chunk_tokens()`` tokens each (at least one micro-batch)."""
    most = chunk_tokens()
    ends = np.cumsum(num_samples)
    tokens = np.concatenate(([0], np.cumsum(lengths)))
    mb_tokens = tokens[ends] - tokens[ends - num_samples]
    out, start, held = [], 0, 0
    for j, t in enumerate(mb_tokens.tolist()):
        if held and held + t > most:
            out.append((lo + start, lo + j))
            start, held = j, 0
        held += t
    if start < len(mb_tokens):
        out.append((lo + start, lo + len(mb_tokens)))
    return out


def _in_memory(values: np.ndarray, offsets: np.ndarray) -> Runs:
    """Return the ``Runs`` of lists already gathered one after another (``values``, ``offsets`` from 0)."""
    counts = np.diff(offsets).astype(np.int64)
    return Runs((values.view(np.uint8),), (values.dtype,), np.zeros(len(counts), np.int64),
                offsets[:-1].astype(np.int64) * values.dtype.itemsize, counts)


def runs_of(plan: PlanTokens, share: Share, chunk: tuple[int, int]) -> tuple[Runs, Runs | None]:
    """Return the ``Runs`` of a chunk's ids and labels (None without): a part of the share's where they are
    mapped, else the chunk read now."""
    s, t = share.samples(*chunk)
    where = share.where
    if where.mapped:
        return where.ids.part(s, t), None if where.labels is None else where.labels.part(s, t)
    got = plan.read(chunk[0], chunk[1], share.first_row + s)
    return _in_memory(got.values, got.offsets), None if got.labels is None else _in_memory(got.labels, got.offsets)


@lru_cache(maxsize=1)
def _fallocate() -> Any:
    """Return libc's ``fallocate`` (Linux), or None."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = getattr(libc, "fallocate64", None) or libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64], ctypes.c_int
    return fn


def reserve(fd: int, size: int) -> None:
    """Give the empty file ``fd`` its ``size`` bytes: allocated where the file system can (``fallocate``; a full disk
    is an ``OSError`` now), else as a hole (``ftruncate``)."""
    fn = _fallocate()
    if fn is not None and size > 0:
        if fn(fd, 0, 0, size) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV):
            raise OSError(err, os.strerror(err))
    os.ftruncate(fd, size)


class _Chunks:
    """Writes chunks of a share into the targets' ``.bin``, each worker through files and a buffer of its own."""

    def __init__(self, plan: PlanTokens, share: Share, targets: list[Target]):
        self.plan, self.share, self.targets = plan, share, targets
        counts = share.where.ids.counts
        self.token_at = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)

    def __call__(self, chunk: tuple[int, int], fds: list[int], scratch: np.ndarray) -> list[np.ndarray]:
        """Write one chunk into every target (open as ``fds``); return the (low, high, over) of each target's
        values."""
        s, _ = self.share.samples(*chunk)
        first = self.share.first_token + int(self.token_at[s])
        out = []
        for fd, t, runs in zip(fds, self.targets, runs_of(self.plan, self.share, chunk)):
            assert runs is not None
            out.append(write_runs(runs, Sink(fd, first * t.dtype.itemsize, t.dtype), scratch, t.measure)[1])
        return out


def _workers() -> int:
    """Return how many threads write: ``WORKERS``, or fewer where this process may run on fewer cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(WORKERS, cores))


def write_chunks(plan: PlanTokens, share: Share, targets: list[Target], beside: Callable[[], None]) -> np.ndarray:
    """Write the share's tokens into every target's ``.bin``, and run ``beside`` (the ``.idx`` writes) alongside;
    return the (low, high, over) of each chunk's values per target (int64, chunks x targets x 3;
    ``kernels.runs.NO_RANGE`` where not measured).

    The calling thread is a worker too (a thread started costs a millisecond or two, the whole
    write of 100k samples a dozen); each worker takes the next chunk when it is done and writes
    through files it opens and closes itself, so a worker still finishing its chunk after the
    other failed or was interrupted never writes through a descriptor closed, and perhaps
    reused, under it.
    """
    job = _Chunks(plan, share, targets)
    results: list[Any] = [None] * len(share.chunks)
    todo = iter(range(len(share.chunks)))  # shared: next() on it is one step under the GIL
    failed = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        fds: list[int] = []
        try:
            for t in targets:
                fds.append(os.open(t.bin, os.O_WRONLY))
            scratch = np.empty(SCRATCH_BYTES, np.uint8)  # reused: a fresh one would fault its pages in each time
            for k in todo:
                if failed.is_set():
                    return
                results[k] = job(share.chunks[k], fds, scratch)
        except BaseException:
            failed.set()
            raise
        finally:
            for fd in fds:
                os.close(fd)

    def helper(done: threading.Event) -> None:
        try:
            if not failed.is_set():  # started late, after a failure: nothing to do
                work()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    helpers = [(threading.Thread(target=helper, args=(done,), name="sortpack-export", daemon=True), done)
               for done in (threading.Event() for _ in range(min(_workers(), len(share.chunks)) - 1))]
    try:
        for thread, _ in helpers:
            thread.start()
        beside()
        work()
    except BaseException:
        failed.set()
        raise
    finally:
        _wait([done for thread, done in helpers if thread.ident is not None], failed)
    if errors:
        raise errors[0]
    return np.array(results, dtype=np.int64).reshape(len(share.chunks), len(targets), 3)


def _wait(events: list[threading.Event], failed: threading.Event) -> None:
    """Wait until every event is set, also through an interrupt (then re-raised, the workers told to stop)."""
    interrupted: BaseException | None = None
    for event in events:
        while True:
            try:
                event.wait()
                break
            except BaseException as exc:  # KeyboardInterrupt while waiting: the helper stops at its next chunk
                failed.set()
                interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted
