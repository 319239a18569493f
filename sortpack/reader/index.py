"""Index I/O: a memory-mapped sortpack index, read a micro-batch or a column at a time."""
from __future__ import annotations

import bisect
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from ..errors import SortpackError
from ..format import open_shard, read_manifest
from ..format.integrity import check_index_shard, check_sha256, member_path, shard_firsts
from ..format.mapped import ShardWatch, check_unchanged, identity
from ..format.schemas import measure_names

if TYPE_CHECKING:  # imported when used: the stored data's modules load with --store only
    from .stored import StoredData

SCALAR_COLUMNS = ("microbatch", "num_samples", "batch_size", "max_size", "padded_size",
                  "tokens", "min_key", "max_key", "stage", "source")


class Record(NamedTuple):
    """One micro-batch as the sampler hands it out: its sample ids, shape and packed rows."""

    sample_ids: list[int]
    batch_size: int
    padded_size: int
    row_splits: list[int] | None  # rows mode: offsets of each packed row into ``sample_ids``


_new_record = cast(Callable[[type[Record], tuple], Record], tuple.__new__)


def _ragged_lists(offsets: np.ndarray, values: np.ndarray, rows: np.ndarray) -> list[list[int]]:
    """Return ``values[offsets[r]:offsets[r + 1]].tolist()`` for each r of ``rows``, from one gather and one tolist."""
    lo, hi = offsets[rows].astype(np.int64), offsets[rows + 1].astype(np.int64)
    counts = hi - lo
    ends = np.cumsum(counts)
    starts = ends - counts
    flat = values[np.repeat(lo - starts, counts) + np.arange(int(ends[-1]) if len(ends) else 0)].tolist()
    return list(map(flat.__getitem__, map(slice, starts.tolist(), ends.tolist())))


class SampleHits(NamedTuple):
    """Where sample ids occur in a plan: one entry per occurrence, in plan order (int64 arrays)."""

    microbatch: np.ndarray
    place: np.ndarray  # the sample's place in its micro-batch
    sample_id: np.ndarray


_LEVELS = ("structure", "index", "full")


