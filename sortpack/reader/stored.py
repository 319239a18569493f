"""Stored data of an index (``sortpack run --store``): micro-batches as zero-copy Arrow slices.

The data shards hold one row per sample in plan order, so micro-batch ``i`` is rows
``[row_start[i], row_start[i + 1])``: one contiguous slice of a memory-mapped Arrow file.
Depends on numpy and pyarrow only.
"""
from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..errors import SortpackError
from ..format.integrity import check_sha256, member_path, shard_firsts
from ..format.mapped import ShardWatch
from ..format.shards import open_shard
from ..kernels.tokens import TokenView
from .tokens import list_token_view


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
        self.num_rows = int(data["num_rows"])
        self._firsts = shard_firsts(self.path, self._entries, self.num_rows, "stored rows")
        self._shards: list = [None] * len(self._entries)
        self._watch = ShardWatch(self.path, [str(member_path(self.path, e["file"])) for e in self._entries])
        counts = index["num_samples"].astype(np.int64)
        self.row_start = np.concatenate(([0], np.cumsum(counts)))
        if int(self.row_start[-1]) != self.num_rows:
            raise SortpackError(f"{self.path}: {self.num_rows} stored rows for {int(self.row_start[-1])} samples")
        self._position_of: np.ndarray | None = None
        self._byte_ranges: dict = {}  # (shard, column) -> row_store.ByteRanges or None, for take
        self._token_views: dict = {}  # (shard, column) -> the column's (values, offsets) views or None

    def __reduce__(self):
        # the index pickles as its path and check level; the worker's index opens its stored data again
        return (_stored_of, (self.index,))

    def _shard(self, k: int) -> pa.RecordBatch:
        """Return data shard ``k`` mapped, checked unchanged since it was mapped (one stat; docs/guarantees.md)."""
        batch = self._shards[k]
        if batch is None:
            self.index.check_manifest()  # a shard mapped now must belong to the plan opened
            known = self._watch.opening(k)
            # structure only (offsets in bounds, rows, schema): O(rows), no read of the values
            batch = open_shard(self.path, self._entries[k], self._schema, self.columns)
            self._watch.mapped(k, known)
            self._shards[k] = batch
        else:  # its mapped memory is read next: a file that shrank would be a bus error, not an error
            self._watch.fresh(k)
        return batch

    def check_microbatch(self, i: int) -> tuple[int, int, int] | None:
        """Map micro-batch ``i``'s data shards now, or check them unchanged (``SortpackError`` names a changed one).

        Return where its rows lie, ``(shard, first row, end row)`` in that shard's rows, when
        they lie in one shard (``token_view_in`` reads them from there), else None.
        """
        if not self._entries:
            return None
        start, stop = self.row_start.item(i), self.row_start.item(i + 1)
        first = max(0, bisect.bisect_right(self._firsts, start) - 1)
        last = max(0, bisect.bisect_right(self._firsts, max(start, stop - 1)) - 1)
        for k in range(first, last + 1):
            self._shard(k)
        if first != last:
            return None
        base = self._firsts[first]
        return first, start - base, stop - base

    def verify_all(self) -> None:
        """Re-hash every data shard against the manifest and check its structure (``PackedIndex(verify="full")``)."""
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

    def token_view(self, column: str, i: int) -> TokenView | None:
        """Return the ``TokenView`` of micro-batch ``i``'s stored token ids in ``column`` (zero-copy), or None.

        Sample j's ids are ``values[offsets[j]:offsets[j + 1]]``; the shard's arrays are found once
        and each micro-batch is a slice of its offsets, with no Arrow object per micro-batch.
        None when the column is not a list of int32/int64 without null ids, or when the
        micro-batch's rows cross a shard boundary (``microbatch(i)`` then gives them).
        """
        start, stop = int(self.row_start[i]), int(self.row_start[i + 1])
        k = max(0, bisect.bisect_right(self._firsts, start) - 1)
        if not self._entries or stop - self._firsts[k] > int(self._entries[k]["rows"]):
            return None
        first = self._firsts[k]
        return self.token_view_in(column, (k, start - first, stop - first))

    def token_view_in(self, column: str, where: tuple[int, int, int]) -> TokenView | None:
        """Return ``token_view`` of the rows ``where`` names (as ``check_microbatch`` gives it), without a search."""
        k, lo, hi = where
        key = (k, column)
        view = self._token_views.get(key, False)
        if view is False:
            batch = self._shard(k)
            j = batch.schema.get_field_index(column)
            view = self._token_views[key] = None if j < 0 else list_token_view(batch.column(j))
        else:
            self._shard(k)  # the check: the view's memory is the mapped shard's
        if view is None:
            return None
        return view.sliced(lo, hi)

    def positions(self, sample_ids) -> np.ndarray:
        """Return the stored row of each sample id (KeyError for ids not in the plan)."""
        row_of = self._row_map()
        want = np.asarray(sample_ids, dtype=np.int64).reshape(-1)
        inside = (want >= 0) & (want < len(row_of))
        rows = np.full(len(want), -1, dtype=np.int64)
        rows[inside] = row_of[want[inside]]
        if (rows < 0).any():
            missing = want[rows < 0][0]
            raise KeyError(f"sample id {int(missing)} is not in the plan's stored data")
        return rows

    def _row_map(self) -> np.ndarray:
        """Return the stored row of every sample id (-1: not in the plan), built on first use.

        One scatter of the plan's sample ids, no sort: 4 bytes per input row (8 past 2^31
        stored rows). A sample id the plan repeats maps to one of its rows, which all hold
        the same values.
        """
        if self._position_of is None:
            ids = self.index.all_sample_ids()
            source_rows = int(self.index.manifest.get("source", {}).get("num_rows") or 0)
            source_rows = max(source_rows, int(ids.max()) + 1 if len(ids) else 0)
            dtype = np.int32 if len(ids) < 2**31 - 1 else np.int64
            row_of = np.full(source_rows, -1, dtype=dtype)
            row_of[ids] = np.arange(len(ids), dtype=dtype)
            del ids
            self._position_of = row_of
        return self._position_of

    def take(self, sample_ids) -> pa.Table:
        """Return the stored rows of arbitrary sample ids, in the order given.

        The ids are grouped by data shard and each row is copied once, straight into its
        place (``row_store.RowStore``: one compiled memcpy per row; pyarrow ``take`` per
        shard for the types it cannot address as byte ranges).
        """
        from ..row_store import RowStore, gather_ranges

        pos = self.positions(sample_ids)
        if not self._entries:
            return pa.table({c: [] for c in self.columns})
        firsts = np.asarray(self._firsts, dtype=np.int64)
        if len(pos) == 0:
            return pa.Table.from_batches([self._shard(0).slice(0, 0)])
        shard = np.searchsorted(firsts, pos, side="right") - 1
        order = np.argsort(shard, kind="stable")
        by_shard = shard[order]
        rows = pos[order] - firsts[by_shard]
        cuts = np.concatenate(([0], np.flatnonzero(np.diff(by_shard)) + 1, [len(order)]))
        touched = by_shard[cuts[:-1]].tolist()
        for k in touched:
            self._shard(k)  # mapped, or checked unchanged: the copies below read the mapped memory
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[order] = np.arange(len(order))
        piece = np.repeat(np.arange(len(touched)), np.diff(cuts))[inverse]
        schema = self._shard(touched[0]).schema
        columns = []
        for i, f in enumerate(schema):
            views = [self._ranges_of(k, i) for k in touched]
            if all(v is not None for v in views):  # one copy per row, straight from the mapped shards
                got = [v.ranges(rows[a:b]) for v, a, b in zip(views, cuts[:-1].tolist(), cuts[1:].tolist())]
                start, length = np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])
                columns.append(gather_ranges(f.type, views, piece, start[inverse], length[inverse]))
                continue
            store = RowStore(f.type)  # nulls or nested types
            for k, a, b in zip(touched, cuts[:-1].tolist(), cuts[1:].tolist()):
                store.add(self._shard(k).column(i), rows[a:b])
            columns.append(store.gather(inverse))
        return pa.Table.from_arrays(columns, schema=schema)

    def _ranges_of(self, k: int, i: int):
        """Return the ``row_store.ByteRanges`` of column ``i`` of shard ``k`` (None: not byte ranges), kept."""
        from ..row_store import ByteRanges

        cache = self._byte_ranges
        if (k, i) not in cache:
            cache[k, i] = ByteRanges.of(self._shard(k).column(i))
        return cache[k, i]


def _stored_of(index) -> StoredData:
    """Return the stored data of ``index`` (how a pickled ``StoredData`` opens again)."""
    return index.stored
