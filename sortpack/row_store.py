"""Rows of one Arrow column held in many arrays, gathered into a new array with one copy.

The ``--store`` shuffle (``write.store``) moves stored rows twice: from the input row groups to the ranks that own
their output positions, and from the received pieces into data shards in plan order.
pyarrow's ``take`` on a column of many chunks first concatenates them (a copy of every
chunk per call), so both moves go through a ``RowStore`` instead: each registered row is
a byte range in one of the arrays' buffers, and a gather is one memcpy per row into a
buffer of the right size (``kernels.gather_bytes``, compiled).

Byte ranges cover strings and binaries, fixed-width values, and lists of fixed-width
values without nulls inside the lists. Other types, and such lists with null values, fall
back to pyarrow ``take`` per array (``raw`` turns False): correct, with more copies.

Strings, binaries and lists address their values with 32-bit offsets, so one array holds
at most 2^31 - 1 bytes (values). Whatever may grow past that (a spill, a round's received
rows, a round's rows that stay) is gathered in pieces of at most ``piece_bytes()`` each
(``piece_cuts``, ``gather_pieces``, ``from_raw_pieces``) and kept as a chunked array.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from . import kernels
from .arrow_types import fixed_width, is_offset_bytes, is_offset_list
from .env import env_int

# under the 2 GiB of 32-bit offsets with room to spare: row sizes of nested types are estimates
PIECE_BYTES = 1 << 30


def piece_bytes() -> int:
    """Return the most bytes one gathered array holds (``SORTPACK_TEST_PIECE_BYTES``, read when used, in tests)."""
    override = env_int("SORTPACK_TEST_PIECE_BYTES")
    return PIECE_BYTES if override is None else max(1, override)


def piece_cuts(sizes: np.ndarray, limit: int) -> np.ndarray:
    """Return cuts ``[0, ..., n]`` into runs of consecutive rows whose summed ``sizes`` stay within ``limit``.

    A row larger than ``limit`` is a run of its own. One search per run, not per row.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    n = len(sizes)
    cum = np.concatenate(([0], np.cumsum(sizes)))
    if n == 0 or cum[-1] <= limit:
        return np.array([0, n], dtype=np.int64)
    cuts = [0]
    while cuts[-1] < n:
        a = cuts[-1]
        b = int(np.searchsorted(cum, cum[a] + limit, side="right")) - 1
        cuts.append(max(b, a + 1))
    return np.array(cuts, dtype=np.int64)


def gather_pieces(store: RowStore, rows: np.ndarray, sizes: np.ndarray, limit: int) -> pa.Array | pa.ChunkedArray:
    """Return ``store.gather(rows)``, as a chunked array of pieces within ``limit`` bytes when it is larger."""
    cuts = piece_cuts(sizes, limit)
    if len(cuts) <= 2:
        return store.gather(rows)
    return pa.chunked_array([store.gather(rows[a:b]) for a, b in zip(cuts[:-1], cuts[1:])], store.type)


def _kind(t: pa.DataType) -> str:
    if is_offset_bytes(t):
        return "binary"
    if is_offset_list(t) and fixed_width(t.value_type):
        return "list"
    if fixed_width(t):
        return "fixed"
    return "other"


def _offsets_dtype(t: pa.DataType):
    return np.int64 if pa.types.is_large_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_list(t) \
        else np.int32


