"""Which rank owns which global rows: the partitioning policy shared by format and stages.

Ranks own whole shards (or whole packing segments) in contiguous blocks, so every output
file is written by one rank and its bytes never depend on the rank count.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .parallel import Comm


def shard_starts(total_rows: int, rows_per_shard: int) -> np.ndarray:
    """Return the first global row of every shard, plus ``total_rows`` at the end."""
    n = -(-total_rows // rows_per_shard) if total_rows else 0
    starts = np.arange(n + 1, dtype=np.int64) * rows_per_shard
    starts[-1] = total_rows
    return starts


def owner_starts(total_rows: int, rows_per_shard: int, ranks: int) -> np.ndarray:
    """Return, for each rank, the first global row it owns when ranks own whole shards.

    Shards go to ranks in contiguous blocks as even as whole shards allow, so every
    rank's share is within one shard of even.
    """
    num_shards = -(-total_rows // rows_per_shard) if total_rows else 0
    first_shard = (np.arange(ranks + 1, dtype=np.int64) * num_shards) // ranks
    return np.minimum(first_shard * rows_per_shard, total_rows)


def balanced_blocks(weights: np.ndarray, ranks: int) -> np.ndarray:
    """Return, for each rank, the first item of its contiguous block of items (plus the end).

    Blocks are balanced by weight: an item goes to the rank whose share of the cumulative
    weight holds the item's midpoint.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if len(weights) == 0:
        return np.zeros(ranks + 1, dtype=np.int64)
    total = weights.sum()
    if total <= 0:
        weights, total = np.ones(len(weights)), float(len(weights))
    mid = np.cumsum(weights) - weights / 2
    owner = np.minimum((mid * ranks / total).astype(np.int64), ranks - 1)
    return np.searchsorted(owner, np.arange(ranks + 1), side="left").astype(np.int64)


def split_rows(weights: np.ndarray, splittable: np.ndarray, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (unit, row offset in it) where each rank's run starts, plus the end ``(n, 0)``.

    Rank r's run starts at cumulative weight ``r * W // ranks`` (weights are rows where
    known): a splittable unit (rows known) is cut at that exact row, so every rank gets
    ``N / ranks`` rows whatever the row-group layout; a unit that cannot be cut (rows
    unknown until parsed) goes whole to the rank whose share holds its midpoint.
    """
    w = np.maximum(np.asarray(weights, dtype=np.int64), 0)
    splittable = np.asarray(splittable, dtype=bool)
    n = len(w)
    if n == 0:
        return np.zeros(ranks + 1, np.int64), np.zeros(ranks + 1, np.int64)
    if w.sum() == 0:
        w = np.ones(n, np.int64)  # all empty as far as known: still every unit must be read once
    ends = np.cumsum(w)
    starts = ends - w
    total = int(ends[-1])
    target = (np.arange(ranks + 1, dtype=np.int64) * total) // ranks
    unit = np.searchsorted(ends, target, side="right").astype(np.int64)  # unit holding row `target`
    inside = unit < n
    off = np.zeros(ranks + 1, np.int64)
    off[inside] = target[inside] - starts[unit[inside]]
    whole = inside & ~splittable[np.minimum(unit, n - 1)]
    # an uncuttable unit starts the next rank's run iff its midpoint lies past the target
    past_mid = whole & (2 * off >= w[np.minimum(unit, n - 1)])
    unit[past_mid] += 1
    off[whole] = 0
    unit[0], off[0] = 0, 0
    return unit, off


def index_shard_layout(comm: Comm, num_samples: np.ndarray, first: int, total: int,
                       rows_per_shard: int, samples_per_shard: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (first micro-batch of every index shard plus the end, first micro-batch each rank writes).

    This rank holds micro-batches ``[first, first + len(num_samples))``. Collective: every rank
    finds its shard ends (``index_shard_cuts``), which depend on the data only, never on the rank
    count; the gathered ends are dealt to ranks by bytes (``index_shard_owners``).
    """
    n = np.asarray(num_samples, dtype=np.int64)
    cut_mb, cut_samples = index_shard_cuts(n, first, total, comm.exscan(int(n.sum())), rows_per_shard,
                                           samples_per_shard)
    return index_shard_owners(comm.allgatherv(cut_mb), comm.allgatherv(cut_samples), total,
                              comm.allreduce(int(n.sum()), "sum"), size=comm.size)


# --- the write side's deals: files checked in turn, input units read in
# --- blocks, rows found by their block, index shards cut by samples and dealt by bytes

def round_robin(n: int, *, rank: int, size: int) -> list[int]:
    """Return the items of ``range(n)`` rank ``rank`` of ``size`` takes when they are dealt in turn."""
    return list(range(rank, n, size))


