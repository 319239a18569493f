"""The micro-batches one rank writes (``OwnedMicrobatches``) and their pieces' ranges: the records the index writer
hands the store.

The index writer (``index_writer``) moves each micro-batch to the rank that writes its shard and
builds these; the store (``store/``) reads the same micro-batches' sample ids and ranges. Both
import this module, neither imports the other for them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = ["PIECE_COLUMNS", "OwnedMicrobatches", "PieceRanges", "owned_microbatches"]

PIECE_COLUMNS = ("piece_begin", "piece_end")  # --oversize split: each sample's range in its source sample


class PieceRanges(NamedTuple):
    """``--oversize split``: each sample's range ``[begin, end)`` in its source sample, one value per sample id."""

    begin: np.ndarray
    end: np.ndarray

    def column(self, name: str) -> np.ndarray:
        """Return the values of index column ``name`` (one of ``PIECE_COLUMNS``)."""
        return self.begin if name == PIECE_COLUMNS[0] else self.end


@dataclass(frozen=True)
class OwnedMicrobatches:
    """The micro-batches one rank writes, ``[first, first + count)``, moved to it from the ranks that packed them."""

    first: int
    columns: dict[str, np.ndarray]  # per micro-batch, ``microbatch`` (the global number) included
    offsets: np.ndarray  # each micro-batch's first sample in ``sample_ids``, plus the end
    sample_ids: np.ndarray
    ranges: PieceRanges | None  # --oversize split: each sample's range in its source sample
    row_sizes: np.ndarray | None  # rows mode: each row's samples, rows in micro-batch order
    row_offsets: np.ndarray | None  # rows mode: each micro-batch's first row, plus the end
    row_starts: np.ndarray | None  # rows mode: each row's first sample, plus the end

    @property
    def count(self) -> int:
        """Return how many micro-batches this rank writes."""
        return len(self.columns["microbatch"])

    def samples_in(self, a: int, b: int) -> int:
        """Return the samples in local micro-batches ``[a, b)``."""
        return int(self.offsets[b] - self.offsets[a])


def owned_microbatches(first: int, columns: dict[str, np.ndarray], sample_ids: np.ndarray,
                       ranges: PieceRanges | None = None,
                       row_sizes: np.ndarray | None = None) -> OwnedMicrobatches:
    """Return a rank's owned micro-batches, with the offsets its tables are cut by (from the per-micro-batch counts)."""
    offsets = np.concatenate(([0], np.cumsum(columns["num_samples"], dtype=np.int64)))
    row_offsets = row_starts = None
    if row_sizes is not None:
        row_offsets = np.concatenate(([0], np.cumsum(columns["batch_size"], dtype=np.int64)))
        row_starts = np.concatenate(([0], np.cumsum(row_sizes, dtype=np.int64)))
    return OwnedMicrobatches(first, columns, offsets, sample_ids, ranges, row_sizes, row_offsets, row_starts)
