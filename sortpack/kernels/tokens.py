"""The token collate kernels: a micro-batch's token ids (values + offsets, read in place) into the
padded or the varlen batch in one pass (the compiled kernel, and a numpy fallback giving the same arrays).

``values`` is a 1-D int32 or int64 array and ``offsets`` an int32 or int64 array: sample j's
tokens are ``values[offsets[j]:offsets[j + 1]]`` (an Arrow list column's child values and
offsets, as they lie in the stored data shards, need no copy). The compiled kernel checks
every offset against ``values`` before it reads a sample.
"""
from __future__ import annotations

import ctypes
from array import array
from collections.abc import Callable
from typing import NamedTuple, cast

import numpy as np

from . import _loader
from ._loader import _c

_WIDTHS = (np.dtype(np.int32), np.dtype(np.int64))
_HELD: dict = {}  # the compiled library's path -> its handle that keeps the GIL


def _token_lib(lib):
    """Return the token kernels of ``lib`` through a handle that keeps the GIL during the call.

    A call takes microseconds: releasing the GIL gains nothing, and a thread waiting for it
    (the training loop, beside ``PlanLoader``'s thread) would take it and force a switch per
    micro-batch.
    """
    got = _HELD.get(lib._name)
    if got is None:
        got = ctypes.PyDLL(lib._name)
        for name in ("sp_pad_tokens", "sp_varlen_tokens", "sp_pad_batch", "sp_varlen_batch"):
            fn = getattr(got, name)
            fn.argtypes, fn.restype = _loader._SIGNATURES[name]
        _HELD[lib._name] = got
    return got


def _checked(values: np.ndarray, offsets: np.ndarray) -> None:
    if values.ndim != 1 or offsets.ndim != 1 or values.dtype not in _WIDTHS or offsets.dtype not in _WIDTHS:
        raise TypeError("token kernels: values and offsets must be 1-D int32 or int64 arrays")
    if not (values.flags.c_contiguous and offsets.flags.c_contiguous):
        raise ValueError("token kernels: values and offsets must be contiguous")


def _address(a: np.ndarray) -> int:
    # the data pointer without building ``a.ctypes``
    return a.__array_interface__["data"][0]


class TokenView(NamedTuple):
    """A micro-batch's token ids where they lie (see the module's doc), with the data addresses of both arrays.

    Build it with ``token_view``; the stored data keeps one per shard column and slices its
    offsets per micro-batch (``offsets_at`` moves with them), so no address is looked up per call.
    """

    values: np.ndarray
    offsets: np.ndarray
    values_at: int
    offsets_at: int

    def sliced(self, start: int, stop: int) -> TokenView:
        """Return the view of samples ``start .. stop - 1`` (offsets ``start .. stop``), sharing the values."""
        return _new_view(TokenView, (self.values, self.offsets[start:stop + 1], self.values_at,
                                     self.offsets_at + start * self.offsets.itemsize))


_new_view = cast(Callable[[type[TokenView], tuple], TokenView], tuple.__new__)  # no per-call NamedTuple checks


class Fill(NamedTuple):
    """The values a batch holds where no token gives one.

    ``pad_id`` in the ids of padding, ``ignore`` in the labels where there is no target (each
    sample's first token, padding), ``pos_start`` the position id of each segment's first
    token (varlen batches).
    """

    pad_id: int
    ignore: int
    pos_start: int = 0


class RowMarks(NamedTuple):
    """What a batch kernel writes per sample beside its tokens: its sample id and whether it is real.

    ``ids`` (int32 or int64, one per sample; None: -1 for all), ``real`` (False: the
    micro-batch repeats one to fill a step).
    """

    ids: np.ndarray | None
    real: bool


def token_view(values: np.ndarray, offsets: np.ndarray) -> TokenView:
    """Return a ``TokenView`` of ``values`` and ``offsets`` (1-D contiguous int32 or int64 arrays; else TypeError)."""
    _checked(values, offsets)
    return TokenView(values, offsets, _address(values), _address(offsets))


