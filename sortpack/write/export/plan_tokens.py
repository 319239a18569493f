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
from concurrent.futures import Future, ThreadPoolExecutor
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
from ...inputs.megatron_data import Gathered, MegatronData, Pair, companion, gather_many, open_data
from ...kernels.runs import Runs
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


class Located(NamedTuple):
    """Where a run of samples' ids and labels lie (``kernels.runs.Runs``, one run per sample in plan order).

    ``mapped`` False: a dataset lies behind a URL, its buffers are empty stand-ins; the
    counts hold (the samples' lengths), the values are ``PlanTokens.read``.
    """

    ids: Runs
    labels: Runs | None
    mapped: bool


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
    _digests: list[Future] = field(default_factory=list)  # the inputs' content checks, running beside the export

    @property
    def num_microbatches(self) -> int:
        """Return the plan's micro-batch count."""
        return int(self.manifest["num_microbatches"])

    @property
    def has_rows(self) -> bool:
        """Return whether the plan packs rows (``--rows``)."""
        return "row_splits" in (self.manifest.get("schema") or {})

    def hold(self, lo: int, hi: int) -> np.ndarray:
        """Open micro-batches ``[lo, hi)`` once (mapped, not read) and return their sample counts (int64): a chunk's
        read is then a slice, not an open of every shard it touches."""
        self._held["index"] = (lo, hi, read_rows(self.path, self.manifest, lo, hi, self._index_columns()))
        return self._index(lo, hi).column("num_samples").to_numpy().astype(np.int64)

    def hold_rows(self, first_row: int, rows: int) -> None:
        """Open the stored rows ``[first_row, first_row + rows)`` once (mapped, not read); none without stored ids."""
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

    def check(self, lo: int, hi: int) -> None:
        """Raise unless the index shards holding micro-batches ``[lo, hi)`` hash as the manifest records.

        As the reader's default level (``PackedIndex(verify="index")``): the ids decide what is
        written, so their shards are hashed; stored data shards are checked for their structure
        and rows when opened, not hashed (``sortpack verify`` hashes everything).
        """
        check_shards(self.path, self.manifest, lo, hi)

    def read(self, lo: int, hi: int, first_row: int) -> Chunk:
        """Return the ``Chunk`` of micro-batches ``[lo, hi)``, whose first sample is stored row ``first_row``."""
        index = self._index(lo, hi)
        num_samples = index.column("num_samples").to_numpy().astype(np.int64)
        row_sizes = _row_sizes(index) if self.has_rows else None
        pieces = _pieces(index)
        if self.column is not None:
            ids, labels, offsets = self._stored(first_row, int(num_samples.sum()), pieces)
        else:
            ids, labels, offsets = self._megatron(_flat(index, "sample_ids"), pieces)
        return Chunk(ids, labels, offsets, num_samples, row_sizes)

    def runs(self, lo: int, hi: int, first_row: int) -> Located:
        """Return where the ids and labels of micro-batches ``[lo, hi)``'s samples lie, in plan order (``Located``),
        whose first is stored row ``first_row``; no token is read.

        The same samples as ``read``, cut alike.
        """
        index = self._index(lo, hi)
        pieces = _pieces(index)
        if self.column is not None:
            rows = int(index.column("num_samples").to_numpy().sum())
            return self._stored_runs(self._rows("data", first_row, first_row + rows), pieces)
        return self._megatron_runs(_flat(index, "sample_ids"), pieces)

    def _stored(self, first_row: int, rows: int, pieces) -> Gathered:
        """Return (values, labels, offsets) of stored rows ``[first_row, first_row + rows)``, cut as planned."""
        assert self.column is not None
        table = self._rows("data", first_row, first_row + rows)
        col = table.column(self.column).combine_chunks()
        offsets = col.offsets.to_numpy().astype(np.int64)
        lab = table.column(self.labels).combine_chunks().values.to_numpy() if self.labels else None
        return _cut(col.values.to_numpy(), lab, offsets, self._stored_cut(np.diff(offsets), pieces))

    def _stored_cut(self, lengths: np.ndarray, pieces) -> tuple[np.ndarray, np.ndarray]:
        """Return each stored row's planned ``[begin, end)`` (uncut: what the pieces and the cap leave of it)."""
        begin, end = np.zeros(len(lengths), np.int64), lengths.astype(np.int64)
        if pieces is not None and self.column not in (self.manifest["data"].get("pieces") or []):  # stored whole
            begin, end = pieces
        if self.cap:
            end = np.minimum(end, begin + self.cap)
        return begin, end

    def _stored_runs(self, table: pa.Table, pieces) -> Located:
        """Return the ``Runs`` of the stored ids and labels of ``table``'s rows (one buffer per shard)."""
        assert self.column is not None
        parts = [_list_parts(c) for c in table.column(self.column).chunks]
        lengths = np.concatenate([np.diff(o) for o, _ in parts]) if parts else np.zeros(0, np.int64)
        lo, hi = _bounds(lengths, self._stored_cut(lengths, pieces))
        piece = np.repeat(np.arange(len(parts), dtype=np.int64), [len(o) - 1 for o, _ in parts])
        ids = _runs_of(parts, piece, lo, hi - lo)
        if self.labels is None:
            return Located(ids, None, True)
        labels = [_list_parts(c) for c in table.column(self.labels).chunks]
        if not all(np.array_equal(np.diff(a), np.diff(b)) for (a, _), (b, _) in zip(parts, labels)):
            raise SortpackError(f"{self.path}: stored {self.labels!r} lists whose lengths differ from their "
                                f"{self.column!r} lists (corrupt data)")
        return Located(ids, _runs_of(labels, piece, lo, hi - lo), True)

    def _megatron(self, ids: np.ndarray, pieces) -> Gathered:
        """Return (values, labels, offsets) of sample ids ``ids`` from the plan's Megatron datasets."""
        files, starts, which, pairs = self._datasets(ids)
        lengths = np.zeros(len(ids), np.int64)
        for k, (data, _) in pairs.items():
            sel = which == k
            lengths[sel] = data.index.lengths[ids[sel] - starts[k]]
        return gather_many(pairs, starts, ids, self._megatron_cut(lengths, pieces))

    def _megatron_cut(self, lengths: np.ndarray, pieces) -> tuple[np.ndarray, np.ndarray]:
        """Return each sample's planned ``[begin, end)`` (the piece, else the whole sequence; the cap applied)."""
        begin, end = pieces if pieces is not None else (np.zeros(len(lengths), np.int64), lengths)
        if self.cap:
            end = np.minimum(end, begin + self.cap)
        return begin, end

    def _datasets(self, ids: np.ndarray) -> tuple[list[dict], np.ndarray, np.ndarray, dict[int, Pair]]:
        """Return the plan's datasets, their first sample ids, each of ``ids``' dataset and the opened ones."""
        files = with_locations(self.manifest)
        starts = np.concatenate(([0], np.cumsum([int(f["rows"]) for f in files]))).astype(np.int64)
        which = np.zeros(len(ids), np.int64) if len(files) == 1 else np.searchsorted(starts, ids, side="right") - 1
        keys = [0] if len(files) == 1 else np.unique(which).tolist()
        return files, starts, which, {k: self._pair(k, files[k]) for k in keys}

    def _megatron_runs(self, ids: np.ndarray, pieces) -> Located:
        """Return where sample ids ``ids`` lie in the mapped ``.bin`` of the plan's Megatron datasets (and of their
        labels companions).

        Few arrays of the samples' count: at a few hundred tokens a sample, making each costs
        a fair part of what writing the tokens does.
        """
        _, starts, which, pairs = self._datasets(ids)
        keys = sorted(pairs)
        data = [pairs[k][0] for k in keys]
        labels = [pairs[k][1] for k in keys] if self.labels is not None else []
        mapped = not any(d.url for d in data + labels)  # type: ignore[union-attr]
        piece = np.searchsorted(keys, which) if len(keys) > 1 else None
        # each id's place in its dataset: also where this rank's samples all come from one dataset after the first
        local = ids - starts[which]
        # np.take: the .idx arrays lie unaligned after its 34-byte header, where fancy indexing is slow
        lengths = _taken([d.index.lengths for d in data], piece, local)
        at = _taken([d.index.pointers for d in data], piece, local)
        lab_at = _taken([d.index.pointers for d in labels], piece, local) if labels else None  # type: ignore
        if pieces is not None or self.cap:
            lo, hi = _bounds(lengths, self._megatron_cut(lengths, pieces))
            at += lo * _sizes(data, piece)
            if lab_at is not None:
                lab_at += lo * _sizes(labels, piece)
            lengths = hi - lo
        ids_runs = Runs(_bins(data, mapped), tuple(d.index.dtype for d in data), piece, at, lengths)
        if lab_at is None:
            return Located(ids_runs, None, mapped)
        return Located(ids_runs, ids_runs._replace(buffers=_bins(labels, mapped), starts=lab_at,
                                                   dtypes=tuple(d.index.dtype for d in labels)), mapped)  # type: ignore

    def _pair(self, k: int, entry: dict) -> Pair:
        """Return Megatron dataset ``k`` of the plan and its labels companion, checked unchanged since the plan.

        Its size, version and sequence count are checked now; its content digest (a hash of
        the whole ``.idx``) is checked in a thread beside the writes, and ``inputs_unchanged``
        waits for it before anything is committed.
        """
        got = self._pairs.get(k)
        if got is None:
            data = open_data(str(entry["path"]))
            size = _idx_bytes(data)
            check_unchanged({**entry, "sha256": None}, size, data.num_sequences)
            pool = ThreadPoolExecutor(1, thread_name_prefix="sortpack-digest")
            self._digests.append(pool.submit(check_unchanged, entry, size, data.num_sequences))
            pool.shutdown(wait=False)
            got = self._pairs[k] = (data, companion(data, self.labels) if self.labels is not None else None)
        return got

    def inputs_unchanged(self) -> None:
        """Raise one line when an input read differs from the plan's record (waits for the checks of ``_pair``)."""
        for digest in self._digests:
            digest.result()

    def source_dtypes(self) -> list[np.dtype] | None:
        """Return the dtypes the ids are read in (the Megatron datasets'), or None where stored data decides."""
        if self.column is not None:
            return None
        return [open_data(str(f["path"])).index.dtype for f in with_locations(self.manifest)]


