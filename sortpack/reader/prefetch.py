"""Warm the page cache with the stored bytes a rank reads next, in the order it reads them.

Stored micro-batches (``sortpack run --store``) are read from memory-mapped data shards in
the sampler's order. From a cold page cache every first touch of a micro-batch faults, and
the kernel reads its whole read-around window (``/sys/block/*/queue/read_ahead_kb``, often
128 KB to 8 MB) for a micro-batch of a few KB: the first minutes run at disk-seek speed and
each rank pulls in far more than its share. ``Prefetcher`` runs a background thread that
asks the kernel (``posix_fadvise(WILLNEED)``, asynchronous reads) for exactly the byte
ranges of the next micro-batches in the order given, a bounded number of bytes ahead of
the reader, so the reads are in flight before the loop needs them. It only hints: what the
reader returns never changes. On a warm cache a hint is a page-cache lookup.

``Prefetched(sampler)`` wraps a ``PackedSampler``/``PackedBatchSampler``: iterating it
iterates the sampler, warming this rank's schedule as it goes. Over a plan without
``--store`` (its rows read from the inputs, local files or ``s3://``/``gs://`` objects),
``Prefetched(sampler, dataset=ds)`` reads the ``SourceDataset``'s input units ahead in the
same order (``UnitWarmer``). Depends on numpy and pyarrow only.
"""
from __future__ import annotations

import os
import threading
from typing import TypeVar

import numpy as np
import pyarrow as pa

from ..arrow_types import fixed_width, is_offset_bytes, is_offset_list

AHEAD_BYTES = 256 << 20
_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)



