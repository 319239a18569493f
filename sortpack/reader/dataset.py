"""``SourceDataset``: the input rows of an index, by global sample id (map-style, no torch needed)."""
from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import SortpackError
from ..format import read_manifest
from ..format.mapped import guard
from ..inputs.discover import expand_inputs
from ..inputs.formats import open_source, read_units
from ..inputs.locations import with_locations
from ..inputs.objects import is_url, size_of
from ..inputs.renames import as_plan_names, manifest_renames, read_names
from ..inputs.size_kinds import size_kind
from ..inputs.source_file import SourceFile
from .index import PackedIndex
from .lazy_rows import TableSamples
from .megatron import megatron_rows
from .microbatch import MicroBatch, Samples
from .tokens import TokenCache


class InputFile(NamedTuple):
    """One input file of a ``SourceDataset``, checked against the index: its reader and where its units start."""

    source: SourceFile
    unit_starts: np.ndarray  # the row where each unit (row group, record batch) starts, and the row count last


class SourceDataset:
    """A map-style dataset over an index's input files: item ``i`` is the row of sample id ``i``.

    ``source`` is a sortpack directory (its manifest's ``source.files``), a ``PackedIndex``,
    a list of ``source.files`` entries, or input paths as given to ``sortpack analyze``.
    Rows are read a unit at a time (Parquet row group, Arrow record batch, whole JSONL/CSV
    file); Arrow IPC files are memory-mapped. The last ``cache_units`` units stay decoded
    per process, so a sorted micro-batch usually costs one or two unit reads.
    ``transform`` maps each row (a dict of ``columns``) to the item returned.

    An index built with ``--store``/``--store-tokens`` holds its rows in plan order: when
    ``columns`` is None or names stored columns only, a micro-batch from the sampler is one
    contiguous zero-copy slice of the memory-mapped data shards (``Samples.table``), and
    the input files are not opened at all. ``stored=False`` reads the input files anyway.

    Parameters
    ----------
    source : str, os.PathLike, PackedIndex or list
        A sortpack directory, a ``PackedIndex``, ``source.files`` entries, or input paths.
    columns : list of str, optional
        The columns each row holds (default: all).
    transform : callable, optional
        Maps a row (a dict) to the item returned (module level, so workers can pickle it).
    cache_units : int
        Decoded units kept per process (at least 1).
    check_bytes : bool
        Refuse an input file whose size differs from the one the index was built from.
    split : str, optional
        The split of a Hugging Face DatasetDict directory given as input paths.
    stored : bool
        Read an index's stored data shards when it has them (default True).

    Examples
    --------
    The rows of ``plan/`` (``PackedIndex``'s example), by sample id or a micro-batch at a time:

    >>> from sortpack.reader import PackedSampler, SourceDataset
    >>> data = SourceDataset("plan/")
    >>> data[3]
    {'text': 'abcdef'}
    >>> mb = next(iter(PackedSampler("plan/", rank=1, world_size=2)))
    >>> [row["text"] for row in data.__getitems__(mb)]  # one zero-copy slice of the stored text
    ['abcdef', 'abcdefg', 'abcdefgh']
    """

    def __init__(self, source, columns: list[str] | None = None, transform=None, cache_units: int = 8,
                 check_bytes: bool = True, split: str | None = None, stored: bool = True):
        self.stored = _stored_data(source, columns) if stored else None
        self.index = self.stored.index if self.stored is not None else None
        self.pieces = _piece_plan(self.index if self.index is not None else source)
        self.files = _source_files(self.index if self.index is not None else source, split)
        # a mixture source's own column comes under the plan's column name, as stored data has it
        self._renames = _renames(self.index if self.index is not None else source)
        # what the plan's sizes count: under "tokens" the collate helpers check tokenize= against it
        self.size_unit = _size_unit(self.index if self.index is not None else source)
        self.columns = list(columns) if columns is not None else None
        self.transform = transform
        self.cache_units = max(1, int(cache_units))
        self.check_bytes = check_bytes
        rows = np.array([int(f["rows"]) for f in self.files], dtype=np.int64)
        self._file_starts = np.concatenate(([0], np.cumsum(rows)))
        self._units: dict[int, InputFile] = {}
        self._cache: OrderedDict = OrderedDict()
        self._warm = None  # a UnitWarmer's units read ahead (Prefetched over a plan without --store)
        self._token_cache = TokenCache()  # split documents' token ids, for the collate's tokenize=
        # a plan over Megatron datasets: a micro-batch's ids gathered from the mapped .bin (reader.megatron)
        self._megatron = None if self.stored is not None else megatron_rows(
            self.index if self.index is not None else source, self.files, self.columns)

    def __len__(self) -> int:
        """Return the number of samples (rows over all files)."""
        return int(self._file_starts[-1])

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cache"] = OrderedDict()  # decoded units stay with the process that read them
        state["_warm"] = None
        state["_token_cache"] = TokenCache()
        return state

    # --- lookup ---------------------------------------------------------------------------
    def _file(self, k: int) -> InputFile:
        got = self._units.get(k)
        if got is None:
            entry = self.files[k]
            path = entry["path"]
            if not is_url(path) and not os.path.isfile(path):  # an object: open_source's HEAD says
                raise SortpackError(f"{path}: input file of the index is missing")
            if self.check_bytes and "bytes" in entry and size_of(path) != int(entry["bytes"]):
                raise SortpackError(f"{path}: {size_of(path)} bytes, the index was built from "
                                    f"{entry['bytes']} bytes (the file changed)")
            src = open_source(path, entry["format"])
            if not is_url(path):  # Arrow inputs are memory-mapped: a file that shrinks later is one line
                guard(path)
            unit_rows = src.unit_rows if src.unit_rows is not None else [int(entry["rows"])]
            if sum(unit_rows) != int(entry["rows"]):
                raise SortpackError(f"{path}: {sum(unit_rows)} rows, the index was built from "
                                    f"{entry['rows']}")
            got = InputFile(src, np.concatenate(([0], np.cumsum(unit_rows))).astype(np.int64))
            self._units[k] = got
        return got

    def units_of(self, ids) -> list[tuple[int, int]]:
        """Return the (file, unit) pairs that hold the rows of sample ids ``ids``, in order of first use.

        None for Megatron datasets: a micro-batch is gathered from the mapped ``.bin``, no unit read ahead.
        """
        if self._megatron is not None:
            return []
        arr, files = self._where(np.asarray(list(ids), dtype=np.int64))
        out: dict[tuple[int, int], None] = {}
        for k, local in zip(files.tolist(), (arr - self._file_starts[files]).tolist()):
            starts = self._file(k).unit_starts
            out[(k, int(np.searchsorted(starts, local, side="right")) - 1)] = None
        return list(out)

    def read_unit(self, k: int, u: int):
        """Return unit ``u`` of file ``k`` decoded (``columns`` only), read now and not cached."""
        rename = self._renames[k] if self._renames else None
        table = read_units(self._file(k).source, u, u + 1, read_names(self.columns, rename))
        if rename is not None:
            keep, names = as_plan_names(table.column_names, rename)
            table = table.select(keep).rename_columns(names)
        return table

    def _unit(self, k: int, u: int):
        key = (k, u)
        # a unit read ahead is taken even when the cache holds it too, so the warmer's store drains
        table = self._warm.take(key) if self._warm is not None else None
        if table is None:
            table = self._cache.get(key)
        if table is None:
            table = self.read_unit(k, u)
        self._cache[key] = table
        self._cache.move_to_end(key)
        if len(self._cache) > self.cache_units:
            self._cache.popitem(last=False)
        return table

    def _where(self, ids: np.ndarray):
        n = len(self)
        ids = np.where(ids < 0, ids + n, ids)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise IndexError(f"sample id out of range [0, {n})")
        k = np.searchsorted(self._file_starts, ids, side="right") - 1
        return ids, k

    # --- access -------------------------------------------------------------------------------
    def __getitem__(self, i):
        """Return the row (dict of columns, or ``transform(row)``) of sample id ``i``."""
        return self.__getitems__([int(i)])[0]

    def __getitems__(self, ids) -> Samples:
        """Return the rows of many sample ids as ``Samples``, reading each needed unit once."""
        if self.stored is not None:
            return self._stored_items(ids)
        if self._megatron is not None:
            return self._megatron.samples(ids, ids if isinstance(ids, MicroBatch) else None, self._ranges(ids),
                                          self.transform)
        arr, files = self._where(np.asarray(list(ids), dtype=np.int64))
        ranges = self._ranges(ids)
        kind = size_kind(self.pieces.unit) if self.pieces is not None else None
        cut = self.pieces.column if ranges is not None and self.pieces is not None \
            and kind is not None and kind.cuts_column else None
        by_bytes = kind is not None and kind.ranges == "bytes"
        out = [None] * len(arr)
        for k in np.unique(files).tolist():
            sel = np.flatnonzero(files == k)
            local = arr[sel] - self._file_starts[k]
            starts = self._file(k).unit_starts
            units = np.searchsorted(starts, local, side="right") - 1
            for u in np.unique(units).tolist():
                pick = units == u
                rows = self._unit(k, u).take(local[pick] - starts[u]).to_pylist()
                for slot, row in zip(sel[pick].tolist(), rows):
                    if cut is not None and ranges is not None and row.get(cut) is not None:
                        row[cut] = _cut_value(row[cut], ranges[0][slot], ranges[1][slot], by_bytes)
                    out[slot] = row if self.transform is None else self.transform(row)
        samples = Samples(out, ids if isinstance(ids, MicroBatch) else None, token_ranges=self._token_ranges(ranges),
                          size_unit=self.size_unit)
        if samples.token_ranges is not None:
            samples.token_cache = self._token_cache
        return samples

    def _stored_items(self, ids) -> Samples:
        stored = self.stored
        assert stored is not None
        mb = ids if isinstance(ids, MicroBatch) else None
        i, known = self._whole_microbatch(mb) if mb is not None else (-1, None)
        if i >= 0:
            # the rows become Python objects only if something asks for them, and the Arrow slice
            # only if something needs it: the collate helpers read stored token ids from the shard
            assert self.index is not None and known is not None
            # checked now, where the fetch runs: a shard that changed is an error here, in a DataLoader
            # worker's fetch too, not when the rows are built (pickled, in a thread that cannot raise)
            where = stored.check_microbatch(i)
            samples = TableSamples.of_stored(mb, self.transform, known, (stored, i, self.columns, where),
                                             self.size_unit)
            if self.pieces is None:  # no split samples: no ranges to cut
                return samples
        else:
            table = stored.take(np.asarray(list(ids), dtype=np.int64))
            if self.columns is not None:
                table = table.select(self.columns)
            samples = TableSamples(table, mb, self.transform)
        # stored columns are cut to the pieces already, except text under --size tokens
        samples.token_ranges = self._token_ranges(self._ranges(ids))
        samples.size_unit = self.size_unit
        if samples.token_ranges is not None:
            samples.token_cache = self._token_cache
        return samples

    def _whole_microbatch(self, mb: MicroBatch) -> tuple[int, tuple[np.ndarray, int] | None]:
        """Return ``(mb.microbatch, (its stored ids, their address))`` if ``mb`` holds its micro-batch's ids unchanged,
        else (-1, None).

        A whole micro-batch is one contiguous slice of the stored data. The ids are compared as
        Python ints, no array built; a micro-batch that lost skipped samples is not whole.
        """
        index = self.index
        assert index is not None
        i = mb.microbatch
        if not 0 <= i < index.num_microbatches:
            return -1, None
        known = index.stored_ids_at(i)
        ids = known[0]
        return (i, known) if len(ids) == len(mb) and ids.tolist() == mb else (-1, None)

    def _ranges(self, ids) -> tuple[np.ndarray, np.ndarray] | None:
        """Return ``(begin, end)`` of a sampler's micro-batch's samples in a split plan (None: whole samples)."""
        if self.pieces is None or not isinstance(ids, MicroBatch) or ids.microbatch < 0:
            return None
        got = self.pieces.plan.piece_ranges(ids.microbatch)
        if got is None:
            return None
        begin, end = got
        if len(begin) != len(ids):  # samples the loop skips (reader.skips) left the micro-batch
            keep = np.isin(self.pieces.plan.microbatch(ids.microbatch), np.asarray(list(ids), dtype=np.int64))
            begin, end = begin[keep], end[keep]
        return begin, end

    def _token_ranges(self, ranges):
        """Return the ranges the collate helpers apply after tokenize: a ``--size tokens`` plan's only."""
        kind = size_kind(self.pieces.unit) if self.pieces is not None else None
        return ranges if ranges is not None and kind is not None and kind.ranges == "tokens" else None