def batch_kernels() -> BatchKernels | None:
    """Return the compiled whole-batch token kernels (``BatchKernels``), or None.

    None when the compiled kernels are not available: ``pad_tokens``/``varlen_tokens`` then
    give the same arrays from numpy.
    """
    lib = _c()
    if lib is None:
        return None
    got = _BATCH.get(lib._name)
    if got is None:
        got = _BATCH[lib._name] = BatchKernels(_token_lib(lib))
    return got


_BATCH: dict = {}  # the compiled library's path -> its BatchKernels


NO_IDS = (0, 8, 0)  # ``ids_arg`` of unknown sample ids: -1 for every row


def ids_arg(ids) -> tuple[int, int, int]:
    """Return (address, width, count) of sample ids for the kernels (``NO_IDS`` when ``ids`` is None)."""
    if ids is None:
        return NO_IDS
    if ids.dtype not in _WIDTHS or ids.ndim != 1 or not ids.flags.c_contiguous:
        raise TypeError("token kernels: sample ids must be a 1-D contiguous int32 or int64 array")
    return _address(ids), ids.itemsize, len(ids)


class BatchKernels:
    """The compiled kernels that write a whole collated batch into buffers the caller allocated (``batch_kernels``).

    Every sample of ``view`` is written; ``out`` holds the buffers' addresses.
    """

    def __init__(self, lib) -> None:
        self._lib = lib

    def pad_into(self, view: TokenView, shape: tuple[int, int], fill: Fill, marks: RowMarks,
                 out: tuple[int, ...]) -> None:
        """Write ``pad_tokens``' batch of ``shape`` (rows, width), each row's sample id and real flag into ``out``.

        ``out`` holds the addresses of six C-contiguous buffers: ids and labels (int64, ``rows``
        x ``width``), lengths (int64, ``rows``), key_padding_mask (bool, ``rows`` x ``width``),
        sample ids (int64, ``rows``: ``marks.ids`` then -1) and real (bool, ``rows``:
        ``marks.real`` for the samples' rows, False after).
        """
        self.pad_batch(view, shape, (int(fill.pad_id), int(fill.ignore)), ids_arg(marks.ids), bool(marks.real), out)

    def pad_batch(self, view: TokenView, shape: tuple[int, int], fill: tuple[int, int], ids: tuple[int, int, int],
                  real: bool, out: tuple[int, ...]) -> None:
        """``pad_into`` with its arguments as the kernel takes them (no record built per call).

        ``fill`` is (pad_id, ignore), ``ids`` the sample ids' (address, width, count) as
        ``ids_arg`` gives them (an address the caller keeps saves the lookup), ``real`` the flag.
        """
        values, offsets = view.values, view.offsets
        n, (rows, width) = len(offsets) - 1, shape
        if not 0 <= n <= rows or width < 0 or len(out) != 6:
            raise ValueError(f"pad_into: {n} samples, {rows} rows, width {width}, {len(out)} buffers")
        at, ibytes, nids = ids
        args = array("q", (view.values_at, values.itemsize, len(values), view.offsets_at, offsets.itemsize, n,
                           rows, width, fill[0], fill[1], at, ibytes, min(nids, rows), 1 if real else 0, *out))
        if self._lib.sp_pad_batch(args.buffer_info()[0]) < 0:
            raise ValueError("pad_tokens: the offsets reach outside the token values")

    def varlen_into(self, view: TokenView, cap: int | None, fill: Fill, marks: RowMarks,
                    out: tuple[int, ...]) -> tuple[int, int]:
        """Write the varlen batch of the samples (each its first ``cap`` tokens) into ``out``.

        Return (tokens written, the longest sample's). ``out`` holds the addresses of ten
        C-contiguous buffers: ids, labels, positions (int64), seq_idx (int32), token_mask (bool),
        each of at least ``offsets[n] - offsets[0]`` entries; cu_seqlens (int32, n + 1);
        lengths, seq_index, sample ids (int64, n); real (bool, n). Each sample's first token has
        no label (``fill.ignore``); positions restart at ``fill.pos_start``; seq_idx is the
        sample's place.
        """
        values, offsets = view.values, view.offsets
        n = len(offsets) - 1
        if n < 0 or len(out) != 10:
            raise ValueError(f"varlen_into: {len(offsets)} offsets, {len(out)} buffers")
        at, ibytes, nids = ids_arg(marks.ids)
        args = array("q", (view.values_at, values.itemsize, len(values), view.offsets_at, offsets.itemsize, n,
                           -1 if cap is None else cap, int(fill.ignore), int(fill.pos_start), at, ibytes,
                           min(nids, n), int(marks.real), *out, 0, 0, 0))
        where = args.buffer_info()[0]
        args[23] = where + 8 * 24  # where the kernel writes the two counts: the array's last two entries
        if self._lib.sp_varlen_batch(where) < 0:
            raise ValueError("varlen_tokens: the offsets or segments reach outside the token values")
        return args[24], args[25]


