"""The kernels of rows composed by their targets (``stages/pack/compose.py``), each compiled with a numpy
fallback that gives the same result: equal-size samples given to rows group after group (``compose_groups``),
and the fewest targets of a subset of each row's samples of every room, a 0/1 knapsack per row
(``min_subsets``; ``subset_of`` gives one such subset back)."""
from __future__ import annotations

import numpy as np

from ._loader import _c, _i64, _ptr


def compose_groups(slot: np.ndarray, row: np.ndarray, targets: np.ndarray, groups: tuple[np.ndarray, np.ndarray],
                   sweeps: int) -> None:
    """Give each group of slots its samples, most targets first, to its rows, fewest targets elsewhere first
    (ties: the lower sample, the earlier position), group after group, ``sweeps`` times; ``slot`` (int64, the
    sample at each position) is updated in place.

    ``groups`` is (the positions group by group, where each group starts and the end); ``row`` each position's
    row, a group holding a row at most once; ``targets`` each sample's, non-negative.
    """
    grouped, bounds = _i64(groups[0]), _i64(groups[1])
    row, targets = _i64(row), _i64(targets)
    n_rows = int(row.max()) + 1 if len(row) else 0
    total = np.bincount(row, targets[slot], minlength=n_rows).astype(np.int64)
    lib = _c()
    if lib is not None and slot.dtype == np.int64 and slot.flags.c_contiguous:
        scratch = np.empty(7 * max(int(np.diff(bounds).max()) if len(bounds) > 1 else 0, 1), np.int64)
        if lib.sp_compose_groups(_ptr(slot), _ptr(row), _ptr(targets), _ptr(total), _ptr(grouped), _ptr(bounds),
                                 len(bounds) - 1, sweeps, _ptr(scratch)) == 0:
            return
    for _ in range(sweeps):
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            if b - a < 2:
                continue
            at = grouped[a:b]
            r = row[at]
            held = slot[at]
            rest = total[r] - targets[held]
            samples = held[np.lexsort((held, -targets[held]))]
            to = np.lexsort((at, rest))
            slot[at[to]] = samples
            total[r[to]] = rest[to] + targets[samples]


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
