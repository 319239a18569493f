"""Rows to ranks: as many micro-batches as equal counts need (rows split, never one left empty), then a deal of
equal counts whose cost sums are balanced (``kernels.deal.deal_equal``: Karmarkar-Karp over the rows)."""
from __future__ import annotations

import numpy as np

from ..errors import SortpackError
from ..kernels.deal import deal_equal
from ..kernels.gather import run_indices
from .options import BatchOptions


def per_rank_count(rows: int, opts: BatchOptions) -> int:
    """Return how many micro-batches each rank gets under equal counts: enough for the rows, at least
    ``min_microbatches`` and one, a multiple of ``count_multiple``."""
    k = opts.count_multiple
    need = max(-(-rows // opts.world_size), opts.min_microbatches, 1)
    return -(-need // k) * k


def split_rows(row_of: np.ndarray, weight: np.ndarray, size: np.ndarray, target: int) -> np.ndarray:
    """Return ``row_of`` (each item's row) with rows split in two until there are ``target`` rows.

    The rows of most weight that hold two items or more are split first, each into two halves of
    about equal size (its items by size, largest first, dealt A B B A A B B A ...: each half gets
    one of the two largest). A split row's halves hold fewer tokens than it did: no cap is crossed,
    no row is left empty. The caller makes sure there are at least ``target`` items.
    """
    row_of = row_of.copy()
    rows = int(row_of.max()) + 1 if len(row_of) else 0
    while rows < target:
        count = np.bincount(row_of, minlength=rows)
        work = np.bincount(row_of, weight, minlength=rows)
        can = np.flatnonzero(count >= 2)
        if not len(can):  # pragma: no cover - the caller counts the items first
            raise AssertionError("no row left to split")
        take = can[np.lexsort((can, -work[can]))][:target - rows]
        starts = np.concatenate(([0], np.cumsum(count)))[take]
        by_row = np.lexsort((np.arange(len(row_of)), row_of))  # the items of each row, rows in order
        at = by_row[run_indices(starts, count[take])]
        owner = np.repeat(np.arange(len(take)), count[take])
        place = np.lexsort((at, -size[at], owner))  # within each taken row: largest first
        rank = np.empty(len(at), np.int64)  # owner is sorted already: place keeps each row's items together
        rank[place] = np.arange(len(at)) - np.concatenate(([0], np.cumsum(count[take])))[owner]
        second = (rank % 4 == 1) | (rank % 4 == 2)
        row_of[at[second]] = rows + owner[second]
        rows += len(take)
    return row_of


def check_enough(items: int, what: str, per_rank: int, opts: BatchOptions) -> None:
    """Raise SortpackError when ``items`` (``what``: sequences or groups) cannot fill every rank's ``per_rank``
    micro-batches, none empty."""
    need = per_rank * opts.world_size
    if items < need:
        raise SortpackError(f"plan_batch: {items} {what} cannot give world_size={opts.world_size} ranks "
                            f"{per_rank} micro-batch(es) each (count_multiple={opts.count_multiple}, "
                            f"min_microbatches={opts.min_microbatches}) without an empty one; pass "
                            f"equal_counts=False, or fewer ranks")


def deal_rows(cost: np.ndarray, world_size: int) -> np.ndarray:
    """Return each row's rank: equal counts (rows padded with zero-cost fillers to a multiple of ``world_size``,
    which only unequal counts need), cost sums balanced (``kernels.deal.deal_equal``: Karmarkar-Karp, then swaps)."""
    m = len(cost)
    padded = -(-m // world_size) * world_size
    full = np.concatenate((cost, np.zeros(padded - m))) if padded > m else cost
    return deal_equal(full, world_size, real=m)[:m]
