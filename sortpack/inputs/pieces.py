"""Cut a column's values to ``--oversize split`` pieces: row i keeps units ``[begin[i], end[i])`` of its value.

The unit is what the plan's size counted: an element of a list (token ids, or a list column
under ``--size length``), a character of a text (``length``), a byte of a binary value. The
write side cuts stored columns with it (``write/store``), the reader the rows it reads from
the input files (``reader/dataset``): both cut the same way. Vectorised: one gather of the
kept values, no loop over rows.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..arrow_types import is_offset_bytes, is_offset_list


def _runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Return the indices of the runs ``[starts[i], starts[i] + lengths[i])``, concatenated."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    first = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return np.repeat(starts - first, lengths) + np.arange(total, dtype=np.int64)


def _char_bytes(data: np.ndarray, offsets: np.ndarray, chars: np.ndarray) -> np.ndarray:
    """Return the byte offset in ``data`` of character ``chars[i]`` of row i (UTF-8; past the last: the row's end)."""
    lead = np.flatnonzero((data & 0xC0) != 0x80)  # where each character starts
    before = np.searchsorted(lead, offsets[:-1])  # characters before each row
    at = before + chars
    ends = offsets[1:]
    inside = at < np.searchsorted(lead, ends)
    out = ends.copy()
    out[inside] = lead[at[inside]]
    return out


def cut_array(arr: pa.Array, begin: np.ndarray, end: np.ndarray) -> pa.Array:
    """Return ``arr`` (a list, string or binary array) with row i cut to units ``[begin[i], end[i])``.

    Strings are cut by characters (UTF-8: a cut never splits a character), binary values
    by bytes, lists by elements. Ranges past a row's end are clipped to it.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    t = arr.type
    n = len(arr)
    begin = np.asarray(begin, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    if is_offset_list(t):
        offsets = arr.offsets.to_numpy().astype(np.int64)
        values = arr.values
        lo = np.minimum(offsets[:-1] + begin, offsets[1:])
        hi = np.minimum(offsets[:-1] + np.maximum(end, begin), offsets[1:])
        kept = values.take(pa.array(_runs(lo, hi - lo)))
        new = np.concatenate(([0], np.cumsum(hi - lo))).astype(np.int64 if pa.types.is_large_list(t) else np.int32)
        return type(arr).from_arrays(pa.array(new), kept, type=t)
    if is_offset_bytes(t):
        bufs = arr.buffers()
        width = np.int64 if (pa.types.is_large_string(t) or pa.types.is_large_binary(t)) else np.int32
        offsets = np.frombuffer(bufs[1], dtype=width, count=n + 1, offset=arr.offset * np.dtype(width).itemsize)
        offsets = offsets.astype(np.int64)
        data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            lo = _char_bytes(data, offsets, begin)
            hi = _char_bytes(data, offsets, np.maximum(end, begin))
        else:
            lo = np.minimum(offsets[:-1] + begin, offsets[1:])
            hi = np.minimum(offsets[:-1] + np.maximum(end, begin), offsets[1:])
        kept = data[_runs(lo, hi - lo)]
        new = np.concatenate(([0], np.cumsum(hi - lo))).astype(width)
        return pa.Array.from_buffers(t, n, [None, pa.py_buffer(new), pa.py_buffer(kept)])
    raise TypeError(f"cannot cut values of type {t} into pieces")