class PiecePlan(NamedTuple):
    """A split plan's index and what its ranges count: ``unit`` (the size kind, ``SizeKind.ranges``) of ``column``."""

    plan: PackedIndex
    unit: str
    column: str | None


def _piece_plan(source) -> PiecePlan | None:
    """Return the ``PiecePlan`` of an index that ``--oversize split`` cut samples of (None otherwise)."""
    index = None
    if isinstance(source, PackedIndex):
        index = source
    elif isinstance(source, (str, os.PathLike)) and (Path(source) / "manifest.json").is_file():
        manifest = read_manifest(source)
        if manifest.get("_kind") == "index" and "piece_begin" in (manifest.get("schema") or {}):
            index = PackedIndex(source)
    if index is None or not index.has_pieces:
        return None
    options = index.manifest.get("options") or {}
    return PiecePlan(index, str(options.get("size")), options.get("column"))


def _cut_value(value, begin: int, end: int, by_bytes: bool = False):
    """Return a row's value cut to ``[begin, end)`` (characters of a text, elements of a list, bytes).

    ``by_bytes`` (``--size bytes``): a text's UTF-8 bytes, which the plan cut between characters.
    """
    if by_bytes and isinstance(value, str):
        return value.encode("utf-8")[int(begin):int(end)].decode("utf-8")
    return value[int(begin):int(end)]


