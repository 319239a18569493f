"""Cut a column's values to ``--oversize split`` pieces: row i keeps units ``[begin[i], end[i])`` of its value.

The unit is what the plan's size counted: an element of a list (token ids, or a list column
under ``--size length``), a character of a text (``length``), a byte of a text or binary value
(``bytes``). The write side cuts stored columns with it (``write/store``), the reader the rows
it reads from the input files (``reader/dataset``): both cut the same way. Vectorised: one
gather of the kept values, no loop over rows.

Under ``--size bytes`` the planning half needs the text itself to place the cuts (a byte range
of a text must end on a UTF-8 character boundary): ``read_values`` reads the values of a few
samples back from the input files and ``byte_pieces`` places the cuts.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..arrow_types import is_offset_bytes, is_offset_list, is_text
from ..errors import SortpackError
from ..kernels.gather import run_indices
from .formats import open_source, read_units


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


def _offsets_data(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, type]:
    """Return the int64 offsets (``len + 1``), the data bytes and the offsets' width of a string or binary array."""
    t = arr.type
    bufs = arr.buffers()
    width = np.int64 if (pa.types.is_large_string(t) or pa.types.is_large_binary(t)) else np.int32
    offsets = np.frombuffer(bufs[1], dtype=width, count=len(arr) + 1, offset=arr.offset * np.dtype(width).itemsize)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64), data, width


def cut_array(arr: pa.Array, begin: np.ndarray, end: np.ndarray, unit: str = "length") -> pa.Array:
    """Return ``arr`` (a list, string or binary array) with row i cut to units ``[begin[i], end[i])``.

    Strings are cut by characters (UTF-8: a cut never splits a character), or by bytes when
    ``unit`` is ``"bytes"`` (the plan put those cuts on character boundaries); binary values
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
        kept = values.take(pa.array(run_indices(lo, hi - lo)))
        new = np.concatenate(([0], np.cumsum(hi - lo))).astype(np.int64 if pa.types.is_large_list(t) else np.int32)
        return type(arr).from_arrays(pa.array(new), kept, type=t)
    if is_offset_bytes(t):
        offsets, data, width = _offsets_data(arr)
        if is_text(t) and unit != "bytes":
            lo = _char_bytes(data, offsets, begin)
            hi = _char_bytes(data, offsets, np.maximum(end, begin))
        else:
            lo = np.minimum(offsets[:-1] + begin, offsets[1:])
            hi = np.minimum(offsets[:-1] + np.maximum(end, begin), offsets[1:])
        kept = data[run_indices(lo, hi - lo)]
        new = np.concatenate(([0], np.cumsum(hi - lo))).astype(width)
        return pa.Array.from_buffers(t, n, [None, pa.py_buffer(new), pa.py_buffer(kept)])
    raise TypeError(f"cannot cut values of type {t} into pieces")


def _byte_values(arr: pa.Array) -> pa.Array:
    """Return ``arr`` as a string or binary array addressed by offsets (one chunk; fixed-size binary as binary)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if pa.types.is_fixed_size_binary(arr.type):
        arr = arr.cast(pa.binary())
    if not is_offset_bytes(arr.type):
        raise TypeError(f"cannot cut values of type {arr.type} into byte pieces")
    return arr


def _leads(arr: pa.Array, data: np.ndarray) -> np.ndarray:
    """Return where a piece of ``arr``'s data may start: every byte of binary, a UTF-8 lead byte of text (+ the end)."""
    if not is_text(arr.type):
        return np.ones(len(data) + 1, dtype=bool)
    return np.append((data & 0xC0) != 0x80, True)  # a continuation byte is 10xxxxxx


def longest_char(arr: pa.Array) -> tuple[int, int]:
    """Return (the row of a text array's longest UTF-8 character, its bytes); (-1, 1) for binary or no text."""
    arr = _byte_values(arr)
    offsets, data, _ = _offsets_data(arr)
    lo, hi = offsets[0], offsets[-1]
    if not is_text(arr.type) or hi <= lo:
        return -1, 1
    lead = _leads(arr, data)[lo:hi + 1].copy()
    lead[-1] = True  # the last row's end closes its last character
    starts = np.flatnonzero(lead) + lo
    widths = np.diff(starts)
    at = int(np.argmax(widths))
    return int(np.searchsorted(offsets, starts[at], side="right") - 1), int(widths[at])


def byte_pieces(arr: pa.Array, cap: int, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (row, begin, size) of the pieces of at most ``cap`` bytes that the rows of ``arr`` are cut into.

    ``rows`` (ascending): cut only those rows of ``arr`` (the others' values are not copied).
    In (row, begin) order. Each piece is the longest run of whole characters (text) or bytes
    (binary) that fits, so a text piece may be up to 3 bytes short of ``cap``; the pieces of a
    row cover its bytes exactly once. A row of at most ``cap`` bytes is one piece ``[0, size)``.
    Raises ValueError where a character is longer than ``cap`` (``longest_char`` names it).
    """
    from .. import kernels

    arr = _byte_values(arr)
    offsets, data, _ = _offsets_data(arr)
    rows = np.arange(len(arr), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    return kernels.utf8_cuts(data, offsets, rows, cap, is_text(arr.type))


def read_values(files: list[dict], ids: np.ndarray, column: str):
    """Yield (positions in ``ids``, the ``column`` values of those sample ids, the file's path), a unit at a time.

    ``files`` are the plan's ``source.files`` entries (with ``path``); each input unit (row
    group, record batch, whole text file) that holds one of ``ids`` is read once.
    """
    for at, table, path in read_sample_rows(files, ids, [column], [column]):
        if column not in table.column_names:
            raise SortpackError(f"{path}: no column {column!r} to cut into pieces")
        yield at, table.column(column), path


def read_sample_rows(files: list[dict], ids: np.ndarray, columns: list[str], text_columns: list[str] | None = None):
    """Yield (positions in ``ids``, a table of those sample ids' ``columns``, the file's path), a unit at a time.

    Each input unit that holds one of ``ids`` is read once (``text_columns`` read as strings
    where the format guesses types); the table's rows are the ids at those positions, in order.
    """
    ids = np.asarray(ids, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum([int(f["rows"]) for f in files]))).astype(np.int64)
    which = np.searchsorted(starts, ids, side="right") - 1
    for k in np.unique(which).tolist():
        sel = np.flatnonzero(which == k)
        src = open_source(files[k]["path"], files[k]["format"])
        local = ids[sel] - starts[k]
        rows = src.unit_rows if src.unit_rows is not None else [int(files[k]["rows"])]
        unit_starts = np.concatenate(([0], np.cumsum(rows))).astype(np.int64)
        units = np.searchsorted(unit_starts, local, side="right") - 1
        for u in np.unique(units).tolist():
            pick = units == u
            table = read_units(src, u, u + 1, columns, text_columns)
            yield sel[pick], table.take(pa.array(local[pick] - unit_starts[u])), src.path
