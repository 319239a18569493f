"""An opened Megatron-LM dataset (``PREFIX.idx`` + ``PREFIX.bin``): its checked index and its tokens, read in place.

``open_data`` keeps a few opened datasets per process (their ``.idx`` and ``.bin`` mapped
when local; an object's ``.idx`` read whole, its ``.bin`` by ranged requests). ``tokens``
hands out a run of sequences zero-copy; ``gather`` copies any sequences, cut to ranges, in
the order asked (the reader's micro-batches, the export). ``companion`` opens the dataset of
a plan's labels beside its input (``inputs.megatron`` says how ``--labels-column`` names it).
"""
from __future__ import annotations

import os
import posixpath
import threading
from collections import OrderedDict

import numpy as np

from ..errors import SortpackError, one_line
from ..format.megatron import MegatronIndex, bin_path, check_bin, prefix_of, read_index
from . import objects

_CACHED = 8  # opened datasets kept per process (their mapped files)


class MegatronData:
    """One opened dataset: its checked index and its ``.bin`` (mapped when local, ranged reads when a URL)."""

    def __init__(self, idx_path: str):
        self.path = idx_path
        self.bin_path = bin_path(idx_path)
        self.url = objects.is_url(idx_path)
        if self.url:
            raw = np.frombuffer(objects.read_all(idx_path), dtype=np.uint8)
            self.bin_size = objects.size_of(self.bin_path)
        else:
            raw = _map(idx_path)
            self.bin_size = os.path.getsize(self.bin_path) if os.path.isfile(self.bin_path) else -1
        if self.bin_size < 0:
            raise SortpackError(f"{self.bin_path}: missing (the data of {idx_path})")
        self.index: MegatronIndex = read_index(raw, idx_path)
        check_bin(self.index, self.bin_size, self.bin_path)
        itemsize = self.index.dtype.itemsize
        bad = np.flatnonzero(self.index.pointers % itemsize) if itemsize > 1 else np.zeros(0, np.int64)
        if bad.size:
            raise SortpackError(f"{idx_path}: sequence {int(bad[0])}'s pointer is not a multiple of the "
                                f"{self.index.dtype} size (corrupt index)")
        self._bin: np.ndarray | None = None

    @property
    def num_sequences(self) -> int:
        """Return the number of sequences (samples)."""
        return self.index.num_sequences

    def mapped_bin(self) -> np.ndarray:
        """Return the local ``.bin`` as a read-only uint8 array (mapped once)."""
        if self._bin is None:
            self._bin = _map(self.bin_path)
        return self._bin

    def tokens(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Return (values of the dataset's dtype, offsets from 0) of sequences ``[lo, hi)``.

        Zero-copy over the mapped ``.bin`` where they lie one after another (as Megatron
        writes them); gathered otherwise, and read by one ranged request from an object.
        """
        index, dtype = self.index, self.index.dtype
        lengths = index.lengths[lo:hi].astype(np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if hi <= lo:
            return np.zeros(0, dtype), offsets
        start = int(index.pointers[lo])
        end = start + int(offsets[-1]) * dtype.itemsize
        expected = start + offsets[:-1] * dtype.itemsize
        if not np.array_equal(index.pointers[lo:hi], expected):
            return self.gather(np.arange(lo, hi, dtype=np.int64))
        if self.url:
            with objects.open_input(self.bin_path) as fh:
                raw = np.frombuffer(fh.read_at(end - start, start), dtype=np.uint8)
        else:
            raw = self.mapped_bin()[start:end]
        return raw.view(dtype), offsets

    def gather(self, seqs: np.ndarray, begin: np.ndarray | None = None,
               end: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Return (values, offsets from 0) of sequences ``seqs`` in that order, each cut to ``[begin, end)`` if given.

        One copy through the compiled byte gather (``kernels.gather_bytes``); an object's
        sequences are read by one ranged request each.
        """
        from ..kernels import gather_bytes

        index, itemsize = self.index, self.index.dtype.itemsize
        seqs = np.asarray(seqs, dtype=np.int64)
        lengths = index.lengths[seqs].astype(np.int64)
        lo = np.zeros_like(lengths) if begin is None else np.minimum(np.asarray(begin, np.int64), lengths)
        hi = lengths if end is None else np.clip(np.asarray(end, np.int64), lo, lengths)
        counts = hi - lo
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        dst = np.empty(int(offsets[-1]) * itemsize, dtype=np.uint8)
        starts = index.pointers[seqs] + lo * itemsize
        if self.url:
            with objects.open_input(self.bin_path) as fh:
                for j, (at, n) in enumerate(zip(starts.tolist(), (counts * itemsize).tolist())):
                    dst[offsets[j] * itemsize:offsets[j] * itemsize + n] = np.frombuffer(fh.read_at(n, at), np.uint8)
        elif len(dst):
            buf = self.mapped_bin()
            gather_bytes(np.array([buf.__array_interface__["data"][0]], dtype=np.uint64), [buf],
                         np.zeros(len(seqs), np.int64), starts, counts * itemsize, dst)
        return dst.view(index.dtype), offsets


def _map(path: str) -> np.ndarray:
    """Return a local file as a read-only uint8 array (mapped; an empty file as an empty array)."""
    try:
        if os.path.getsize(path) == 0:
            return np.zeros(0, dtype=np.uint8)
        return np.memmap(path, dtype=np.uint8, mode="r")
    except OSError as exc:
        raise SortpackError(f"{path}: cannot read ({exc.strerror or one_line(exc)})") from None


_OPENED: OrderedDict[tuple, MegatronData] = OrderedDict()
_LOCK = threading.Lock()  # the reader's prefetch thread and the loop may open a dataset at once


def _version(path: str) -> tuple:
    """Return what says a file is unchanged: its size and mtime (an object: its size)."""
    if objects.is_url(path):
        return (objects.size_of(path),)
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return st.st_size, st.st_mtime_ns


def open_data(idx_path: str) -> MegatronData:
    """Return the opened dataset of ``PREFIX.idx`` (kept per process; opened again when either file changed)."""
    key = (idx_path, _version(idx_path), _version(bin_path(idx_path)))
    with _LOCK:
        got = _OPENED.get(key)
        if got is not None:
            _OPENED.move_to_end(key)
            return got
    got = MegatronData(idx_path)
    with _LOCK:
        _OPENED[key] = got
        while len(_OPENED) > _CACHED:
            _OPENED.popitem(last=False)
    return got


def companion_path(idx_path: str, spec: str) -> str:
    """Return the ``.idx`` of the companion dataset (labels) that ``spec`` names for input ``idx_path``.

    ``{}`` in ``spec`` stands for the input's prefix name; a relative ``spec`` lies in the
    input's directory (its prefix in an object store); ``.idx`` may be left out.
    """
    url = objects.is_url(idx_path)
    join, dirname, basename = (posixpath.join, posixpath.dirname, posixpath.basename) if url else \
        (os.path.join, os.path.dirname, os.path.basename)
    name = prefix_of(spec).replace("{}", basename(prefix_of(idx_path)))
    path = name if (url and objects.is_url(name)) or (not url and os.path.isabs(name)) else \
        join(dirname(idx_path), name)
    return path + ".idx"


def companion(data: MegatronData, spec: str) -> MegatronData:
    """Return the companion dataset of ``data`` named by ``spec``, checked to hold one sequence of the same length
    per sequence."""
    path = companion_path(data.path, spec)
    if not (objects.is_url(path) or os.path.isfile(path)):
        raise SortpackError(f"{data.path}: no labels dataset {path} (--labels-column {spec}: a prefix beside the "
                            "input, {} for the input's own prefix name)")
    other = open_data(path)
    if other.num_sequences != data.num_sequences or not np.array_equal(other.index.lengths, data.index.lengths):
        raise SortpackError(f"{path}: its sequences do not match {data.path}'s one for one (the labels of each "
                            "sequence must have its length)")
    return other




Pair = tuple[MegatronData, "MegatronData | None"]  # a dataset and its labels companion (None: no labels)


Gathered = tuple[np.ndarray, "np.ndarray | None", np.ndarray]  # values, labels or None, offsets from 0


def gather_many(pairs: dict[int, Pair], starts: np.ndarray, ids: np.ndarray,
                ranges: tuple[np.ndarray, np.ndarray] | None = None) -> Gathered:
    """Return (values, labels or None, offsets) of global sample ids ``ids`` over several datasets, in order.

    Dataset ``k`` (``pairs[k]``: its data and labels companion or None) holds sample ids
    ``[starts[k], starts[k + 1])``; each sample is cut to ``ranges`` (``(begin, end)``) when
    given. One gather per dataset; the values take the datasets' common dtype.
    """
    files = np.searchsorted(starts, ids, side="right") - 1
    keys = np.unique(files).tolist()
    parts = []
    for k in keys:
        sel = np.flatnonzero(files == k)
        cut = (ranges[0][sel], ranges[1][sel]) if ranges is not None else (None, None)
        local = ids[sel] - starts[k]
        data, labels = pairs[k]
        values, offsets = data.gather(local, *cut)
        parts.append((sel, values, labels.gather(local, *cut)[0] if labels is not None else None, offsets))
    if len(parts) == 1 and len(parts[0][0]) == len(ids):
        return parts[0][1], parts[0][2], parts[0][3]
    return _in_order(parts, len(ids))


def _in_order(parts: list, n: int) -> Gathered:
    """Return (values, labels, offsets) of ``n`` items put back in their order from per-dataset gathers."""
    counts = np.zeros(n, dtype=np.int64)
    for sel, _, _, offsets in parts:
        counts[sel] = np.diff(offsets)
    out_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=out_off[1:])
    dtype = np.result_type(*[p[1].dtype for p in parts]) if parts else np.dtype(np.int32)
    values = np.empty(int(out_off[-1]), dtype=dtype)
    with_labels = bool(parts) and parts[0][2] is not None
    labels = np.empty(int(out_off[-1]), dtype=np.result_type(*[p[2].dtype for p in parts])) if with_labels else None
    for sel, vals, labs, offsets in parts:
        at = np.repeat(out_off[sel] - offsets[:-1], np.diff(offsets)) + np.arange(int(offsets[-1]))
        values[at] = vals
        if labels is not None:
            labels[at] = labs
    return values, labels, out_off
