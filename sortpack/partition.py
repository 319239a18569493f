"""Which rank owns which global rows: the partitioning policy shared by format and stages.

Ranks own whole shards (or whole packing segments) in contiguous blocks, so every output
file is written by one rank and its bytes never depend on the rank count.
"""
from __future__ import annotations

import numpy as np


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
