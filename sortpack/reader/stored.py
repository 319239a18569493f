"""Stored data of an index (``sortpack run --store``): micro-batches as zero-copy Arrow slices.

The data shards hold one row per sample in plan order, so micro-batch ``i`` is rows
``[row_start[i], row_start[i + 1])``: one contiguous slice of a memory-mapped Arrow file.
Depends on numpy and pyarrow only.
"""
from __future__ import annotations

import bisect
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from ..errors import SortpackError
from ..format.integrity import check_sha256, member_path
from ..format.shards import open_shard


class _RowsById(NamedTuple):
    """The plan's sample ids sorted, and the stored row of each: where ``positions`` looks ids up."""

    sorted_ids: np.ndarray
    rows: np.ndarray


class StoredData:
    """The data shards of an index.

    ``index`` is a ``PackedIndex`` whose manifest has a ``data`` object. Shards are
    memory-mapped when first touched; ``microbatch(i)`` returns a zero-copy slice.
    """

    def __init__(self, index) -> None:
        self.index = index
        self.path = Path(index.path)
        data = index.manifest.get("data")
        if not data:
            raise SortpackError(f"{self.path}: the index stores no data (built without --store)")
        self.columns = list(data["columns"])
        self._schema = data.get("schema")
        self.tokens = data.get("tokens")
        self._entries = list(data["shards"])
        self._firsts = [int(e["first"]) for e in self._entries]
        self.num_rows = int(data["num_rows"])
        total = sum(int(e["rows"]) for e in self._entries)
        if total != self.num_rows or any(self._firsts[k] != self._firsts[k - 1] + int(self._entries[k - 1]["rows"])
                                         for k in range(1, len(self._entries))):
            raise SortpackError(f"{self.path}: manifest data shards do not tile its {self.num_rows} rows")
        for entry in self._entries:
            shard = member_path(self.path, entry["file"])
            size = shard.stat().st_size if shard.is_file() else None
            if size != int(entry["bytes"]):
                found = "missing" if size is None else f"{size} bytes"
                raise SortpackError(f"{shard}: {found}, the manifest says {entry['bytes']} bytes")
        self._shards: list = [None] * len(self._entries)
        counts = index["num_samples"].astype(np.int64)
        self.row_start = np.concatenate(([0], np.cumsum(counts)))
        if int(self.row_start[-1]) != self.num_rows:
            raise SortpackError(f"{self.path}: {self.num_rows} stored rows for {int(self.row_start[-1])} samples")
        self._position_of: _RowsById | None = None

    def __reduce__(self):
        from .index import PackedIndex

        return (_reopen, (PackedIndex, str(self.path)))

    def _shard(self, k: int) -> pa.RecordBatch:
        batch = self._shards[k]
        if batch is None:
            # structure only (offsets in bounds, rows, schema): O(rows), no read of the values
            batch = open_shard(self.path, self._entries[k], self._schema, self.columns)
            self._shards[k] = batch
        return batch

    def verify_all(self) -> None:
        """Re-hash every data shard against the manifest and check its structure (``PackedIndex(verify=True)``)."""
        for k, entry in enumerate(self._entries):
            check_sha256(member_path(self.path, entry["file"]), entry)
            self._shard(k)

    def rows(self, start: int, stop: int) -> pa.RecordBatch | pa.Table:
        """Return rows ``[start, stop)`` in plan order (a zero-copy batch when inside one shard)."""
        if not 0 <= start <= stop <= self.num_rows:
            raise IndexError(f"rows [{start}, {stop}) outside [0, {self.num_rows}]")
        k = max(0, bisect.bisect_right(self._firsts, start) - 1)
        if not self._entries:
            return pa.table({c: [] for c in self.columns})
        first = self._firsts[k]
        if stop - first <= int(self._entries[k]["rows"]):
            return self._shard(k).slice(start - first, stop - start)
        parts = []
        while start < stop:
            first = self._firsts[k]
            end = min(stop, first + int(self._entries[k]["rows"]))
            parts.append(self._shard(k).slice(start - first, end - start))
            start, k = end, k + 1
        return pa.Table.from_batches(parts)

    def microbatch(self, i: int) -> pa.RecordBatch | pa.Table:
        """Return the stored rows of micro-batch ``i`` (in its sample-id order), a zero-copy slice."""
        if not 0 <= i < len(self.row_start) - 1:
            raise IndexError(f"micro-batch {i} out of range [0, {len(self.row_start) - 1})")
        return self.rows(int(self.row_start[i]), int(self.row_start[i + 1]))

    def positions(self, sample_ids) -> np.ndarray:
        """Return the stored row of each sample id (KeyError for ids not in the plan)."""
        if self._position_of is None:
            ids = self.index.all_sample_ids()
            order = np.argsort(ids, kind="stable")
            self._position_of = _RowsById(ids[order], order)
        sorted_ids, order = self._position_of
        want = np.asarray(sample_ids, dtype=np.int64)
        at = np.searchsorted(sorted_ids, want)
        at = np.minimum(at, max(len(sorted_ids) - 1, 0))
        if len(sorted_ids) == 0 or (sorted_ids[at] != want).any():
            missing = want[(len(sorted_ids) == 0) | (sorted_ids[at] != want)][0]
            raise KeyError(f"sample id {int(missing)} is not in the plan's stored data")
        return order[at]

    def take(self, sample_ids) -> pa.Table:
        """Return the stored rows of arbitrary sample ids, in the order given."""
        pos = self.positions(sample_ids)
        parts = [self.rows(int(p), int(p) + 1) for p in pos.tolist()]
        if not parts:
            return pa.table({c: [] for c in self.columns})
        return pa.Table.from_batches([p for part in parts for p in
                                      (part.to_batches() if isinstance(part, pa.Table) else [part])])


def _reopen(index_cls, path):
    return StoredData(index_cls(path))