class _ShardRanges:
    """The file byte ranges that rows of one data shard occupy, buffer by buffer."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_RDONLY)
        self.path, self.size = path, os.fstat(self.fd).st_size
        mapped = pa.memory_map(path, "r")
        base = mapped.read_buffer(1).address  # the map's first byte: buffers are views into it
        mapped.seek(0)
        batch = pa.ipc.open_file(mapped).get_batch(0)
        self.num_rows = batch.num_rows
        self.parts: list[tuple] = []  # (kind, file offset, size, array offset, extra)
        for col in batch.columns:
            self._describe(col, base)

    def _describe(self, arr: pa.Array, base: int) -> None:
        bufs, off, t = arr.buffers(), arr.offset, arr.type
        if bufs[0] is not None:
            self.parts.append(("bits", bufs[0].address - base, bufs[0].size, off, None))
        if is_offset_bytes(t) or (is_offset_list(t) and fixed_width(t.value_type)):
            width = 8 if pa.types.is_large_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_list(t) \
                else 4
            offsets = np.frombuffer(bufs[1], dtype=np.int64 if width == 8 else np.int32)
            self.parts.append(("offsets", bufs[1].address - base, bufs[1].size, off, width))
            if is_offset_bytes(t):
                if bufs[2] is not None:
                    self.parts.append(("values", bufs[2].address - base, bufs[2].size, off, (offsets, 1, 0)))
            else:
                child = arr.values
                cb = child.buffers()
                if cb[0] is not None:
                    self.parts.append(("child_bits", cb[0].address - base, cb[0].size, off, (offsets, child.offset)))
                if cb[1] is not None:
                    self.parts.append(("values", cb[1].address - base, cb[1].size, off,
                                       (offsets, fixed_width(t.value_type), child.offset)))
        elif fixed_width(t) and len(bufs) == 2 and bufs[1] is not None:
            self.parts.append(("fixed", bufs[1].address - base, bufs[1].size, off, fixed_width(t)))
        else:  # nested or bit-packed: the rows' share of each buffer (a hint needs no exact range)
            for buf in bufs[1:]:
                if buf is not None and buf.size:
                    self.parts.append(("share", buf.address - base, buf.size, off, len(arr) + off))

    def ranges(self, a: int, b: int) -> list[tuple[int, int]]:
        """Return (file offset, length) of every buffer range that rows ``[a, b)`` use."""
        if os.fstat(self.fd).st_size != self.size:  # its offsets are read from the map: a shrunk file is a bus error
            raise OSError(f"{self.path}: changed size under the prefetcher; hints stop (the reader names the change)")
        out = []
        for kind, at, size, off, extra in self.parts:
            if kind == "bits":
                lo, hi = (off + a) // 8, (off + b + 7) // 8
            elif kind == "fixed":
                lo, hi = (off + a) * extra, (off + b) * extra
            elif kind == "offsets":  # rows [a, b) read offsets a..b
                lo, hi = (off + a) * extra, (off + b + 1) * extra
            elif kind == "values":
                offsets, width, child_off = extra
                lo, hi = (child_off + int(offsets[off + a])) * width, (child_off + int(offsets[off + b])) * width
            elif kind == "child_bits":
                offsets, child_off = extra
                lo, hi = (child_off + int(offsets[off + a])) // 8, (child_off + int(offsets[off + b]) + 7) // 8
            else:
                lo, hi = size * (off + a) // extra, -(-size * (off + b) // extra)
            lo, hi = max(0, lo), min(size, hi)
            if hi > lo:
                out.append((at + lo, hi - lo))
        return out

    def close(self) -> None:
        os.close(self.fd)


_B = TypeVar("_B", bound="_Background")


class _Background:
    """A reader's helper thread as a context manager: ``stop`` ends it (``_cond``, ``_thread``, ``_stopped``)."""

    _cond: threading.Condition
    _thread: threading.Thread
    _stopped: bool

    def __enter__(self: _B) -> _B:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """End the thread."""
        self._end_thread()

    def _end_thread(self) -> None:
        """Tell the thread to stop and wait for it (unless it is the caller: a thread cannot join itself)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()


class Prefetcher(_Background):
    """A background thread that warms the stored bytes of micro-batches ``order`` ahead of the reader.

    ``stored`` is a ``StoredData`` (``PackedIndex.stored``); ``order`` the micro-batch
    numbers in the order they will be read. The thread hints micro-batches from the
    reader's position (``advance``) on, as long as the bytes hinted ahead of it stay under
    ``ahead_bytes``. ``stop()`` (or leaving a ``with`` block) ends it and closes its files.

    ``whole``: hint a data shard whole, the first time one of its micro-batches comes up,
    instead of each micro-batch's ranges. One large sequential read beats many small ones
    when ``order`` reads most of every shard (one rank of one, or the whole epoch of few
    ranks); small ranges win when a rank reads a small share (many ranks). None (default):
    whole shards when ``order`` covers at least half of the rows of the shards it touches.
    """

    def __init__(self, stored, order, ahead_bytes: int = AHEAD_BYTES, start: bool = True,
                 whole: bool | None = None):
        self.stored = stored
        self.order = np.asarray(order, dtype=np.int64).reshape(-1)
        self.ahead_bytes = max(1, int(ahead_bytes))
        self.hinted = 0  # micro-batches of ``order`` hinted so far
        self.hinted_bytes = 0
        self._position = 0
        self._bytes_at = np.zeros(len(self.order) + 1, dtype=np.int64)  # hinted bytes before each one
        self._shards: dict[int, _ShardRanges] = {}
        entries = stored.index.manifest["data"]["shards"]
        self._files = [str(stored.path / e["file"]) for e in entries]
        self._firsts = np.array([int(e["first"]) for e in entries] + [stored.num_rows], dtype=np.int64)
        self.whole = self._covers_half() if whole is None else bool(whole)
        self._whole_done: set[int] = set()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="sortpack-prefetch", daemon=True)
        self.error: BaseException | None = None
        if start:
            self._thread.start()

    def _covers_half(self) -> bool:
        """Return whether ``order`` reads at least half of the rows of the shards it touches."""
        if len(self.order) == 0 or len(self._firsts) < 2:
            return False
        row_start = self.stored.row_start
        mbs = np.unique(self.order)
        rows = row_start[mbs + 1] - row_start[mbs]
        shard = np.searchsorted(self._firsts, row_start[mbs], side="right") - 1
        touched = np.unique(shard)
        return int(rows.sum()) * 2 >= int((self._firsts[touched + 1] - self._firsts[touched]).sum())

    def advance(self, position: int) -> None:
        """Record that the reader is at position ``position`` of ``order`` (it reads that one next)."""
        with self._cond:
            self._position = max(self._position, int(position))
            self._cond.notify()

    def stop(self) -> None:
        """End the thread (hints already given stay with the kernel; the thread closes its files)."""
        self._end_thread()

    def _ahead(self) -> int:
        pos = min(self._position, self.hinted)
        return self.hinted_bytes - self._bytes_at[pos]

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopped and (self.hinted >= len(self.order) or self._ahead() >= self.ahead_bytes):
                        if self.hinted >= len(self.order):
                            self._stopped = True
                            break
                        self._cond.wait()
                    if self._stopped:
                        return
                    mb = int(self.order[self.hinted])
                done = self._hint(mb)
                with self._cond:
                    self.hinted += 1
                    self.hinted_bytes += done
                    self._bytes_at[self.hinted] = self.hinted_bytes
        except Exception as exc:  # noqa: BLE001 - a hint that fails must never break the reader
            self.error = exc
        finally:
            for shard in self._shards.values():
                shard.close()
            self._shards.clear()

    def _hint(self, mb: int) -> int:
        stored = self.stored
        start, stop = int(stored.row_start[mb]), int(stored.row_start[mb + 1])
        total = 0
        while start < stop:
            k = int(np.searchsorted(self._firsts, start, side="right")) - 1
            first = int(self._firsts[k])
            end = min(stop, int(self._firsts[k + 1]))
            first_row, start = start, end
            if self.whole:
                if k not in self._whole_done:
                    self._whole_done.add(k)
                    fd = os.open(self._files[k], os.O_RDONLY)
                    try:
                        if _WILLNEED is not None:
                            os.posix_fadvise(fd, 0, 0, _WILLNEED)
                        total += os.fstat(fd).st_size
                    finally:
                        os.close(fd)
                continue
            shard = self._shards.get(k)
            if shard is None:
                shard = self._shards[k] = _ShardRanges(self._files[k])
            for offset, length in shard.ranges(first_row - first, end - first):
                if _WILLNEED is not None:
                    os.posix_fadvise(shard.fd, offset, length, _WILLNEED)
                total += length
        return total


class UnitWarmer(_Background):
    """A background thread that reads the input units of a ``SourceDataset`` ahead, in the order given.

    A plan without ``--store`` reads its rows from the input files: on an object store
    (``s3://``, ``gs://``) each unit (Parquet row group, Arrow record batch) is a ranged GET
    whose latency the loop would otherwise wait for. ``order`` are micro-batch numbers of
    ``index``; the thread reads the units their samples lie in, in first-use order, keeping
    at most ``ahead_units`` decoded units not yet taken by the dataset (``take``). What the
    dataset returns never changes: a unit not warmed in time is read by the dataset itself.
    """

    def __init__(self, dataset, index, order, ahead_units: int = 16, start: bool = True):
        self.dataset, self.index = dataset, index
        self.order = np.asarray(order, dtype=np.int64).reshape(-1)
        self.ahead_units = max(1, int(ahead_units))
        self.warmed = 0  # units read ahead so far
        self._ready: dict = {}
        self._reading = None  # the unit being read now
        self._passed: set = set()  # units the dataset read itself before the thread got to them
        self._cond = threading.Condition()
        self._stopped = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sortpack-warm-units", daemon=True)
        dataset._warm = self
        if start:
            self._thread.start()

    def advance(self, position: int) -> None:
        """Note the reader's position (the lookahead is bounded by the units not yet taken, not by it)."""

    def take(self, key):
        """Return the unit ``key`` (file, unit) if it was read ahead (and forget it), else None.

        A unit the thread is reading now is waited for; one it has not reached yet is
        struck from its list (the dataset reads it now, and it is not read twice).
        """
        with self._cond:
            while self._reading == key and not self._stopped:
                self._cond.wait()
            table = self._ready.pop(key, None)
            if table is None:
                self._passed.add(key)
            self._cond.notify_all()
        return table

    def stop(self) -> None:
        """End the thread and drop the units not taken."""
        self._end_thread()
        with self._cond:
            self._ready.clear()
        if self.dataset._warm is self:
            self.dataset._warm = None

    def _run(self) -> None:
        try:
            seen: set = set()
            for mb in self.order.tolist():
                for key in self.dataset.units_of(self.index.microbatch(mb)):
                    if key in seen:
                        continue
                    seen.add(key)
                    with self._cond:
                        while not self._stopped and len(self._ready) >= self.ahead_units:
                            self._cond.wait()
                        if self._stopped:
                            return
                        if key in self._passed:
                            continue
                        self._reading = key
                    try:
                        table = self.dataset.read_unit(*key)
                    finally:
                        with self._cond:
                            self._reading = None
                            self._cond.notify_all()
                    with self._cond:
                        if self._stopped:
                            return
                        self._ready[key] = table
                        self.warmed += 1
                        self._cond.notify_all()
        except Exception as exc:  # noqa: BLE001 - a failed read ahead must never break the reader
            self.error = exc


class Prefetched:
    """A sampler whose iteration warms, in a background thread, the stored bytes of this rank's next micro-batches.

    Iterating yields exactly what ``sampler`` yields; every other attribute (``set_epoch``,
    ``state_dict``, ``consume``, ``__len__``...) is the sampler's. The order warmed is the
    sampler's ``schedule()`` at the start of each pass; if the loop changes it mid-pass
    (``set_grad_accum``), warming stops for the rest of the pass. Use it as the
    ``batch_sampler`` of a ``DataLoader``: the page cache is shared with the workers.

    A plan without ``--store`` has no stored bytes: given ``dataset`` (its ``SourceDataset``,
    read in this process, e.g. by ``PlanLoader``), a ``UnitWarmer`` reads the input units
    (row groups, record batches; ranged GETs for objects) in the same order instead, at most
    ``ahead_units`` ahead.

    Examples
    --------
    >>> from sortpack.reader import PackedSampler, Prefetched
    >>> sampler = Prefetched(PackedSampler("plan/", rank=0, world_size=2))  # PackedIndex's example
    >>> [mb.microbatch for mb in sampler]  # what the sampler yields, its data read ahead
    [0, 2, 4]
    >>> sampler.state_dict()["world_size"]  # everything else is the sampler's
    2
    """

    def __init__(self, sampler, ahead_bytes: int = AHEAD_BYTES, dataset=None, ahead_units: int = 16):
        stored = sampler.index.stored
        if stored is None and (dataset is None or getattr(dataset, "stored", None) is not None):
            raise ValueError(f"{sampler.index.path}: the index stores no data (built without --store): "
                             "nothing to prefetch; pass dataset=SourceDataset(...) to read its input units ahead")
        self.sampler, self.stored, self.ahead_bytes = sampler, stored, ahead_bytes
        self.dataset, self.ahead_units = dataset, ahead_units
        self.last: Prefetcher | UnitWarmer | None = None

    def __getattr__(self, name):
        return getattr(self.sampler, name)

    def __len__(self) -> int:
        """Return the sampler's length."""
        return len(self.sampler)

    def __iter__(self):
        """Yield the sampler's micro-batches while a ``Prefetcher`` warms the ones that follow."""
        items = iter(self.sampler)
        order = self.sampler.schedule().reshape(-1)
        warm: Prefetcher | UnitWarmer
        if self.stored is not None:
            warm = self.last = Prefetcher(self.stored, order, self.ahead_bytes)
        else:
            warm = self.last = UnitWarmer(self.dataset, self.sampler.index, order, self.ahead_units)
        try:
            for k, mb in enumerate(items):
                if k < len(order) and getattr(mb, "microbatch", order[k]) == order[k]:
                    warm.advance(k)
                else:
                    warm.stop()
                yield mb
        finally:
            warm.stop()
