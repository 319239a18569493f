"""The byte gather: rows of many buffers copied one after another into one destination
(the compiled kernel, and a numpy fallback with one vectorised copy per buffer)."""
from __future__ import annotations

import numpy as np

from ._loader import _c, _i64, _ptr


def gather_bytes(bases: np.ndarray, buffers: list, piece: np.ndarray, src_start: np.ndarray,
                 length: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Return ``dst`` filled in row order: row i is ``length[i]`` bytes of ``buffers[piece[i]]`` at ``src_start[i]``.

    Rows land one after another from ``dst``'s start. ``bases`` are the buffers' addresses
    (what the C kernel reads); ``buffers`` are the same memory as numpy uint8 arrays (what the
    fallback reads).
    """
    piece, src_start, length = _i64(piece), _i64(src_start), _i64(length)
    dst_off = np.zeros(len(length), dtype=np.int64)
    if len(length) > 1:
        np.cumsum(length[:-1], out=dst_off[1:])
    if int(length.sum()) > len(dst):
        raise ValueError("gather_bytes: the rows need more bytes than dst holds")
    lib = _c()
    if lib is None and len(piece) and (int(piece.min()) < 0 or int(piece.max()) >= len(buffers)):
        # as the kernel refuses it (a negative number would index the buffers from the end: wrong bytes)
        raise ValueError("gather_bytes: a piece number is out of range")
    if lib is not None:
        bases = np.ascontiguousarray(bases, dtype=np.uint64)
        got = lib.sp_gather_bytes(_ptr(bases), len(bases), _ptr(piece), _ptr(src_start), _ptr(length),
                                  _ptr(dst_off), len(length), _ptr(dst))
        if got < 0:
            raise ValueError("gather_bytes: a piece number is out of range")
        return dst
    # numpy: one vectorised copy per piece, through a byte index (8 bytes of index per byte)
    for k in np.unique(piece).tolist():
        rows = np.flatnonzero((piece == k) & (length > 0))  # the kernel skips rows of no bytes
        n = length[rows]
        if n.sum() == 0:
            continue
        shift = np.repeat(src_start[rows] - dst_off[rows], n)
        at = np.repeat(dst_off[rows], n) + (np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n))
        dst[at] = buffers[k][at + shift]
    return dst


def run_indices(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Return the indices of the runs ``[starts[i], starts[i] + lengths[i])``, concatenated."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    first = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return np.repeat(starts - first, lengths) + np.arange(total, dtype=np.int64)