class PackedIndex:
    """A memory-mapped sortpack index: micro-batch metadata and sample ids without a full read.

    Parameters
    ----------
    path : str or os.PathLike
        The index directory (``sortpack pack``/``run`` output). Its manifest is read and every
        shard's size checked at once; shards are memory-mapped when a micro-batch first needs them.
    verify : {"index", "structure", "full"}
        How much is checked (docs/guarantees.md gives what each level costs). ``"index"``
        (default): a shard, when first mapped, is re-hashed against the
        manifest (index shards hold 4 or 8 bytes per sample), its Arrow structure, sample ids
        and counts checked; a data shard's Arrow structure and row count. ``"structure"``:
        no hash and no read of the ids, only the structure and counts (O(micro-batches)): for
        an index too large to read once per process. ``"full"`` (also ``True``): ``"index"``,
        and every index and data shard is re-hashed now, before the first step.
        (``True``/``False``, the first spellings of ``"full"``/``"index"``, are refused.)

    Attributes: ``manifest`` (the parsed manifest.json), ``options`` (the pack options),
    ``num_microbatches``, ``num_samples``, ``has_rows`` (rows mode: ``row_splits`` present),
    ``mixture`` (a mixture plan's manifest ``mixture`` object, else None), ``source_names``
    (a mixture's source names in order, the values of the ``source`` column, also in a
    mixture's held-out plan; else None),
    ``sum_columns`` (the per-micro-batch sums the plan records beside the shape: ``attention``,
    and measures such as ``size2`` and ``targets``; each readable as ``index[name]``),
    ``id_dtype`` (how the shards store sample ids: int32 when every id fits, else int64;
    every method hands out int64 arrays or Python ints either way).

    Examples
    --------
    ``plan/`` holds 16 texts of 1 to 16 characters, planned by
    ``sortpack run data/ -o plan/ --column text --max-tokens 32 --store text``:

    >>> from sortpack.reader import PackedIndex
    >>> index = PackedIndex("plan/")
    >>> index.num_samples, index.num_microbatches
    (16, 6)
    >>> index.shape(1)  # (samples, padded length) of micro-batch 1
    (3, 8)
    >>> index.microbatch(1)  # its sample ids: rows of the input
    array([ 3, 10,  1])
    """

    def __init__(self, path: str | os.PathLike, verify: str = "index"):
        self.path = Path(path)
        if not isinstance(verify, str) or verify not in _LEVELS:
            hint = f"; write verify={'full' if verify else 'index'!r}" if isinstance(verify, bool) else ""
            raise ValueError(f"verify={verify!r}: the levels are 'structure', 'index', 'full'{hint}")
        self.verify = verify
        self.manifest = read_manifest(self.path, expect="index")
        # the plan as opened: a shard mapped later must belong to it (docs/guarantees.md, "Files that change")
        self._manifest_identity = identity(self.path / "manifest.json")
        self.options = dict(self.manifest.get("options") or {})
        self.num_microbatches = int(self.manifest["num_microbatches"])
        self.num_samples = int(self.manifest["num_samples"])
        entries = self.manifest["shards"]
        # Refuse a damaged index now (a stat per shard); map a shard when a step first needs
        # it. Only Arrow footers and batch headers are read then, column pages on use.
        firsts = shard_firsts(self.path, entries, self.num_microbatches, "micro-batches")
        self._entries = entries
        self._shards: list = [None] * len(entries)
        self._watch = ShardWatch(self.path, [str(member_path(self.path, e["file"])) for e in entries])
        self._firsts = firsts
        self._starts = np.array(firsts + [self.num_microbatches], dtype=np.int64)
        self._views: dict = {}
        self._records: dict = {}  # shard -> (id offsets, ids, batch_size, padded_size) views, for record()
        self._id_views: dict = {}  # shard -> (id offsets, ids, the ids' data address), for stored_ids_at()
        self._columns: dict = {}
        schema = self.manifest.get("schema")
        schema = schema if isinstance(schema, dict) else {}
        names = list(schema)
        missing = {"sample_ids", "num_samples", "batch_size", "padded_size", "tokens"} - set(names)
        if missing:
            raise SortpackError(f"{self.path}: the manifest's schema lacks column(s) {', '.join(sorted(missing))}")
        self.has_rows = "row_splits" in names
        # the per-micro-batch sums beside the shape: ``attention`` and the measures (``size2``, ``targets``)
        self.sum_columns = tuple((["attention"] if "attention" in names else []) + list(measure_names(names)))
        # --oversize split: each sample's range in its source sample (docs/format.md "Pieces")
        self.has_pieces = "piece_begin" in names and "piece_end" in names
        self.mixture = self.manifest.get("mixture") if "source" in names else None
        self.source_names = [str(src["name"]) for src in self.mixture["sources"]] if self.mixture else None
        held = self.manifest.get("held_out") if "source" in names else None
        if held and self.source_names is None:  # a mixture's held-out plan: micro-batches by source, no blend
            self.source_names = [str(src["name"]) for src in held["sources"]]
        # int32 when the input's row count allows it, else int64 (docs/format.md); the manifest says which
        widths = {"list<item: int32>": np.dtype(np.int32), "list<item: int64>": np.dtype(np.int64)}
        width = widths.get(schema["sample_ids"])
        if width is None:
            raise SortpackError(f"{self.path}: the manifest's schema gives sample_ids as {schema['sample_ids']!r}, "
                                f"not {' or '.join(widths)}")
        self.id_dtype = width
        self._source_rows = int((self.manifest.get("source") or {}).get("num_rows", self.num_samples))
        self._stored: StoredData | None = None
        if self.verify == "full":
            for k in range(len(entries)):
                self._shard(k)  # hashed and checked now: a damaged index fails before training starts
            if self.manifest.get("data"):
                self.stored.verify_all()

    @property
    def stored(self):
        """Return the index's ``StoredData`` (built with ``--store``/``--store-tokens``), or None."""
        if self._stored is None and self.manifest.get("data"):
            from .stored import StoredData

            self._stored = StoredData(self)
        return self._stored

    def _shard(self, k: int):
        batch = self._shards[k]
        if batch is None:
            entry = self._entries[k]
            self.check_manifest()
            known = self._watch.opening(k)  # what is hashed and mapped next is this file
            ids = self.verify != "structure"
            if ids:  # the ids decide what trains: a flipped bit must not turn into a duplicate sample
                check_sha256(member_path(self.path, entry["file"]), entry)
            batch = open_shard(self.path, entry, self.manifest.get("schema"))
            check_index_shard(self.path / entry["file"], batch, entry, self._source_rows, ids=ids)
            self._watch.mapped(k, known)
            self._shards[k] = batch
        return batch

    def check_manifest(self) -> None:
        """Raise ``SortpackError`` if the manifest is no longer the one this index was opened with (one stat)."""
        check_unchanged(str(self.path / "manifest.json"), self._manifest_identity)

    def __reduce__(self):
        # a worker re-opens at the same level, but never re-hashes the data: the opener did
        return (PackedIndex, (str(self.path), "index" if self.verify == "full" else self.verify))

    def __repr__(self) -> str:
        return (f"PackedIndex({str(self.path)!r}, microbatches={self.num_microbatches}, "
                f"samples={self.num_samples})")

    def __len__(self) -> int:
        return self.num_microbatches

    @property
    def content_hash(self) -> str:
        """Return the manifest's content hash (identifies the index's contents)."""
        return str(self.manifest.get("content_hash", ""))

    # --- zero-copy views -----------------------------------------------------------
    def _view(self, k: int, name: str) -> np.ndarray:
        key = (k, name)
        view: Any = self._views.get(key)
        if view is None:
            col = self._shard(k).column(name)
            if name in ("sample_ids", "row_splits", "piece_begin", "piece_end"):
                view = (col.offsets.to_numpy(zero_copy_only=True), col.values.to_numpy(zero_copy_only=True))
            else:
                view = col.to_numpy(zero_copy_only=True)
            self._views[key] = view
        else:  # a view into the mapped shard: a file that shrank would be a bus error, not an error
            self._watch.fresh(k)
        return view

    def _locate(self, i: int) -> tuple[int, int]:
        if not 0 <= i < self.num_microbatches:
            raise IndexError(f"micro-batch {i} out of range [0, {self.num_microbatches})")
        k = bisect.bisect_right(self._firsts, i) - 1
        return k, i - self._firsts[k]

    def _list_item(self, name: str, i: int) -> np.ndarray:
        k, j = self._locate(int(i))
        offsets, values = self._view(k, name)
        return values[offsets[j]:offsets[j + 1]]

    def microbatch(self, i: int) -> np.ndarray:
        """Return the sample ids (int64, read-only) of micro-batch ``i``.

        A zero-copy view of an int64 index; a small copy (one micro-batch) of an int32 one.
        """
        ids = self._list_item("sample_ids", i)
        if ids.dtype != np.int64:
            ids = ids.astype(np.int64)
            ids.flags.writeable = False
        return ids

    def stored_ids(self, i: int) -> np.ndarray:
        """Return the sample ids of micro-batch ``i`` as the shard stores them (int32 or int64, a read-only view)."""
        return self._list_item("sample_ids", i)

    def stored_ids_at(self, i: int) -> tuple[np.ndarray, int]:
        """Return ``stored_ids(i)`` and the data address of that view (what the collate kernels read, looked up once).

        The shard's ids lie in one mapped array whose address is found once; a micro-batch's
        address is an offset into it, so no array interface is built per micro-batch.
        """
        k, j = self._locate(int(i))
        got = self._id_views.get(k)
        if got is None:
            offsets, values = self._view(k, "sample_ids")
            got = self._id_views[k] = (offsets, values, values.__array_interface__["data"][0])
        else:
            self._watch.fresh(k)
        offsets, values, at = got
        start = offsets.item(j)
        return values[start:offsets.item(j + 1)], at + start * values.itemsize

    def all_sample_ids(self) -> np.ndarray:
        """Return every micro-batch's sample ids one after another, in plan order (int64, a new array)."""
        parts = []
        for k in range(len(self._shards)):
            offsets, values = self._view(k, "sample_ids")
            parts.append(values[offsets[0]:offsets[-1]])
        return np.concatenate(parts).astype(np.int64, copy=False) if parts else np.zeros(0, np.int64)

    def find_samples(self, sample_ids) -> SampleHits:
        """Return the micro-batch, place in it and sample id of every occurrence of the given ids, in plan order.

        One vectorised pass over each shard's mapped ids (no per-micro-batch Python loop);
        an id the plan holds twice (a repeated mixture source) is found twice, one it does
        not hold not at all.
        """
        want = np.unique(np.asarray(sample_ids, dtype=np.int64))
        mbs, places, found = [], [], []
        for k in range(len(self._shards) if want.size else 0):
            offsets, values = self._view(k, "sample_ids")
            hit = np.flatnonzero(np.isin(values[offsets[0]:offsets[-1]], want)) + int(offsets[0])
            if hit.size:
                j = np.searchsorted(offsets, hit, side="right") - 1
                mbs.append(j + self._firsts[k])
                places.append(hit - offsets[j])
                found.append(values[hit])
        if not mbs:
            return SampleHits(*(np.zeros(0, dtype=np.int64) for _ in range(3)))
        return SampleHits(*(np.concatenate(p).astype(np.int64) for p in (mbs, places, found)))

    def row_splits(self, i: int) -> np.ndarray | None:
        """Return the offsets of micro-batch ``i``'s packed rows into its sample ids (None without rows)."""
        return self._list_item("row_splits", i) if self.has_rows else None

    def piece_ranges(self, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Return ``(begin, end)`` of micro-batch ``i``'s samples in their source samples (None: no sample was split).

        A sample ``--oversize split`` cut holds units ``[begin, end)`` of its source sample (token
        ids under ``--size tokens``, characters or list elements under ``length``); a whole one
        ``[0, size)``.
        """
        if not self.has_pieces:
            return None
        return self._list_item("piece_begin", i), self._list_item("piece_end", i)

    def record(self, i: int) -> Record:
        """Return micro-batch ``i``'s ``Record``: sample ids, batch_size, padded_size, row_splits or None."""
        k, j = self._locate(int(i))
        views = self._records.get(k)
        if views is None:  # the shard's columns a record reads, looked up once
            views = self._records[k] = (*self._view(k, "sample_ids"), self._view(k, "batch_size"),
                                        self._view(k, "padded_size"))
        else:
            self._watch.fresh(k)
        offsets, values, bs, ps = views
        splits = None
        if self.has_rows:
            so, sv = self._view(k, "row_splits")
            splits = sv[so[j]:so[j + 1]].tolist()
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (a third of record's cost:
        # the sampler calls it for every micro-batch it hands out)
        return _new_record(Record, (values[offsets[j]:offsets[j + 1]].tolist(), int(bs[j]), int(ps[j]), splits))

    def records(self, mbs) -> list[Record]:
        """Return the ``Record`` of each micro-batch in ``mbs`` (as ``record`` gives it), read in one vectorised pass.

        One lookup and one check per shard the micro-batches lie in, one ``tolist`` of all their
        ids: the sampler reads a chunk of steps' micro-batches at a time.
        """
        return [_new_record(Record, r) for r in zip(*self.record_lists(mbs))]

    def record_lists(self, mbs) -> tuple[list, list, list, list]:
        """Return ``records(mbs)`` as four lists: sample ids, batch sizes, padded sizes, row splits (or Nones)."""
        mbs = np.asarray(mbs, dtype=np.int64).reshape(-1)
        n = len(mbs)
        if n and (int(mbs.min()) < 0 or int(mbs.max()) >= self.num_microbatches):
            bad = int(mbs[(mbs < 0) | (mbs >= self.num_microbatches)][0])
            raise IndexError(f"micro-batch {bad} out of range [0, {self.num_microbatches})")
        ids: list = [None] * n
        bs = np.zeros(n, dtype=np.int64)
        ps = np.zeros(n, dtype=np.int64)
        splits: list = [None] * n
        whole = len(self._firsts) == 1  # one shard: every micro-batch, no grouping
        shard = np.zeros(0, dtype=np.int64) if whole else np.searchsorted(self._starts, mbs, side="right") - 1
        for k in [0] if whole else np.unique(shard).tolist():
            sel = np.arange(n) if whole else np.flatnonzero(shard == k)
            j = mbs[sel] - self._firsts[k]
            views = self._records.get(k)
            if views is None:
                views = self._records[k] = (*self._view(k, "sample_ids"), self._view(k, "batch_size"),
                                            self._view(k, "padded_size"))
            else:
                self._watch.fresh(k)
            offsets, values, bsv, psv = views
            bs[sel], ps[sel] = bsv[j], psv[j]
            if whole:
                ids = _ragged_lists(offsets, values, j)
                if self.has_rows:
                    so, sv = self._view(k, "row_splits")
                    splits = _ragged_lists(so, sv, j)
                continue
            slots = sel.tolist()
            for slot, part in zip(slots, _ragged_lists(offsets, values, j)):
                ids[slot] = part
            if self.has_rows:
                so, sv = self._view(k, "row_splits")
                for slot, part in zip(slots, _ragged_lists(so, sv, j)):
                    splits[slot] = part
        return ids, bs.tolist(), ps.tolist(), splits

    def shape(self, i: int) -> tuple[int, int]:
        """Return ``(batch_size, padded_size)`` of micro-batch ``i``."""
        k, j = self._locate(int(i))
        return int(self._view(k, "batch_size")[j]), int(self._view(k, "padded_size")[j])

    # --- column access ----------------------------------------------------------------
    def __getitem__(self, name: str) -> np.ndarray:
        """Return a whole per-micro-batch column (read and cached on first use)."""
        if name not in SCALAR_COLUMNS and name not in self.sum_columns:
            known = ", ".join(SCALAR_COLUMNS + self.sum_columns)
            raise KeyError(f"{name!r} is not a scalar column of the index ({known})")
        if name == "source" and self.source_names is None:
            raise KeyError("'source' is a column of mixture plans only (sortpack run --mixture) and their held-out "
                           "plans")
        col = self._columns.get(name)
        if col is None:
            parts = [self._view(k, name) for k in range(len(self._shards))]
            col = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            col.flags.writeable = False
            self._columns[name] = col
        return col

    def take(self, name: str, positions) -> np.ndarray:
        """Return column ``name`` at the given micro-batch positions, reading only those rows."""
        positions = np.asarray(positions, dtype=np.int64)
        if name in self._columns:
            return self._columns[name][positions]
        if positions.size == 0:
            return self._view(0, name)[:0].copy() if self._shards else np.zeros(0, dtype=np.int64)
        shard = np.searchsorted(self._starts, positions, side="right") - 1
        lo, hi = int(shard.min()), int(shard.max())
        if lo == hi:
            return self._view(lo, name)[positions - self._firsts[lo]]
        out = np.empty(positions.shape, dtype=self._view(lo, name).dtype)
        for k in np.unique(shard):
            sel = shard == k
            out[sel] = self._view(int(k), name)[positions[sel] - self._firsts[k]]
        return out

    def range_sum(self, name: str, start: int, stop: int) -> int:
        """Return the sum of column ``name`` over micro-batches ``[start, stop)``."""
        if not 0 <= start <= stop <= self.num_microbatches:
            raise IndexError(f"range [{start}, {stop}) outside [0, {self.num_microbatches}]")
        k = bisect.bisect_right(self._firsts, start) - 1
        if stop <= self._starts[k + 1]:  # one shard: the usual case
            first = self._firsts[k]
            part = self._view(k, name)[start - first:stop - first]
            # numpy's reduction has a fixed cost of ~1 us; short steps sum faster in Python
            return sum(part.tolist()) if len(part) <= 32 else int(part.sum())
        total = 0
        while start < stop:
            first = self._firsts[k]
            end = min(stop, int(self._starts[k + 1]))
            total += int(self._view(k, name)[start - first:end - first].sum())
            start, k = end, k + 1
        return total