def _pieces(index: pa.Table) -> tuple[np.ndarray, np.ndarray] | None:
    """Return the planned (begin, end) of each sample of an index's rows (``--oversize split``), or None."""
    return (_flat(index, "piece_begin"), _flat(index, "piece_end")) if "piece_begin" in index.schema.names else None


def _taken(arrays: list[np.ndarray], piece: np.ndarray | None, local: np.ndarray) -> np.ndarray:
    """Return ``arrays[piece[i]][local[i]]`` for every i (int64; ``piece`` None: all from ``arrays[0]``)."""
    if piece is None:
        return np.take(arrays[0], local).astype(np.int64, copy=False)
    out = np.zeros(len(local), np.int64)
    for j, arr in enumerate(arrays):
        sel = np.flatnonzero(piece == j)
        out[sel] = np.take(arr, local[sel])
    return out


def _sizes(datasets: list, piece: np.ndarray | None) -> np.ndarray | int:
    """Return the item size of each sample's dataset (one number where all come from the first)."""
    sizes = np.array([d.index.dtype.itemsize for d in datasets], np.int64)
    return int(sizes[0]) if piece is None else sizes[piece]


def _bins(datasets: list, mapped: bool) -> tuple[np.ndarray, ...]:
    """Return the datasets' mapped ``.bin`` (empty stand-ins where not ``mapped``)."""
    return tuple(d.mapped_bin() if mapped else np.zeros(0, np.uint8) for d in datasets)


