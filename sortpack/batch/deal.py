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
    """Return each row's rank: equal counts (rows padded with zero-cost rows to a multiple of ``world_size``, which
    only unequal counts need), cost sums balanced by Karmarkar-Karp and then by swaps (``swap_rows``)."""
    m = len(cost)
    padded = -(-m // world_size) * world_size
    full = np.concatenate((cost, np.zeros(padded - m))) if padded > m else cost
    return swap_rows(full, deal_equal(full, world_size), world_size, m)[:m]


TIGHT = 1e-5  # the heaviest rank this close to the mean (relative) is balanced: no swap is tried
LIGHTEST = 4  # the lightest ranks the heaviest may swap with, lightest first


def _best_swap(cost: np.ndarray, mine: np.ndarray, theirs: np.ndarray, gap: float, real: int
               ) -> tuple[int, int, float]:
    """Return (place in ``mine``, place in ``theirs``, what moves) of the swap of two rows whose costs differ by
    nearest ``gap / 2`` within (0, gap): the one that brings the heavier rank lowest (-1, -1, 0 when none helps).
    ``theirs`` is sorted by cost; rows from ``real`` on are fillers that never move."""
    have = cost[theirs]
    at = np.searchsorted(have, cost[mine] - gap / 2)
    best = (-1, -1, 0.0, gap)
    for pick in (np.maximum(at - 1, 0), np.minimum(at, len(theirs) - 1)):
        moved = cost[mine] - have[pick]
        ok = (moved > 0) & (moved < gap) & (mine < real) & (theirs[pick] < real)
        worse = np.where(ok, np.maximum(gap - moved, moved), np.inf)
        j = int(np.argmin(worse))
        if worse[j] < best[3]:
            best = (j, int(pick[j]), float(moved[j]), float(worse[j]))
    return best[0], best[1], best[2]


def swap_rows(cost: np.ndarray, part: np.ndarray, k: int, real: int, rounds: int = 0) -> np.ndarray:
    """Return ``part`` with rows swapped between the heaviest rank and the lightest ones while that lowers the
    heaviest (counts unchanged; every rank holds ``len(cost) / k`` rows).

    Karmarkar-Karp with equal counts can only close a gap by the spread of the run it merges: one
    row far heavier than the rest (a composed row of many targets) leaves its rank heavy when every
    other run is narrow. A swap of one row of the heaviest rank for one of a lighter rank, whose
    costs differ by about half the gap, closes it. At most ``rounds`` swaps (default 2k + 16). Rows from
    ``real`` on (the zero-cost fillers of unequal counts) stay where they are.
    """
    if not len(cost):
        return part
    held = np.lexsort((np.arange(len(cost)), cost, part)).reshape(k, -1)  # each rank's rows, cheapest first
    sums = cost[held].sum(axis=1)
    close = float(sums.mean()) * TIGHT
    for _ in range(rounds or 2 * k + 16):
        h = int(np.argmax(sums))
        if sums[h] - sums.mean() <= close:
            break
        for light in np.argsort(sums, kind="stable")[:LIGHTEST]:
            x, y, moved = _best_swap(cost, held[h], held[light], float(sums[h] - sums[light]), real)
            if x >= 0:
                held[h, x], held[light, y] = held[light, y], held[h, x]
                for r in (h, light):
                    held[r] = held[r][np.lexsort((held[r], cost[held[r]]))]
                sums[h] -= moved
                sums[light] += moved
                break
        else:
            break
    out = np.empty(len(cost), np.int64)
    out[held] = np.arange(k)[:, None]
    return out