class RowStore:
    """Rows of one column, registered from many arrays in order, numbered from 0."""

    def __init__(self, type: pa.DataType):
        self.type = type
        self.kind = _kind(type)
        self.raw = self.kind != "other"  # False: gather with pyarrow take (see the module doc)
        self.width = fixed_width(type.value_type if self.kind == "list" else type)
        self.arrays: list[pa.Array | None] = []
        self._bytes: list[np.ndarray] = []  # each array's data buffer as uint8 (raw kinds)
        self._parts: list[tuple] = []  # per add: (array number, rows in it, start, length, valid)
        self._flat: tuple | None = None

    def __len__(self) -> int:
        """Return the number of registered rows."""
        return sum(len(p[1]) for p in self._parts)

    def add(self, array: pa.Array, rows: np.ndarray | None = None) -> None:
        """Register ``array``'s rows ``rows`` (all of them when None), in that order."""
        if isinstance(array, pa.ChunkedArray):
            ends = np.cumsum([len(c) for c in array.chunks])
            if rows is not None:
                rows = np.asarray(rows, dtype=np.int64)
                which = np.searchsorted(ends, rows, side="right")
                if len(rows) > 1 and (np.diff(which) < 0).any():
                    raise ValueError("rows of a chunked array must visit its chunks in order")
            for k, chunk in enumerate(array.chunks):
                if rows is None:
                    self.add(chunk)
                elif (which == k).any():
                    self.add(chunk, rows[which == k] - (ends[k] - len(chunk)))
            return
        if array.type != self.type:
            raise TypeError(f"RowStore of {self.type} got an array of {array.type}")
        n = len(array)
        rows = np.arange(n, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        k = len(self.arrays)
        self.arrays.append(array)
        self._flat = None
        start = length = None
        # per registered row only: a take of a few rows from a large array costs a few rows
        valid = None if array.null_count == 0 else _valid_rows(array, rows)
        if self.raw:
            try:
                start, length, data = self._ranges(array, rows)
            except ValueError:  # lists with null values: pyarrow take from here on
                self.raw = False
            else:
                if valid is not None and self.kind != "fixed":  # a null's range may hold stale bytes
                    length = np.where(valid, length, 0)
                self._bytes.append(data)
        if not self.raw:
            self._bytes.append(np.zeros(0, np.uint8))
        self._parts.append((k, rows, start, length, valid))

    def _ranges(self, array: pa.Array, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return rows ``rows``' byte starts and lengths in the array's data buffer, and that buffer."""
        n, off = len(array), array.offset
        bufs = array.buffers()
        if self.kind == "fixed":
            data = bufs[1]
            start = (off + rows) * self.width
            return start, np.full(len(rows), self.width, dtype=np.int64), _as_bytes(data)
        offsets = np.frombuffer(bufs[1], dtype=_offsets_dtype(self.type), count=off + n + 1)[off:]
        first, end = offsets[rows].astype(np.int64), offsets[rows + 1].astype(np.int64)
        if self.kind == "binary":
            return first, end - first, _as_bytes(bufs[2])
        values = array.values  # a list's whole child, with its own offset
        if values.null_count:
            raise ValueError("list values with nulls")
        scale = self.width
        return (values.offset + first) * scale, (end - first) * scale, _as_bytes(values.buffers()[1])

    def _flatten(self) -> tuple:
        if self._flat is None:
            parts = self._parts
            piece = np.concatenate([np.full(len(p[1]), p[0], dtype=np.int64) for p in parts]) if parts \
                else np.zeros(0, np.int64)
            row_in = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
            start = length = None
            if self.raw:
                start = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64)
                length = np.concatenate([p[3] for p in parts]) if parts else np.zeros(0, np.int64)
            valid = None
            if any(p[4] is not None for p in parts):
                valid = np.concatenate([np.ones(len(p[1]), bool) if p[4] is None else p[4] for p in parts])
            self._flat = (piece, row_in, start, length, valid)
        return self._flat

    def gather(self, rows: np.ndarray) -> pa.Array:
        """Return registered rows ``rows`` (numbers from 0, in that order) as one array of the store's type."""
        rows = np.asarray(rows, dtype=np.int64)
        piece, row_in, start, length, valid = self._flatten()
        if not self.raw:
            return _take(self.arrays, piece[rows], row_in[rows], self.type)
        data = self._gather_data(piece[rows], start[rows], length[rows])
        return from_raw(self.type, length[rows], data, None if valid is None else valid[rows])

    def gather_raw(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Return rows ``rows`` as (byte length per row, their bytes one after another, validity or None)."""
        rows = np.asarray(rows, dtype=np.int64)
        piece, _, start, length, valid = self._flatten()
        return length[rows], self._gather_data(piece[rows], start[rows], length[rows]), \
            None if valid is None else valid[rows]

    def _gather_data(self, piece: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
        bases = np.array([b.ctypes.data if len(b) else 0 for b in self._bytes], dtype=np.uint64)
        dst = np.empty(int(length.sum()), dtype=np.uint8)
        return kernels.gather_bytes(bases, self._bytes, piece, start, length, dst)

    def drop_from(self, row: int) -> None:
        """Forget rows ``row`` onwards (a whole number of adds) and release arrays only they used."""
        at, count = 0, 0
        while at < len(self._parts) and count < row:
            count += len(self._parts[at][1])
            at += 1
        if count != row:
            raise ValueError("drop_from must cut between adds")
        kept = {p[0] for p in self._parts[:at]}
        for p in self._parts[at:]:
            if p[0] not in kept:
                self.arrays[p[0]] = None
                self._bytes[p[0]] = np.zeros(0, np.uint8)
        self._parts = self._parts[:at]
        self._flat = None


class ByteRanges:
    """The byte range of every row of one array in its data buffer, looked up per call (for repeated gathers).

    ``of(array)`` returns None for what byte ranges cannot hold: types of no fixed width,
    arrays with nulls, lists with null values.
    """

    def __init__(self, kind: str, data: np.ndarray, offsets: np.ndarray | None, width: int, first: int):
        self.kind, self.data, self.offsets, self.width, self.first = kind, data, offsets, width, first
        self.address = data.ctypes.data if len(data) else 0

    @classmethod
    def of(cls, array: pa.Array) -> ByteRanges | None:
        """Return the byte ranges of ``array``'s rows, or None when they cannot be gathered as bytes."""
        kind, t = _kind(array.type), array.type
        if kind == "other" or array.null_count:
            return None
        bufs, off = array.buffers(), array.offset
        if kind == "fixed":
            width = fixed_width(t)
            return cls(kind, _as_bytes(bufs[1]), None, width, off * width)
        offsets = np.frombuffer(bufs[1], dtype=_offsets_dtype(t), count=off + len(array) + 1)[off:]
        if kind == "binary":
            return cls(kind, _as_bytes(bufs[2]), offsets, 1, 0)
        values = array.values
        if values.null_count:
            return None
        width = fixed_width(t.value_type)
        return cls(kind, _as_bytes(values.buffers()[1]), offsets, width, values.offset * width)

    def ranges(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return rows ``rows``' byte starts in ``data`` and their lengths."""
        if self.offsets is None:
            return self.first + rows * self.width, np.full(len(rows), self.width, dtype=np.int64)
        a, b = self.offsets[rows].astype(np.int64), self.offsets[rows + 1].astype(np.int64)
        return self.first + a * self.width, (b - a) * self.width


def gather_ranges(type: pa.DataType, views: list[ByteRanges], piece: np.ndarray, start: np.ndarray,
                  length: np.ndarray) -> pa.Array:
    """Return an array of ``type`` whose row i is ``length[i]`` bytes at ``start[i]`` of ``views[piece[i]]``."""
    bases = np.array([v.address for v in views], dtype=np.uint64)
    dst = np.empty(int(length.sum()), dtype=np.uint8)
    data = kernels.gather_bytes(bases, [v.data for v in views], piece, start, length, dst)
    return from_raw(type, length, data, None)


def _valid_rows(array: pa.Array, rows: np.ndarray) -> np.ndarray:
    """Return whether each of rows ``rows`` of ``array`` is valid (read from its validity bitmap)."""
    bitmap = array.buffers()[0]
    if bitmap is None:  # nulls without a bitmap: a null-type or union array
        return array.is_valid().to_numpy(zero_copy_only=False)[rows]
    at = array.offset + rows
    bits = np.frombuffer(bitmap, dtype=np.uint8)
    return ((bits[at >> 3] >> (at & 7).astype(np.uint8)) & 1).astype(bool)


def _as_bytes(buf: pa.Buffer | None) -> np.ndarray:
    return np.zeros(0, np.uint8) if buf is None else np.frombuffer(buf, dtype=np.uint8)


def from_raw(type: pa.DataType, length: np.ndarray, data: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    """Return an array of ``type`` whose row i is ``length[i]`` bytes of ``data`` (zero-copy over ``data``)."""
    n = len(length)
    kind = _kind(type)
    validity = None
    if valid is not None and not valid.all():
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    values = pa.py_buffer(data)
    if kind == "fixed":
        return pa.Array.from_buffers(type, n, [validity, values], null_count=-1 if validity is not None else 0)
    width = 1 if kind == "binary" else fixed_width(type.value_type)
    offsets = np.zeros(n + 1, dtype=_offsets_dtype(type))
    ends = np.cumsum(length // width)
    if n and ends[-1] > np.iinfo(offsets.dtype).max:
        raise OverflowError(f"{int(ends[-1])} values do not fit the 32-bit offsets of {type}")
    offsets[1:] = ends
    if kind == "binary":
        return pa.Array.from_buffers(type, n, [validity, pa.py_buffer(offsets), values],
                                     null_count=-1 if validity is not None else 0)
    child = pa.Array.from_buffers(type.value_type, int(ends[-1]) if n else 0, [None, values], null_count=0)
    return pa.Array.from_buffers(type, n, [validity, pa.py_buffer(offsets)], children=[child],
                                 null_count=-1 if validity is not None else 0)


def from_raw_pieces(type: pa.DataType, length: np.ndarray, data: np.ndarray, valid: np.ndarray | None,
                    limit: int) -> pa.Array | pa.ChunkedArray:
    """Return ``from_raw``'s array; chunked in pieces within ``limit`` bytes when it has offsets and is larger."""
    cuts = piece_cuts(length, limit) if _kind(type) != "fixed" else np.array([0, len(length)])
    if len(cuts) <= 2:
        return from_raw(type, length, data, valid)
    at = np.concatenate(([0], np.cumsum(length)))[cuts]
    return pa.chunked_array([from_raw(type, length[a:b], data[at[k]:at[k + 1]], None if valid is None else valid[a:b])
                             for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))], type)


def _take(arrays: list, piece: np.ndarray, row_in: np.ndarray, type: pa.DataType) -> pa.Array:
    """Return rows (piece, row_in) of ``arrays`` in that order with pyarrow take: one take per array."""
    if len(piece) == 0:
        return pa.array([], type)
    if (piece == piece[0]).all():
        return arrays[int(piece[0])].take(pa.array(row_in))
    by_piece = np.argsort(piece, kind="stable")
    parts = [arrays[k].take(pa.array(row_in[by_piece][piece[by_piece] == k])) for k in np.unique(piece).tolist()]
    inverse = np.empty(len(piece), dtype=np.int64)
    inverse[by_piece] = np.arange(len(piece))
    return pa.concat_arrays(parts).take(pa.array(inverse))