def _bounds(lengths: np.ndarray, ranges: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Return where each sample of ``lengths`` starts and ends once cut to ``ranges`` (kept inside the sample)."""
    lo = np.minimum(ranges[0], lengths)
    return lo, np.minimum(np.maximum(ranges[1], lo), lengths)  # (np.clip, several times faster)


def _list_parts(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Return (offsets int64, values) of a list array: the offsets into its values child (unsliced), no copy."""
    values = col.values
    try:
        flat = values.to_numpy(zero_copy_only=True)
    except (pa.ArrowInvalid, NotImplementedError):
        raise SortpackError(f"stored token ids of type {col.type} with missing values: cannot export them") from None
    return col.offsets.to_numpy().astype(np.int64), flat


def _runs_of(parts: list[tuple[np.ndarray, np.ndarray]], piece: np.ndarray, lo: np.ndarray,
             counts: np.ndarray) -> Runs:
    """Return the ``Runs`` of list rows (``parts``: each shard's offsets and values), each cut to ``lo + counts``."""
    first = np.concatenate([o[:-1] for o, _ in parts]) if parts else np.zeros(0, np.int64)
    dtypes = tuple(v.dtype for _, v in parts)
    size = np.array([d.itemsize for d in dtypes], np.int64)[piece] if parts else np.zeros(0, np.int64)
    return Runs(tuple(v.view(np.uint8) for _, v in parts), dtypes, piece, (first + lo) * size, counts)


def _idx_bytes(data: MegatronData) -> int:
    from ...inputs.objects import size_of

    return size_of(data.path)


def _flat(index: pa.Table, name: str) -> np.ndarray:
    """Return a list column of the index flattened (int64)."""
    col = index.column(name).combine_chunks()
    return col.flatten().to_numpy().astype(np.int64, copy=False)


def _row_sizes(index: pa.Table) -> np.ndarray:
    """Return the samples of each packed row of the micro-batches, in order."""
    col = index.column("row_splits").combine_chunks()
    splits, offsets = col.flatten().to_numpy().astype(np.int64), col.offsets.to_numpy()
    sizes = np.diff(splits)
    # the splits of one micro-batch run from 0 to its sample count: drop the steps between micro-batches
    keep = np.ones(len(sizes), dtype=bool)
    keep[offsets[1:-1] - 1] = False
    return sizes[keep]


def _cut(values: np.ndarray, labels: np.ndarray | None, offsets: np.ndarray,
         ranges: tuple[np.ndarray, np.ndarray]) -> Gathered:
    """Return (values, labels, offsets) of each list ``values[offsets[i]:offsets[i + 1]]`` cut to ``ranges`` (its
    ``[begin, end)``)."""
    lengths = np.diff(offsets)
    lo, hi = _bounds(lengths, ranges)
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(hi - lo, out=out[1:])
    if np.array_equal(lo, np.zeros_like(lo)) and np.array_equal(hi, lengths):
        base = int(offsets[0]) if len(offsets) else 0
        return values[base:base + int(out[-1])], None if labels is None else labels[base:base + int(out[-1])], out
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
