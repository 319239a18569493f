"""The fewest targets of a subset of each row's samples with a given total room (a 0/1 knapsack per row):
the compiled kernel, a numpy fallback over all rows at once (the same result), and one subset back."""
from __future__ import annotations

import numpy as np

from ._loader import _c, _i64, _ptr

NONE = np.iinfo(np.int64).max // 4  # no subset of that room: far above any sum of targets, and safe to add to


def min_subsets(rooms: np.ndarray, targets: np.ndarray, top: int) -> np.ndarray:
    """Return (rows, top + 1) int64: for each row of ``rooms``/``targets`` ((rows, k); room 0: no sample) and each
    s in 0..``top``, the fewest targets of a subset of the row's samples whose rooms sum to exactly s (``NONE``: none).

    Examples:
        >>> min_subsets(np.array([[2, 3, 0]]), np.array([[5, 1, 0]]), 5)[0, [0, 2, 3, 5]].tolist()
        [0, 5, 1, 6]
        >>> bool(min_subsets(np.array([[2, 3, 0]]), np.array([[5, 1, 0]]), 5)[0, 4] == NONE)
        True
    """
    rooms, targets = _i64(rooms), _i64(targets)
    n, k = rooms.shape
    lib = _c()
    if lib is not None:
        out = np.empty((n, top + 1), np.int64)
        if lib.sp_min_subsets(_ptr(rooms), _ptr(targets), n, k, top, NONE, _ptr(out)) == 0:
            return out
    return _min_subsets_numpy(rooms, targets, top)


def _min_subsets_numpy(rooms: np.ndarray, targets: np.ndarray, top: int) -> np.ndarray:
    """Return ``min_subsets`` computed with numpy: one step per sample place, all rows together."""
    n, k = rooms.shape
    fewest = np.full((n, top + 1), NONE, np.int64)
    fewest[:, 0] = 0
    s = np.arange(top + 1)
    for j in range(k):
        r = rooms[:, j:j + 1]
        src = s[None, :] - r
        was = np.take_along_axis(fewest, np.maximum(src, 0), axis=1)
        cand = was + targets[:, j:j + 1]
        cand[(src < 0) | (r <= 0) | (was >= NONE)] = NONE  # none stays none, whatever the sign of the targets
        np.minimum(fewest, cand, out=fewest)
    return fewest


def subset_of(rooms: np.ndarray, targets: np.ndarray, room: int) -> list[int]:
    """Return the places (descending) of one subset of room exactly ``room`` with the fewest targets among one row's
    samples (``rooms``/``targets`` 1-d; room 0: no sample), the one ``min_subsets`` counts; [] when there is none.
    """
    k = len(rooms)
    table = np.full((k + 1, room + 1), NONE, np.int64)
    table[0, 0] = 0
    for j in range(k):
        table[j + 1] = table[j]
        r = int(rooms[j])
        if 0 < r <= room:
            was = table[j, :room + 1 - r]
            np.minimum(table[j + 1, r:], np.where(was >= NONE, NONE, was + int(targets[j])), out=table[j + 1, r:])
    if table[k, room] >= NONE:
        return []
    chosen, left = [], room
    for j in range(k, 0, -1):
        if table[j, left] != table[j - 1, left]:
            chosen.append(j - 1)
            left -= int(rooms[j - 1])
    return chosen
