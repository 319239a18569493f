"""The run copy: runs of integers scattered over a few buffers copied one after another into one array
(``copy_runs``) or a file (``write_runs``), converted to its integer type, their range measured in the
same pass (an export's samples in plan order). The compiled kernel copies run by run, prefetching the
runs ahead, and writes a file through a small buffer that stays in cache; the numpy fallback makes one
fancy-indexed read per buffer and writes the whole at once."""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from ._loader import _c, _i64, _ptr

NO_RANGE = (np.iinfo(np.int64).max, np.iinfo(np.int64).min, 0)  # (low, high, over) before any value


class Runs(NamedTuple):
    """Runs of integers to copy: run ``i`` is ``counts[i]`` values at byte ``starts[i]`` of
    ``buffers[piece[i]]``, whose values are of ``dtypes[piece[i]]`` (little-endian integers).

    ``buffers`` are uint8 arrays (a mapped file, an Arrow buffer), kept alive by the record;
    each run's start is a multiple of its dtype's size.
    """

    buffers: tuple[np.ndarray, ...]
    dtypes: tuple[np.dtype, ...]
    piece: np.ndarray | None  # int64; None: every run lies in buffers[0]
    starts: np.ndarray  # int64, bytes
    counts: np.ndarray  # int64, values

    def part(self, a: int, b: int) -> Runs:
        """Return runs ``[a, b)`` (views of the arrays, the same buffers)."""
        piece = None if self.piece is None else self.piece[a:b]
        return self._replace(piece=piece, starts=self.starts[a:b], counts=self.counts[a:b])


class Sink(NamedTuple):
    """Where ``write_runs`` writes: an open file, the byte offset of the first value, the values' integer dtype."""

    fd: int
    offset: int
    dtype: np.dtype


