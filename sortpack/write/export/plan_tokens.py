"""A plan's samples and their token ids in plan order, a range of micro-batches at a time: what an export writes.

Plan order is the index's: micro-batches in order, the samples of each in order (the rows of
a ``--rows`` plan one after another). A sample's ids come from the plan's stored data (a
token-id column: ``--store-tokens``, or ``--store`` of a list-of-integers column) or, for a
plan over Megatron datasets, from their ``.bin`` (``inputs.megatron_data``), each cut to its
piece (``--oversize split``) or to the budget (``--oversize truncate``). A plan with neither
is refused in one line. No MPI here: ``megatron_out`` and ``packed_parquet`` deal the ranges.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from ...errors import SortpackError
from ...format import read_manifest
from ...format.shards import check_shards, read_rows
from ...inputs.fingerprints import check_unchanged
from ...inputs.locations import with_locations
from ...inputs.megatron import TOKENS, MegatronFormat
from ...inputs.megatron_data import Gathered, Into, MegatronData, Pair, companion, gather_many, open_data
from ...stages.pack import truncate_length
from ...stages.plan_options import PlanOptions

LABELS = "labels"  # the stored labels column of a fine-tuning plan (write.store.options.LABELS_COLUMN)


class Chunk(NamedTuple):
    """Micro-batches ``[lo, hi)`` of a plan: their samples' ids in plan order.

    ``values``/``labels`` are the token ids and labels one after another (the source's dtype,
    labels None without them), ``offsets`` where each sample starts (from 0, one per sample
    and the end), ``num_samples`` the samples of each micro-batch, ``row_sizes`` the samples
    of each packed row in order (a ``--rows`` plan; else None).
    """

    values: np.ndarray
    labels: np.ndarray | None
    offsets: np.ndarray
    num_samples: np.ndarray
    row_sizes: np.ndarray | None


@dataclass
class PlanTokens:
    """An index directory whose samples' token ids an export reads (``open_plan`` checks it can)."""

    path: Path
    manifest: dict
    column: str | None  # the stored token-id column (None: the ids come from Megatron datasets)
    labels: str | None  # the stored labels column, or the Megatron labels SPEC; None without labels
    cap: int  # --oversize truncate: the length a sample is cut to (0: none)
    _pairs: dict[int, Pair] = field(default_factory=dict)
    _held: dict[str, tuple[int, int, pa.Table]] = field(default_factory=dict)  # rows read once, sliced per chunk

    @property
    def num_microbatches(self) -> int:
        """Return the plan's micro-batch count."""
        return int(self.manifest["num_microbatches"])

    @property
    def has_rows(self) -> bool:
        """Return whether the plan packs rows (``--rows``)."""
        return "row_splits" in (self.manifest.get("schema") or {})

    def hold(self, lo: int, hi: int, first_row: int, rows: int) -> None:
        """Open micro-batches ``[lo, hi)`` and their stored rows from ``first_row`` once (mapped, not read): a
        chunk's read is then a slice, not an open of every shard it touches."""
        self._held["index"] = (lo, hi, read_rows(self.path, self.manifest, lo, hi, self._index_columns()))
        if self.column is not None:
            self._held["data"] = (first_row, first_row + rows, read_rows(self.path, self._data_manifest(), first_row,
                                                                         first_row + rows, self._data_columns()))

    def _index_columns(self) -> list[str]:
        return ["sample_ids", "num_samples"] + [c for c in ("row_splits", "piece_begin", "piece_end")
                                                if c in (self.manifest.get("schema") or {})]

    def _data_columns(self) -> list[str]:
        assert self.column is not None
        return [self.column] + ([self.labels] if self.labels is not None else [])

    def _data_manifest(self) -> dict:
        data = self.manifest["data"]
        return {**self.manifest, "shards": data["shards"], "schema": data.get("schema")}

    def _rows(self, what: str, lo: int, hi: int) -> pa.Table:
        """Return rows ``[lo, hi)`` of the index (``what`` "index") or the stored data ("data"): held, or read now."""
        held = self._held.get(what)
        if held is not None and held[0] <= lo and hi <= held[1]:
            return held[2].slice(lo - held[0], hi - lo)
        if what == "index":
            return read_rows(self.path, self.manifest, lo, hi, self._index_columns())
        return read_rows(self.path, self._data_manifest(), lo, hi, self._data_columns())

    def _index(self, lo: int, hi: int) -> pa.Table:
        return self._rows("index", lo, hi)

    def sizes(self, lo: int, hi: int) -> np.ndarray:
        """Return the samples of each micro-batch of ``[lo, hi)`` (int64)."""
        return read_rows(self.path, self.manifest, lo, hi, ["num_samples"]).column(0).to_numpy().astype(np.int64)

    def check(self, lo: int, hi: int) -> None:
        """Raise unless the index shards holding micro-batches ``[lo, hi)`` hash as the manifest records.

        As the reader's default level (``PackedIndex(verify="index")``): the ids decide what is
        written, so their shards are hashed; stored data shards are checked for their structure
        and rows when opened, not hashed (``sortpack verify`` hashes everything).
        """
        check_shards(self.path, self.manifest, lo, hi)

    def read(self, lo: int, hi: int, first_row: int, values: bool = True, into: Into | None = None) -> Chunk:
        """Return the ``Chunk`` of micro-batches ``[lo, hi)``, whose first sample is stored row ``first_row``.

        ``values=False``: the lengths only (``offsets``; ``values`` and ``labels`` empty), read
        from the offsets and the ``.idx`` without touching a token. ``into(n)``: the arrays
        the ``n`` ids and labels are written into (an export's mapped output, in its dtypes),
        with no copy between (then the chunk's ``values`` and ``labels``).
        """
        index = self._index(lo, hi)
        num_samples = index.column("num_samples").to_numpy().astype(np.int64)
        row_sizes = _row_sizes(index) if self.has_rows else None
        pieces = (_flat(index, "piece_begin"), _flat(index, "piece_end")) if "piece_begin" in index.schema.names \
            else None
        if self.column is not None:
            ids, labels, offsets = self._stored(first_row, int(num_samples.sum()), pieces, values)
            if into is not None and values:
                ids, labels = _copied(into, ids, labels)
        else:
            ids, labels, offsets = self._megatron(_flat(index, "sample_ids"), pieces, values, into)
        return Chunk(ids, labels, offsets, num_samples, row_sizes)

    def _stored(self, first_row: int, rows: int, pieces, values: bool) -> Gathered:
        """Return (values, labels, offsets) of stored rows ``[first_row, first_row + rows)``, cut as planned."""
        assert self.column is not None
        data = self.manifest["data"]
        table = self._rows("data", first_row, first_row + rows)
        col = table.column(self.column).combine_chunks()
        offsets = col.offsets.to_numpy().astype(np.int64)
        flat = col.values.to_numpy() if values else np.zeros(0, np.int32)
        lab = table.column(self.labels).combine_chunks().values.to_numpy() if self.labels and values else None
        begin = np.zeros(rows, np.int64)
        end = np.diff(offsets)
        if pieces is not None and self.column not in (data.get("pieces") or []):  # stored whole: cut here
            begin, end = pieces
        if self.cap:
            end = np.minimum(end, begin + self.cap)
        return _cut(flat, lab, offsets, (begin, end), values)

    def _megatron(self, ids: np.ndarray, pieces, values: bool, into: Into | None = None) -> Gathered:
        """Return (values, labels, offsets) of sample ids ``ids`` from the plan's Megatron datasets."""
        files = with_locations(self.manifest)
        starts = np.concatenate(([0], np.cumsum([int(f["rows"]) for f in files]))).astype(np.int64)
        which = np.searchsorted(starts, ids, side="right") - 1
        pairs = {k: self._pair(k, files[k]) for k in np.unique(which).tolist()}
        lengths = np.zeros(len(ids), np.int64)
        for k, (data, _) in pairs.items():
            sel = which == k
            lengths[sel] = data.index.lengths[ids[sel] - starts[k]]
        begin, end = pieces if pieces is not None else (np.zeros(len(ids), np.int64), lengths)
        if self.cap:
            end = np.minimum(end, begin + self.cap)
        if not values:
            offsets = np.zeros(len(ids) + 1, np.int64)
            np.cumsum(np.maximum(end - begin, 0), out=offsets[1:])
            return np.zeros(0, np.int32), None, offsets
        return gather_many(pairs, starts, ids, (begin, end), into)

    def _pair(self, k: int, entry: dict) -> Pair:
        """Return Megatron dataset ``k`` of the plan and its labels companion, checked unchanged since the plan."""
        got = self._pairs.get(k)
        if got is None:
            data = open_data(str(entry["path"]))
            check_unchanged(entry, _idx_bytes(data), data.num_sequences)
            got = self._pairs[k] = (data, companion(data, self.labels) if self.labels is not None else None)
        return got

    def source_dtypes(self) -> list[np.dtype] | None:
        """Return the dtypes the ids are read in (the Megatron datasets'), or None where stored data decides."""
        if self.column is not None:
            return None
        return [open_data(str(f["path"])).index.dtype for f in with_locations(self.manifest)]


