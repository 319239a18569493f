"""The data shards' layout: their rows and micro-batches, and the contiguous block of them each rank writes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...format.data_shards import data_cuts
from ...parallel import Comm
from ...partition import balanced_blocks

if TYPE_CHECKING:
    from ..owned import OwnedMicrobatches

ROW_WEIGHT = 16  # per-row bytes (offsets, validity) when balancing the writers by size


@dataclass(frozen=True)
class DataLayout:
    """Every data shard's (first row, first micro-batch) plus the end, and each rank's first shard to write.

    ``bounds`` has one row per shard plus the plan's end (shape ``(shards + 1, 2)``);
    ``writer_starts`` has ``ranks + 1`` entries: rank ``r`` writes shards
    ``[writer_starts[r], writer_starts[r + 1])``.
    """

    bounds: np.ndarray
    writer_starts: np.ndarray

    @property
    def owner_starts(self) -> np.ndarray:
        """Return each rank's first output position to write (the rows it receives start there)."""
        return self.bounds[self.writer_starts, 0]

    @property
    def num_rows(self) -> int:
        """Return the plan's output positions (rows stored)."""
        return int(self.bounds[-1, 0])


@dataclass(frozen=True)
class LocalShards:
    """One rank's data shards before they are gathered: each one's (first row, first micro-batch), the rank's
    end as one more such row, and each shard's weight (its samples' summed sizes plus ``ROW_WEIGHT`` per row)."""

    bounds: np.ndarray
    end: np.ndarray
    weights: np.ndarray


def local_data_shards(first_mb: int, mb_offsets: np.ndarray, pos0: int, index_starts: np.ndarray,
                      mb_sizes: np.ndarray | None = None) -> LocalShards:
    """Return the data shards starting among this rank's micro-batches ``[first_mb, ...)`` (rows from ``pos0``)."""
    cuts = data_cuts(first_mb, mb_offsets, pos0, index_starts)
    m = max(len(mb_offsets) - 1, 0)
    weight = np.zeros(0, np.float64)
    if len(cuts):
        sizes = np.zeros(m, np.float64) if mb_sizes is None else np.asarray(mb_sizes, np.float64)
        cum = np.concatenate(([0.0], np.cumsum(sizes)))
        weight = np.diff(cum[cuts]) + ROW_WEIGHT * np.diff(mb_offsets[cuts])
    mine = np.stack((pos0 + mb_offsets[cuts[:-1]], first_mb + cuts[:-1]), axis=1) if len(cuts) \
        else np.zeros((0, 2), np.int64)
    end = np.array([[pos0 + (int(mb_offsets[-1]) if m else 0), first_mb + m]], dtype=np.int64)
    return LocalShards(mine.astype(np.int64), end, weight)


def merge_data_layout(parts: list[LocalShards], *, size: int) -> DataLayout:
    """Return the data layout from every rank's ``local_data_shards`` (in rank order), dealt to ``size`` writers.

    The shards go to ranks in contiguous blocks balanced by weight: the plan is sorted by size,
    so equal row counts would give the last rank the longest rows.
    """
    # the plan's end: the last rank's; trailing micro-batches of no rows join the last shard
    last = max((p.end for p in parts), key=lambda e: (int(e[0, 0]), int(e[0, 1])))
    bounds = np.concatenate([p.bounds for p in parts] + [last])
    return DataLayout(bounds.astype(np.int64), balanced_blocks(np.concatenate([p.weights for p in parts]), size))


def data_layout(comm: Comm, owned: OwnedMicrobatches, pos0: int, index_starts: np.ndarray) -> DataLayout:
    """Return the data shards' layout and the shards each rank writes (collective).

    The shards follow the index owners' micro-batches (``data_cuts``), but who writes them
    does not: the index of a small plan is one shard on one rank, so writing data where the
    index is would send every row to that rank (``merge_data_layout`` deals them by weight).
    ``owned``: this rank's micro-batches of the index, their rows from output position ``pos0``.
    """
    # the micro-batches' summed sample sizes balance the writers
    local = local_data_shards(owned.first, owned.offsets, pos0, index_starts, owned.columns.get("tokens"))
    return merge_data_layout(comm.allgather_obj(local), size=comm.size)
