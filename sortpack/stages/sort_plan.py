"""The sort's pure half: the widths of the sort key's fields and the curriculum stage of each sorted position.

Every rank computes these from the same global numbers (the largest group, the stage count,
the total), so they need no communication and are tested without MPI.
"""
from __future__ import annotations

import numpy as np


def group_width(max_group: int) -> int:
    """Return the bits the group field needs for groups ``0..max_group`` (at least 1)."""
    return max(1, int(max_group).bit_length())


def stage_width(stages: int) -> int:
    """Return the bits the stage field needs for ``stages`` curriculum stages (at least 1)."""
    return max(1, int(stages - 1).bit_length())


def id_width(total: int) -> int:
    """Return the bits the id field needs for sample ids (or positions) ``0..total - 1`` (at least 1)."""
    return max(1, int(total - 1).bit_length())


def curriculum_stages(pos: np.ndarray, stages: int, total: int, groups: np.ndarray | None = None,
                      counts: np.ndarray | None = None) -> np.ndarray:
    """Return the stage (int16) of sorted global positions ``pos``: its exact quantile bucket of ``stages``.

    With ``groups`` (each position's group, positions sorted by group first) and ``counts``
    (every group's size), the quantile is taken within the position's group.
    """
    if groups is None or counts is None:
        return ((pos * stages) // max(total, 1)).astype(np.int16)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return (((pos - first[groups]) * stages) // np.maximum(counts[groups], 1)).astype(np.int16)