def pad_tokens(values: np.ndarray, offsets: np.ndarray, n: int, shape: tuple[int, int],
               fill: Fill) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return (ids, labels, lengths, key_padding_mask) of samples 0..n-1 padded into ``shape``, (rows, width).

    Row j < n holds sample j's first ``min(len, width)`` tokens then ``fill.pad_id``; rows
    from n on are all padding. ``labels`` are the ids with ``fill.ignore`` at each row's first
    position and at padding; ``lengths`` (int64) the tokens kept per row; the mask (bool) is
    True at padding.
    """
    _checked(values, offsets)
    n, rows, width = int(n), int(shape[0]), int(shape[1])
    pad_id, ignore = fill.pad_id, fill.ignore
    if not 0 <= n <= rows or len(offsets) < n + 1 or width < 0:
        raise ValueError(f"pad_tokens: {n} samples, {rows} rows, {len(offsets)} offsets, width {width}")
    lib = _c()
    if lib is not None:
        cells = rows * width
        # one allocation for the four outputs (one address to hand over): ids, labels, lengths, then the mask
        buf = np.empty(8 * (2 * cells + rows) + cells, dtype=np.uint8)
        words = buf[:8 * (2 * cells + rows)].view(np.int64)
        ids, labels = words[:cells].reshape(rows, width), words[cells:2 * cells].reshape(rows, width)
        lengths, mask = words[2 * cells:], buf[8 * (2 * cells + rows):].view(np.bool_).reshape(rows, width)
        at = buf.ctypes.data
        got = _token_lib(lib).sp_pad_tokens(values.ctypes.data, values.itemsize, len(values), offsets.ctypes.data,
                                            offsets.itemsize, n, rows, width, int(pad_id), int(ignore), at,
                                            at + 8 * cells, at + 16 * cells, at + 8 * (2 * cells + rows))
        if got < 0:
            raise ValueError("pad_tokens: the offsets reach outside the token values")
        return ids, labels, lengths, mask
    off = offsets[:n + 1].astype(np.int64)
    full = np.diff(off)
    if n and (off[0] < 0 or (full < 0).any() or off[-1] > len(values)):
        raise ValueError("pad_tokens: the offsets reach outside the token values")
    ids = np.full((rows, width), pad_id, dtype=np.int64)
    lengths = np.zeros(rows, dtype=np.int64)
    keep = lengths[:n]
    np.minimum(full, width, out=keep)
    total = int(keep.sum())
    if total:
        before = np.cumsum(keep) - keep  # kept tokens before each sample
        step = np.arange(total, dtype=np.int64)
        dest = np.arange(n, dtype=np.int64) * width
        ids.reshape(-1)[step + np.repeat(dest - before, keep)] = values[step + np.repeat(off[:-1] - before, keep)]
    valid = np.arange(width)[None, :] < lengths[:, None]
    labels = np.where(valid, ids, ignore)
    labels[:, :1] = ignore
    return ids, labels, lengths, ~valid


def varlen_tokens(values: np.ndarray, offsets: np.ndarray, segments: tuple[np.ndarray, np.ndarray, np.ndarray],
                  fill: Fill) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return (ids, labels, position_ids, seq_idx, token_mask) of the varlen layout of ``segments``.

    ``segments`` is ``(cu, seg_real, seg_sample)``: segment s spans ``cu[s]:cu[s + 1]`` and
    holds sample ``seg_sample[s]``'s first ``seg_real[s]`` tokens, then ``fill.pad_id``
    (``seg_sample`` -1: padding only). ``labels`` are the ids with ``fill.ignore`` at each
    segment's first token and at padding; positions restart at ``fill.pos_start`` in every
    segment; ``seq_idx`` (int32) is the segment of each token and ``token_mask`` (bool) is
    True at a sample's tokens.
    """
    _checked(values, offsets)
    cu, seg_real, seg_sample = segments
    pad_id, ignore, pos_start = fill
    cu = np.ascontiguousarray(cu, dtype=np.int64)
    seg_real = np.ascontiguousarray(seg_real, dtype=np.int64)
    seg_sample = np.ascontiguousarray(seg_sample, dtype=np.int64)
    nseg = len(seg_real)
    if len(cu) != nseg + 1 or len(seg_sample) != nseg or (nseg and int(seg_sample.max()) >= len(offsets) - 1):
        raise ValueError("varlen_tokens: cu, seg_real and seg_sample disagree with each other or the offsets")
    total = int(cu[-1])
    lib = _c()
    if lib is not None:
        # one allocation for the five outputs: ids, labels, positions (int64), seq_idx (int32), then the mask
        buf = np.empty(29 * total, dtype=np.uint8)
        words = buf[:24 * total].view(np.int64)
        ids, labels, pos = words[:total], words[total:2 * total], words[2 * total:]
        seq_idx, mask = buf[24 * total:28 * total].view(np.int32), buf[28 * total:].view(np.bool_)
        at = buf.ctypes.data
        got = _token_lib(lib).sp_varlen_tokens(values.ctypes.data, values.itemsize, len(values), offsets.ctypes.data,
                                               offsets.itemsize, nseg, cu.ctypes.data, seg_real.ctypes.data,
                                               seg_sample.ctypes.data, int(pad_id), int(ignore), int(pos_start),
                                               at, at + 8 * total, at + 16 * total, at + 24 * total,
                                               at + 28 * total)
        if got < 0:
            raise ValueError("varlen_tokens: the offsets or segments reach outside the token values")
        return ids, labels, pos, seq_idx, mask
    seg_len = np.diff(cu)
    doc = seg_sample >= 0
    start = np.zeros(nseg, dtype=np.int64)
    end = np.zeros(nseg, dtype=np.int64)
    start[doc] = offsets[seg_sample[doc]]
    end[doc] = offsets[seg_sample[doc] + 1]
    real = np.where(doc, seg_real, 0)
    if ((real < 0) | (real > seg_len) | (start < 0) | (end < start) | (real > end - start) | (end > len(values))).any():
        raise ValueError("varlen_tokens: the offsets or segments reach outside the token values")
    seg_of = np.repeat(np.arange(nseg), seg_len)
    offset_in = np.arange(total, dtype=np.int64) - cu[:-1][seg_of]
    mask = offset_in < real[seg_of]
    ids = np.full(total, pad_id, dtype=np.int64)
    ids[mask] = values[(start[seg_of] + offset_in)[mask]]
    labels = np.where(mask & (offset_in > 0), ids, ignore)
    return ids, labels, offset_in + pos_start, seg_of.astype(np.int32), mask