def _stored_data(source, columns):
    if isinstance(source, PackedIndex):
        index = source
    elif isinstance(source, (str, os.PathLike)) and (Path(source) / "manifest.json").is_file():
        manifest = read_manifest(source)
        if manifest.get("_kind") != "index" or not manifest.get("data"):
            return None
        index = PackedIndex(source)
    else:
        return None
    stored = index.stored
    if stored is None or (columns is not None and not set(columns) <= set(stored.columns)):
        return None
    return stored


def _size_unit(source) -> str | None:
    """Return what an index's sizes count (its ``options.size``), or None for input paths and other directories."""
    if isinstance(source, PackedIndex):
        manifest = source.manifest
    elif isinstance(source, (str, os.PathLike)) and (Path(source) / "manifest.json").is_file():
        manifest = read_manifest(source)
    else:
        return None
    if manifest.get("_kind") not in (None, "index"):
        return None
    size = (manifest.get("options") or {}).get("size")
    return str(size) if size is not None else None


def _renames(source) -> list[dict[str, str] | None] | None:
    """Return per input file ``{plan column: input column}`` of a mixture index (None: names agree)."""
    if isinstance(source, PackedIndex):
        return manifest_renames(source.manifest)
    if isinstance(source, (str, os.PathLike)) and (Path(source) / "manifest.json").is_file():
        return manifest_renames(read_manifest(source))
    return None


def _source_files(source, split: str | None = None) -> list[dict]:
    if isinstance(source, PackedIndex):
        return with_locations(source.manifest)
    if isinstance(source, (str, os.PathLike)) and (Path(source) / "manifest.json").is_file():
        return with_locations(read_manifest(source))
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if items and all(isinstance(f, dict) for f in items):
        return [f for f in items if isinstance(f, dict)]
    files = []
    for path, fmt in expand_inputs([str(p) for p in items], split=split):
        src = open_source(path, fmt)
        if src.unit_rows is not None:
            rows = sum(src.unit_rows)
        else:  # JSONL, CSV and Arrow streams do not say their row count without a read
            rows = read_units(src, 0, 1, None).num_rows
        files.append(src.fingerprint(rows))
    return files
