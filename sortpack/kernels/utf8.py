"""Byte pieces of texts: rows cut greedily into pieces of at most ``cap`` bytes, never inside a
UTF-8 character (``--size bytes --oversize split``). The compiled kernel walks each row once;
the numpy fallback steps every row still being cut one piece at a time."""
from __future__ import annotations

import numpy as np

from ._loader import _c, _i64, _ptr


def utf8_cuts(data: np.ndarray, offsets: np.ndarray, rows: np.ndarray, cap: int,
              text: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (row, begin, size) of the pieces rows ``rows`` (ascending) of ``data`` are cut into.

    Row r is bytes ``[offsets[r], offsets[r + 1])`` of ``data`` (uint8). Each piece is the longest run
    that fits ``cap`` bytes and, with ``text``, ends before a UTF-8 lead byte or at the row's
    end; ``begin`` counts from the row's start; an empty row is one piece of size 0. In (row,
    begin) order. Raises ValueError where a character is longer than ``cap``.
    """
    data = np.ascontiguousarray(data, dtype=np.uint8)
    offsets = np.asarray(offsets)
    starts, ends, rows = _i64(offsets[:-1]), _i64(offsets[1:]), _i64(rows)
    if cap < 1:
        raise ValueError(f"utf8_cuts: a piece of {cap} bytes")
    lib = _c()
    if lib is None:
        return _numpy_cuts(data, (starts, ends), rows, cap, text)
    step = max(1, cap - 3) if text else cap  # every piece but a row's last holds at least this
    bound = int(((ends[rows] - starts[rows]) // step + 1).sum())
    out = [np.empty(max(bound, 1), dtype=np.int64) for _ in range(3)]
    got = lib.sp_utf8_cuts(_ptr(data), _ptr(starts), _ptr(ends), _ptr(rows), len(rows), int(cap), int(bool(text)),
                           _ptr(out[0]), _ptr(out[1]), _ptr(out[2]), bound)
    if got == -2:
        raise ValueError(f"row {int(out[0][0])}: a character is longer than the {cap} bytes of a piece")
    if got < 0:
        raise RuntimeError("utf8_cuts: more pieces than the bound")
    return out[0][:got], out[1][:got], out[2][:got]


def _numpy_cuts(data: np.ndarray, bounds: tuple[np.ndarray, np.ndarray], rows: np.ndarray, cap: int,
                text: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return ``utf8_cuts``'s pieces, one vectorised step per piece ordinal over the rows still being cut.

    ``bounds`` is (starts, ends) of every row (int64).
    """
    starts, ends = bounds
    lead = np.append((data & 0xC0) != 0x80, True) if text else np.ones(len(data) + 1, dtype=bool)
    live = rows.copy()
    pos = starts.copy()
    owners, begins, sizes = [], [], []
    while live.size:
        start, end = pos[live], ends[live]
        cut = np.minimum(start + cap, end)
        back = ~lead[cut] & (cut < end) & (cut > start)
        while back.any():  # back to the character's first byte: at most 3 steps in UTF-8
            cut -= back
            back = ~lead[cut] & (cut < end) & (cut > start)
        bad = np.flatnonzero((cut <= start) & (start < end))
        if bad.size:
            raise ValueError(f"row {int(live[bad[0]])}: a character is longer than the {cap} bytes of a piece")
        owners.append(live)
        begins.append(start - starts[live])
        sizes.append(cut - start)
        pos[live] = cut
        live = live[cut < end]
    row, begin, size = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (owners, begins, sizes))
    order = np.lexsort((begin, row))
    return row[order], begin[order], size[order]