def _copied(into: Into, values: np.ndarray, labels: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Return ``values`` and ``labels`` converted into the arrays ``into`` gives (one pass each)."""
    dst, lab_dst = into(len(values))
    np.copyto(dst, values, casting="unsafe")
    if lab_dst is not None and labels is not None:
        np.copyto(lab_dst, labels, casting="unsafe")
    return dst, lab_dst


def _idx_bytes(data: MegatronData) -> int:
    from ...inputs.objects import size_of

    return size_of(data.path)


def _flat(index: pa.Table, name: str) -> np.ndarray:
    """Return a list column of the index flattened (int64)."""
    col = index.column(name).combine_chunks()
    return col.flatten().to_numpy().astype(np.int64)


def _row_sizes(index: pa.Table) -> np.ndarray:
    """Return the samples of each packed row of the micro-batches, in order."""
    col = index.column("row_splits").combine_chunks()
    splits, offsets = col.flatten().to_numpy().astype(np.int64), col.offsets.to_numpy()
    sizes = np.diff(splits)
    # the splits of one micro-batch run from 0 to its sample count: drop the steps between micro-batches
    keep = np.ones(len(sizes), dtype=bool)
    keep[offsets[1:-1] - 1] = False
    return sizes[keep]


def _cut(values: np.ndarray, labels: np.ndarray | None, offsets: np.ndarray, ranges: tuple[np.ndarray, np.ndarray],
         read: bool) -> Gathered:
    """Return (values, labels, offsets) of each list ``values[offsets[i]:offsets[i + 1]]`` cut to ``ranges`` (its
    ``[begin, end)``)."""
    begin, end = ranges
    lengths = np.diff(offsets)
    lo = np.minimum(begin, lengths)
    hi = np.clip(end, lo, lengths)
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(hi - lo, out=out[1:])
    if not read or (np.array_equal(lo, np.zeros_like(lo)) and np.array_equal(hi, lengths)):
        base = int(offsets[0]) if len(offsets) else 0
        return values[base:base + int(out[-1])] if read else values, \
            None if labels is None else labels[base:base + int(out[-1])], out
    at = np.repeat(offsets[:-1] + lo - out[:-1], hi - lo) + np.arange(int(out[-1]))
    return values[at], None if labels is None else labels[at], out


def open_plan(path: str | Path) -> PlanTokens:
    """Return the ``PlanTokens`` of an index directory, or raise one line when its token ids cannot be read.

    The ids come from its stored data (a list-of-integers column: ``--store-tokens``'s
    ``input_ids``, or the ``--store``d plan column) or from its Megatron input datasets.
    """
    manifest = read_manifest(path, expect="index")
    options = PlanOptions.from_manifest(manifest["options"])
    popts = options.pack
    cap = truncate_length(popts) if popts is not None and popts.oversize == "truncate" else 0
    shape = options.analyze.shape
    data = manifest.get("data") or {}
    column = _stored_tokens(data, options.analyze.column)
    if column is not None:
        labels = LABELS if LABELS in data.get("columns", []) else None
        if shape is not None and labels is None:
            raise SortpackError(f"{path}: a fine-tuning plan whose stored data has no {LABELS!r} column (store them: "
                                "--store-tokens, or --store input_ids,labels)")
        return PlanTokens(Path(path), manifest, column, labels, cap)
    files = manifest["source"]["files"]
    if files and all(f.get("format") == MegatronFormat.name for f in files):
        return PlanTokens(Path(path), manifest, None, shape.stored_labels if shape is not None else None, cap)
    raise SortpackError(f"{path}: the plan stores no token ids and its inputs are not Megatron datasets; plan it with "
                        "--store-tokens (or --store of its token-id column) to export it")


def _stored_tokens(data: dict, column: str | None) -> str | None:
    """Return the stored column holding token ids (``--store-tokens``'s, else the plan's or ``input_ids``), or None."""
    if not data:
        return None
    if data.get("tokens"):
        return str(data["tokens"].get("column", TOKENS))
    schema = data.get("schema") or {}
    for name in (column, TOKENS):
        if name and name in data.get("columns", []) and _ids_type(schema.get(name)):
            return name
    return None


def _ids_type(text: str | None) -> bool:
    """Return whether a manifest's type string names a list of integers (``list<item: int32>``, ``large_list<...>``)."""
    return bool(text) and re.fullmatch(r"(large_)?list<\w+: u?int(8|16|32|64)>", str(text)) is not None