def type_code(dtype: np.dtype) -> int:
    """Return the kernel's code of an integer dtype: its size, negative when signed."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "iu" or dtype.itemsize not in (1, 2, 4, 8):
        raise ValueError(f"copy_runs: {dtype} is no integer dtype of 1, 2, 4 or 8 bytes")
    return dtype.itemsize if dtype.kind == "u" else -dtype.itemsize


def copy_runs(runs: Runs, out: np.ndarray | None, measure: bool = True) -> tuple[int, np.ndarray]:
    """Return (the values copied, their range) after copying ``runs`` one after another into ``out``.

    ``out``: an integer array holding at least the runs' values, each converted to its dtype
    as numpy's unsafe cast does (None: nothing copied, the range measured). The range is an
    int64 array (low, high, over): the lowest and highest value read, ``over`` 1 when a uint64
    value above the int64 maximum was read (then ``high`` is that maximum). ``measure=False``
    (with ``out``): the range is not measured (``NO_RANGE``), and runs of ``out``'s dtype are
    copied as bytes.
    """
    counts = _i64(runs.counts)
    total = int(counts.sum())
    if out is not None and (out.ndim != 1 or len(out) < total or not out.flags.c_contiguous):
        raise ValueError("copy_runs: out is not a contiguous array of the runs' values")
    held, args = _c_args(runs)
    dst_code = type_code(out.dtype) if out is not None else 8
    rng = np.array(NO_RANGE, dtype=np.int64)
    lib = _c()
    if lib is None:
        return _numpy_copy(runs, out, measure, rng), rng
    got = lib.sp_copy_runs(*args, _ptr(out) if out is not None else None, dst_code,
                           _ptr(rng) if measure or out is None else None)
    del held
    return _checked(got, "copy_runs"), rng


def write_runs(runs: Runs, sink: Sink, scratch: np.ndarray, measure: bool = True) -> tuple[int, np.ndarray]:
    """Return (the values written, their range) after writing ``runs`` one after another at ``sink.offset`` of
    ``sink.fd``, each value converted to ``sink.dtype`` as ``copy_runs`` converts.

    ``scratch``: a uint8 array of at least one value, where the compiled kernel gathers the
    values and from which it writes each time it is full (a few hundred KiB stay in the
    core's cache). The range and ``measure`` are ``copy_runs``'. A failed write raises
    ``OSError``.
    """
    held, args = _c_args(runs)
    dst_code = type_code(sink.dtype)
    if scratch.dtype != np.uint8 or len(scratch) < abs(dst_code):
        raise ValueError("write_runs: a scratch buffer too small for one value (or not uint8)")
    rng = np.array(NO_RANGE, dtype=np.int64)
    lib = _c()
    got = -4 if lib is None else lib.sp_write_runs(*args, sink.fd, sink.offset, _ptr(scratch), len(scratch), dst_code,
                                                  _ptr(rng) if measure else None)
    del held
    if got == -4:  # no compiled kernel (or no pwrite in it): the values gathered whole, written at once
        values = np.empty(int(_i64(runs.counts).sum()), np.dtype(sink.dtype).newbyteorder("<"))
        got, rng = copy_runs(runs, values, measure)
        pwrite_all(sink.fd, values, sink.offset)
    elif got <= -1000:
        err = -1000 - got
        raise OSError(err, os.strerror(err))
    return _checked(got, "write_runs"), rng


def _c_args(runs: Runs) -> tuple[list[np.ndarray | None], tuple]:
    """Return (the arrays the pointers point into, which the caller holds until the kernel returns; the kernels'
    first arguments for ``runs``), the dtypes checked."""
    codes = np.array([type_code(d) for d in runs.dtypes], dtype=np.int64)
    bases = np.array([b.ctypes.data for b in runs.buffers], dtype=np.uint64)
    starts, counts = _i64(runs.starts), _i64(runs.counts)
    piece = None if runs.piece is None else _i64(runs.piece)
    if len(starts) != len(counts) or (piece is not None and len(piece) != len(counts)):
        raise ValueError("copy_runs: piece, starts and counts differ in length")
    held: list[np.ndarray | None] = [bases, codes, piece, starts, counts]
    return held, (_ptr(bases), _ptr(codes), len(bases), None if piece is None else _ptr(piece), _ptr(starts),
                  _ptr(counts), len(counts))


def _checked(got: int, what: str) -> int:
    """Return a kernel's count, or raise for its error code."""
    if got >= 0:
        return int(got)
    why = {-1: "a piece out of range", -2: "an unknown dtype", -3: "a scratch buffer too small for one value"}
    raise ValueError(f"{what}: {why.get(got, f'error {got}')}")


def pwrite_all(fd: int, values: np.ndarray, offset: int) -> None:
    """Write ``values``' bytes at ``offset`` of file ``fd`` (a loop: ``pwrite`` may write part)."""
    view = np.ascontiguousarray(values).data.cast("B")
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _numpy_copy(runs: Runs, out: np.ndarray | None, measure: bool, rng: np.ndarray) -> int:
    """Copy ``runs`` into ``out`` and widen ``rng`` (as ``copy_runs``): one fancy-indexed read per buffer."""
    from .gather import run_indices

    counts = _i64(runs.counts)
    piece = np.zeros(len(counts), np.int64) if runs.piece is None else _i64(runs.piece)
    first = np.zeros(len(counts), np.int64)
    if len(counts) > 1:
        np.cumsum(counts[:-1], out=first[1:])
    for k in np.unique(piece).tolist():
        if not 0 <= k < len(runs.buffers):
            raise ValueError("copy_runs: a piece out of range")
        sel = np.flatnonzero((piece == k) & (counts > 0))
        if not len(sel):
            continue
        dtype = np.dtype(runs.dtypes[k]).newbyteorder("<")
        buf = runs.buffers[k]
        values = buf[:len(buf) - len(buf) % dtype.itemsize].view(dtype)
        got = values[run_indices(_i64(runs.starts)[sel] // dtype.itemsize, counts[sel])]
        if out is not None:
            out[run_indices(first[sel], counts[sel])] = got.astype(out.dtype, casting="unsafe")
        if measure or out is None:
            _widen(rng, got)
    return int(counts.sum())


def _widen(rng: np.ndarray, values: np.ndarray) -> None:
    """Widen (low, high, over) by ``values``."""
    low, high = int(values.min()), int(values.max())
    top = int(np.iinfo(np.int64).max)
    if high > top:
        rng[2] = 1
        high = top
        low = min(low, top)
    rng[0], rng[1] = min(int(rng[0]), low), max(int(rng[1]), high)