def reader_blocks(unit_rows: np.ndarray, *, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (first unit each rank reads, first global row each rank reads), each plus the end.

    Units go whole to ranks in contiguous blocks balanced by their rows (``balanced_blocks``).
    """
    rows = np.asarray(unit_rows, dtype=np.int64)
    bounds = balanced_blocks(rows.astype(np.float64), size)
    row_starts = np.concatenate(([0], np.cumsum(rows))).astype(np.int64)
    return bounds, row_starts[bounds]


def rank_of(rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Return the rank holding each global row when rank ``r`` holds ``[starts[r], starts[r + 1])``.

    An empty rank's start equals the next one's, so a row goes to the last rank starting at or before it.
    """
    return np.searchsorted(starts, rows, side="right") - 1


def index_shard_cuts(num_samples: np.ndarray, first: int, total: int, sample_start: int,
                     rows_per_shard: int, samples_per_shard: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (the micro-batch after each index shard end among this rank's, the samples before it).

    This rank holds micro-batches ``[first, first + len(num_samples))`` of ``total``, whose samples
    start at global sample ``sample_start``. A shard ends after the micro-batch in which the running
    sample count reaches a multiple of ``samples_per_shard``, and after every ``rows_per_shard``
    micro-batches: boundaries of the data only, so any deal of micro-batches to ranks finds the same.
    The plan's end is not among them.
    """
    n = np.asarray(num_samples, dtype=np.int64)
    end = np.cumsum(n) + sample_start
    start = end - n
    mb = first + np.arange(len(n), dtype=np.int64)
    cut = (end // samples_per_shard > start // samples_per_shard) | ((mb + 1) % rows_per_shard == 0)
    cut &= mb + 1 < total
    return mb[cut] + 1, end[cut]


def index_shard_owners(cut_mb: np.ndarray, cut_samples: np.ndarray, total: int, total_samples: int,
                       *, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (first micro-batch of every index shard plus the end, first micro-batch each rank writes).

    ``cut_mb``/``cut_samples`` are every rank's ``index_shard_cuts`` in rank order. Shards go to
    ranks in contiguous blocks balanced by their bytes (about 8 per sample id plus 48 per
    micro-batch), so every rank writes once there are as many shards as ranks.
    """
    starts = np.concatenate(([0], cut_mb, [total])).astype(np.int64) if total else np.zeros(1, np.int64)
    sample_starts = np.concatenate(([0], cut_samples, [total_samples])).astype(np.int64)
    weights = 8 * np.diff(sample_starts[:len(starts)]) + 48 * np.diff(starts)
    blocks = balanced_blocks(weights, size)
    return starts, starts[np.minimum(blocks, len(starts) - 1)]


# --- the input side's deals: analyze's files and row runs, the digests, row packing's windows ---


def even_range(n: int, *, rank: int, size: int) -> tuple[int, int]:
    """Return the items ``[lo, hi)`` of ``n`` that rank ``rank`` of ``size`` takes: contiguous, within one of even."""
    return (n * rank) // size, (n * (rank + 1)) // size


def rank_run(cut_unit: np.ndarray, cut_off: np.ndarray, *, rank: int) -> tuple[int, int, int, int]:
    """Return rank ``rank``'s run ``(lo, head, hi, tail)`` of ``split_rows``'s cuts.

    The run starts at row ``head`` of unit ``lo`` and ends before row ``tail`` of unit ``hi``.
    """
    return int(cut_unit[rank]), int(cut_off[rank]), int(cut_unit[rank + 1]), int(cut_off[rank + 1])


def unit_owners(cut_unit: np.ndarray, units: np.ndarray, *, size: int) -> np.ndarray:
    """Return, for each of ``units``, the last rank of ``size`` whose ``split_rows`` run starts at or before it.

    That rank reads the unit (its last part, when the unit is cut between ranks).
    """
    return np.clip(np.searchsorted(cut_unit, units, side="right") - 1, 0, size - 1)


def owned(owners: np.ndarray, *, rank: int) -> list[int]:
    """Return the items whose owner is ``rank``, in order."""
    return np.flatnonzero(np.asarray(owners) == rank).tolist()


def deal_windows(pos: np.ndarray, stage: np.ndarray, per_stage: np.ndarray, window: int,
                 *, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (the global window of each sample, the rank of ``size`` that packs it).

    ``pos`` are the samples' global sorted positions and ``stage`` their curriculum stages,
    ``per_stage`` the samples of every stage. A stage of n samples has ``ceil(n / window)``
    windows, and its k-th sample goes to its window ``k mod windows``, so each window spans
    the stage's whole size range. Windows are numbered globally and go to ranks in
    contiguous blocks; nothing depends on the rank count but which rank packs a window.
    """
    per_stage = np.asarray(per_stage, dtype=np.int64)
    stage_first = np.concatenate(([0], np.cumsum(per_stage)[:-1]))
    windows = -(-per_stage // window)
    window_first = np.concatenate(([0], np.cumsum(windows)[:-1]))
    total_windows = max(int(windows.sum()), 1)
    of = window_first[stage] + (pos - stage_first[stage]) % np.maximum(windows[stage], 1)
    return of, (of * size) // total_windows


def value_owners(values: np.ndarray, *, size: int) -> np.ndarray:
    """Return the rank that gathers each non-negative integer value's counts (the value modulo ``size``).

    Equal values meet on one rank wherever they were counted, so their counts merge there.
    """
    return np.asarray(values, dtype=np.int64) % size
