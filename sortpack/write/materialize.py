"""Materialize: move the stored input columns into plan order with a distributed shuffle.

Every rank reads the rows of its own input units (as ``analyze`` splits them), learns
each row's output position from the index owners (one Alltoallv of (sample id, position)),
and sends rows to the rank writing that position with Alltoallv rounds whose bytes stay
under ``--memory-limit``. The data shards, whose boundaries are fixed global counts
(``format/data_shards.py``), are dealt to ranks in blocks balanced by the plan's sizes,
so the bytes never depend on the rank count and every rank writes. Rows travel as raw byte
ranges where the type allows (``row_store.py``). A round moves at most an eighth of the
limit; received rows wait in memory up to half of it and spill to memory-mapped Arrow
files past that.

About 750 lines on purpose: the options, the reader of input rows, the exchange rounds and
the shard writer share one bookkeeping of output positions and one memory budget; split,
each part would have to re-derive them. Data shard I/O lives in ``format/data_shards.py``,
the gathers in ``row_store.py`` and the reader side in ``stored.py``.
"""
from __future__ import annotations

import os
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..errors import SortpackError
from ..format.data_shards import (
    data_cuts,
    data_rows_per_shard,
    data_shard_name,
    write_data_shard,
)
from ..format.shards import file_sha256
from ..inputs.fingerprints import check_unchanged
from ..inputs.sources import SourceFile, describe, read_units, split_units
from ..inputs.specs import token_ids
from ..parallel import Comm
from ..partition import balanced_blocks
from .output import OutputDir
from .row_store import RowStore, from_raw

TOKENS_COLUMN = "input_ids"
ROW_WEIGHT = 16  # per-row bytes (offsets, validity) when balancing the writers by size
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_memory(text: str | int | None) -> int | None:
    """Return a byte count from ``text`` such as ``512M``, ``4G`` or ``1000000`` (None stays None)."""
    if text is None or text == "":
        return None
    if isinstance(text, int):
        value = text
    else:
        s = str(text).strip().lower().removesuffix("ib").removesuffix("b")
        scale = _UNITS.get(s[-1:], 1)
        try:
            value = int(float(s[:-1] if s[-1:] in _UNITS else s) * scale)
        except ValueError:
            raise SortpackError(f"--memory-limit {text!r}: expected bytes such as 512M, 4G or 1000000",
                                collective=True) from None
    if value <= 0:
        raise SortpackError(f"--memory-limit {text!r}: must be positive", collective=True)
    return value


def default_memory_limit(comm: Comm) -> int:
    """Return half of this node's physical memory divided by the ranks on this node."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 8 << 30
    hosts = comm.allgather_obj(socket.gethostname())
    per_node = max(1, hosts.count(hosts[comm.rank]))
    return max(1 << 20, phys // 2 // per_node)


@dataclass
class StoreOptions:
    """What to store with the index.

    ``columns``: input columns to store; ``tokens``: also store ``input_ids`` (the token
    ids of ``--size tokens``); ``memory_limit``: bytes per rank for the exchange (None: the
    default, see ``default_memory_limit``); ``tokenizer``: the tokenizer file (``pack``
    needs it again, ``run`` reuses ``--tokenizer``).
    """

    columns: tuple[str, ...] = ()
    tokens: bool = False
    memory_limit: int | None = None
    tokenizer: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        """Return whether anything is stored."""
        return bool(self.columns) or self.tokens

    def validate(self) -> None:
        """Raise SortpackError on inconsistent options."""
        if len(set(self.columns)) != len(self.columns):
            raise SortpackError(f"--store {','.join(self.columns)}: a column is named twice")
        if any(not c for c in self.columns):
            raise SortpackError("--store: empty column name")
        if self.tokens and TOKENS_COLUMN in self.columns:
            raise SortpackError(f"--store {TOKENS_COLUMN} and --store-tokens both write {TOKENS_COLUMN!r}")
        if self.memory_limit is not None and self.memory_limit <= 0:
            raise SortpackError("--memory-limit must be positive")


def parse_store(text: str | None) -> tuple[str, ...]:
    """Return the column names of ``--store COL[,COL...]``."""
    if not text:
        return ()
    return tuple(c.strip() for c in text.split(","))


# --- token ids kept from analyze ------------------------------------------------------------
class TokenCache:
    """Token ids that ``analyze`` computed while counting (``run --store-tokens``), kept on disk.

    Each rank appends its ids in sample order to ``.tokens-RANK.arrow`` in the output's
    temporary directory; ``materialize`` reads them back by global row instead of
    tokenizing a second time. ``__call__`` is the ``token_sink`` that ``analyze`` takes.
    """

    def __init__(self, out: OutputDir, comm: Comm, special_tokens: bool = True):
        self.comm = comm
        self.special_tokens = special_tokens
        self.path = out.ensure() / f".tokens-{comm.rank:05d}.arrow"
        self.rows = 0
        self._sink = self._writer = None
        self.parts: list | None = None

    def __call__(self, table: pa.Table, column: str, tokenizer, where: str) -> np.ndarray:
        """Return the token counts of ``column`` and keep its ids."""
        from ..inputs.specs import _column, _is_text, evaluate, parse_spec

        col = _column(table, column, where)
        if not _is_text(col.type):
            return evaluate(parse_spec("tokens", column, "--size"), table, where, tokenizer)  # raises
        ids, counts = token_ids(tokenizer, col, self.special_tokens)
        try:
            if self._writer is None:
                self._sink = pa.OSFile(str(self.path), "wb")
                self._writer = pa.ipc.new_file(self._sink, pa.schema([(TOKENS_COLUMN, ids.type)]))
            self._writer.write_batch(pa.record_batch([ids], names=[TOKENS_COLUMN]))
        except (OSError, pa.ArrowException) as exc:
            raise SortpackError(f"{self.path}: cannot write the token cache ({' '.join(str(exc).split())})") from None
        self.rows += len(ids)
        return counts

    def share(self) -> None:
        """Close this rank's file and learn every rank's (path, first row, rows) (collective)."""
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
        start = self.comm.exscan(self.rows)
        self.parts = self.comm.allgather_obj((str(self.path), start, self.rows))
        self._tables: dict = {}

    def rows_of(self, start: int, stop: int) -> pa.Array:
        """Return the ids of global rows ``[start, stop)`` as one list<int32> array."""
        pieces = []
        for path, first, n in self.parts:
            a, b = max(start, first), min(stop, first + n)
            if a >= b:
                continue
            table = self._tables.get(path)
            if table is None:
                table = self._tables[path] = pa.ipc.open_file(pa.memory_map(path, "r")).read_all()
            pieces.append(table.column(0).slice(a - first, b - a))
        if not pieces:
            return pa.array([], pa.list_(pa.int32()))
        return pa.chunked_array([c for p in pieces for c in p.chunks], pa.list_(pa.int32())).combine_chunks()

    def remove(self) -> None:
        """Delete this rank's file (after every rank has read what it needs)."""
        self._tables = {}
        Path(self.path).unlink(missing_ok=True)


# --- the source side -----------------------------------------------------------------------
def check_fingerprint(src: SourceFile, entry: dict) -> None:
    """Raise when a file differs from its manifest entry (size, mtime, digest, rows: ``check_unchanged``)."""
    check_unchanged(entry, src.bytes, sum(src.unit_rows) if src.unit_rows is not None else None)


def _describe_files(comm: Comm, files: list[dict]) -> list[SourceFile]:
    mine, err = [], None
    try:
        for i, entry in enumerate(files):
            if i % comm.size != comm.rank:
                continue
            if not os.path.isfile(entry["path"]):
                raise SortpackError(f"{entry['path']}: input file of the plan is missing")
            src = describe(entry["path"], entry["format"])
            check_fingerprint(src, entry)
            mine.append((i, src))
    except SortpackError as exc:
        err = exc
    comm.check(err)
    found = dict(pair for part in comm.allgather_obj(mine) for pair in part)
    return [found[i] for i in range(len(files))]


def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_dictionary(t):
        t = t.value_type
    if getattr(pa.types, "is_string_view", lambda _: False)(t):
        return pa.large_string()
    if getattr(pa.types, "is_binary_view", lambda _: False)(t):
        return pa.large_binary()
    return t


def _file_schema(src: SourceFile, entry: dict, columns: list[str]) -> pa.Schema | None:
    import pyarrow.parquet as pq

    try:
        if src.format == "parquet":
            schema = pq.read_schema(src.path)
        elif src.format == "arrow":
            from ..inputs.sources import _arrow_reader

            schema = _arrow_reader(src.path).schema
        else:
            if int(entry["rows"]) == 0:
                return None
            schema = read_units(src, 0, 1, None).schema
    except (pa.ArrowException, OSError) as exc:
        raise SortpackError(f"{src.path}: cannot read as {src.format} ({' '.join(str(exc).split())})") from None
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise SortpackError(f"{src.path}: no column {missing[0]!r} to store (columns: {', '.join(schema.names)})")
    return pa.schema([pa.field(c, _plain_type(schema.field(c).type)) for c in columns])


def output_schema(comm: Comm, srcs: list[SourceFile], files: list[dict], columns: list[str]) -> pa.Schema:
    """Return the stored columns' schema, unified over every input file in file order."""
    mine, err = [], None
    try:
        mine = [(i, _file_schema(s, files[i], columns)) for i, s in enumerate(srcs) if i % comm.size == comm.rank]
    except SortpackError as exc:
        err = exc
    comm.check(err)
    found = dict(pair for part in comm.allgather_obj(mine) for pair in part)
    schemas = [found[i] for i in range(len(srcs)) if found[i] is not None]
    if not schemas:
        return pa.schema([pa.field(c, pa.null()) for c in columns])
    try:
        unified = pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowException, TypeError) as exc:
        raise SortpackError(f"--store: input files disagree on a column's type ({' '.join(str(exc).split())})",
                            collective=True) from None
    return pa.schema([unified.field(c) for c in columns])


def row_bytes(table: pa.Table) -> np.ndarray:
    """Return an estimate of each row's bytes in memory (values plus offsets), per row."""
    n = table.num_rows
    total = np.zeros(n, dtype=np.int64)
    for col in table.columns:
        total += column_row_bytes(col)
    return total


def column_row_bytes(col: pa.ChunkedArray) -> np.ndarray:
    """Return an estimate of each row's bytes in one column."""
    import pyarrow.compute as pc  # on use: it costs every rank ~30 ms of start-up

    n, t = len(col), col.type
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return pc.binary_length(col).to_numpy(zero_copy_only=False).astype(np.int64) + 8
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_primitive(t.value_type):
        width = max(1, t.value_type.bit_width // 8)
        lengths = pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        return lengths * width + 8
    if pa.types.is_primitive(t):
        return np.full(n, max(1, t.bit_width // 8), dtype=np.int64)
    return np.full(n, -(-col.nbytes // n), dtype=np.int64)


# --- the exchange -----------------------------------------------------------------------------
class _Received:
    """Rows received by this rank, one ``RowStore`` per column: in memory up to ``budget`` bytes, spilled past it.

    Rows are numbered in arrival order; ``pos`` holds each one's output position. Rows that
    stay on their reader's rank are registered in place (no copy) when they are at least
    half of their round, so the memory held is at most twice what is counted.
    """

    def __init__(self, directory: Path, rank: int, budget: int, schema: pa.Schema):
        self.directory, self.rank, self.budget, self.schema = directory, rank, budget, schema
        self.stores = {f.name: RowStore(f.type) for f in schema}
        self.pos: list[np.ndarray] = []
        self.rows = self.spilled_rows = 0  # rows [0, spilled_rows) live in spill files
        self.pending_bytes = 0
        self.spills: list[Path] = []
        self.rounds = 0

    def add(self, columns: dict, pos: np.ndarray, nbytes: int, rows: np.ndarray | None = None) -> None:
        """Register rows ``rows`` (all when None) of ``columns`` (name -> array), with their positions."""
        if len(pos) == 0:
            return
        for name, store in self.stores.items():
            store.add(columns[name], rows)
        self.pos.append(pos)
        self.rows += len(pos)
        self.pending_bytes += int(nbytes)
        if self.pending_bytes > self.budget:
            self._spill()

    def _spill(self) -> None:
        path = self.directory / f".spill-{self.rank:05d}-{len(self.spills):05d}.arrow"
        pending = np.arange(self.spilled_rows, self.rows)
        table = self.gather(pending)
        _write_file(path, table, "spill file")
        del table
        self.spills.append(path)
        mapped = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
        for name, store in self.stores.items():
            store.drop_from(self.spilled_rows)
            store.add(mapped.column(name))
        self.spilled_rows, self.pending_bytes = self.rows, 0

    def gather(self, rows: np.ndarray) -> pa.Table:
        """Return received rows ``rows`` (arrival numbers) as one table of single-chunk columns."""
        return pa.Table.from_arrays([self.stores[f.name].gather(rows) for f in self.schema], schema=self.schema)

    def remove(self) -> None:
        """Drop every row and delete the spill files."""
        self.stores = {}
        for path in self.spills:
            path.unlink(missing_ok=True)


def _write_file(path: Path, table: pa.Table, what: str) -> None:
    try:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    except (OSError, pa.ArrowException) as exc:
        raise SortpackError(f"{path}: cannot write the {what} ({' '.join(str(exc).split())})") from None


@dataclass
class _Reader:
    """This rank's input rows, unit by unit, with each row's output position."""

    srcs: list[SourceFile]
    files: list[dict]
    units: list[tuple[int, int]]  # (file, unit) in global order
    first_row: int
    positions: tuple[np.ndarray, np.ndarray]  # (local row, output position) of every use, by row
    read_columns: list[str]
    schema: pa.Schema
    tokens: tuple | None  # (text column, tokenizer, truncate length or 0)
    cursor: int = 0
    row: int = 0

    def done(self) -> bool:
        return self.cursor >= len(self.units)

    def next_table(self) -> tuple[pa.Table, np.ndarray]:
        """Return the next unit's stored columns and its rows' positions (rows not in the plan dropped)."""
        fidx, unit = self.units[self.cursor]
        self.cursor += 1
        src, entry = self.srcs[fidx], self.files[fidx]
        expected = src.unit_rows[unit] if src.unit_rows is not None else int(entry["rows"])
        if expected == 0:
            return self.schema.empty_table(), np.zeros(0, np.int64)
        text = [self.tokens[0]] if self.tokens is not None else None
        if self.read_columns:
            table = read_units(src, unit, unit + 1, self.read_columns, text_columns=text)
        else:  # only token ids, all from analyze's cache: nothing to read
            table = pa.table({"_": pa.nulls(expected)})
        if table.num_rows != expected:
            raise SortpackError(f"{src.path}: read {table.num_rows} rows, the plan was analyzed from {expected} "
                                "(the input changed since analyze)")
        cols = {}
        for f in self.schema:
            if f.name == TOKENS_COLUMN and self.tokens is not None:
                from ..inputs.specs import _column

                text_col, tokenizer, cut = self.tokens[:3]
                cache = self.tokens[3] if len(self.tokens) > 3 else None
                if cache is not None:  # the ids analyze computed while counting
                    first = self.first_row + self.row
                    ids = cache.rows_of(first, first + expected)
                else:
                    tok, special = tokenizer
                    ids, _ = token_ids(tok, _column(table, text_col, src.path), special)
                if cut:
                    import pyarrow.compute as pc

                    ids = pc.list_slice(ids, 0, cut)
                cols[f.name] = ids
            else:
                col = table.column(f.name)
                try:
                    cols[f.name] = col.cast(f.type) if col.type != f.type else col
                except (pa.ArrowException, TypeError) as exc:
                    raise SortpackError(f"{src.path}: column {f.name!r} ({col.type}) does not convert to "
                                        f"{f.type} ({' '.join(str(exc).split())})") from None
        rows, positions = self.positions
        a, b = np.searchsorted(rows, [self.row, self.row + expected])
        take, pos = rows[a:b] - self.row, positions[a:b]
        self.row += expected
        out = pa.table(cols, schema=self.schema)
        if b - a != expected or bool(np.any(np.diff(take) != 1)):
            # rows left out of the plan, or used more than once (a mixture's repeats)
            out = out.take(pa.array(take))
        return out, pos


def materialize(comm: Comm, out: OutputDir, files: list[dict], ids: np.ndarray, mb_offsets: np.ndarray,
                first_mb: int, opts: StoreOptions, tokens: tuple | None, index_starts: np.ndarray,
                mb_sizes: np.ndarray | None = None) -> dict:
    """Write this rank's data shards of the plan; return the manifest's ``data`` object (every rank).

    ``ids`` are the sample ids of this rank's micro-batches ``[first_mb, ...)`` in plan
    order and ``mb_offsets`` their local offsets; ``mb_sizes`` the micro-batches' summed
    sample sizes (what balances the writers); ``tokens`` is (text column, tokenizer,
    truncate length) with ``--store-tokens``.
    """
    directory = out.ensure()
    limit = opts.memory_limit or default_memory_limit(comm)
    # a round's rows live up to three times (read, sent, received): an eighth each; what was
    # received stays until the shards are written: half, spilled past it
    budget = max(1, limit // 8)
    columns = list(opts.columns)
    srcs = _describe_files(comm, files)
    schema = output_schema(comm, srcs, files, columns) if columns else pa.schema([])
    if tokens is not None:
        schema = schema.append(pa.field(TOKENS_COLUMN, pa.list_(pa.int32())))

    # Input units split over ranks as analyze splits them; rows known from the fingerprint.
    unit_list = [(i, u) for i, s in enumerate(srcs) for u in range(s.num_units)]
    unit_rows = np.array([s.unit_rows[u] if s.unit_rows is not None else int(files[i]["rows"])
                          for i, u in unit_list for s in [srcs[i]]], dtype=np.int64)
    bounds = split_units(unit_rows.astype(np.float64), comm.size)
    row_starts = np.concatenate(([0], np.cumsum(unit_rows)))
    reader_starts = row_starts[bounds]
    lo, hi = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    my_first = int(reader_starts[comm.rank])

    # Positions: the owners of the plan tell each reader where its rows go.
    n = len(ids)
    pos0 = comm.exscan(n)
    positions = pos0 + np.arange(n, dtype=np.int64)
    to_reader = np.searchsorted(reader_starts, ids, side="right") - 1
    order = np.argsort(to_reader, kind="stable")
    got = comm.alltoallv_many({"id": np.ascontiguousarray(ids[order], dtype=np.int64),
                               "pos": positions[order]}, np.bincount(to_reader, minlength=comm.size))
    # a mixture plan may use a row more than once: every (row, position) pair, by row
    by_row = np.lexsort((got["pos"], got["id"]))
    local_pos = (got["id"][by_row] - my_first, got["pos"][by_row])
    del got, order, to_reader, by_row
    layout, writer_starts = _data_layout(comm, first_mb, mb_offsets, pos0, index_starts, mb_sizes)
    owner_starts = layout[writer_starts, 0]

    tokenize = tokens is not None and (len(tokens) < 4 or tokens[3] is None)
    read_columns = sorted(set(columns) | ({tokens[0]} if tokenize else set()))
    reader = _Reader(srcs, files, unit_list[lo:hi], my_first, local_pos, read_columns, schema, tokens)
    received = _Received(directory, comm.rank, max(1, limit // 2), schema)
    _exchange(comm, reader, received, owner_starts, budget, limit)

    shards = _write_data_shards(comm, directory, received, layout, writer_starts[comm.rank],
                                writer_starts[comm.rank + 1])
    received.remove()
    return {
        "columns": [f.name for f in schema], "schema": {f.name: str(f.type) for f in schema},
        "rows_per_shard": data_rows_per_shard(), "num_rows": int(layout[-1, 0]), "shards": shards,
        # varies with the rank count: moved to the manifest's provenance by write_index
        "_exchange": {"rounds": received.rounds, "memory_limit": limit, "round_budget": budget},
    }


def _exchange(comm: Comm, reader: _Reader, received: _Received, owner_starts: np.ndarray, budget: int,
              limit: int) -> None:
    """Send every local row to its position's owner in rounds of at most ``budget`` bytes per rank."""
    queue: list[list] = []  # [table, first unsent row] in reading order
    pos, sizes = np.zeros(0, np.int64), np.zeros(0, np.int64)
    rounds = 0
    while True:
        err = None
        try:
            # read whole units until a round's worth of bytes waits (fewer, larger rounds)
            while (not queue or int(sizes.sum()) < budget) and not reader.done():
                more, more_pos = reader.next_table()
                more_sizes = row_bytes(more)
                if len(more_sizes) and more_sizes.max() > budget:
                    worst = max(more.column_names, key=lambda c: int(column_row_bytes(more.column(c)).max()))
                    raise SortpackError(
                        f"column {worst!r}: a row of {int(more_sizes.max())} bytes does not fit the exchange "
                        f"budget of {budget} bytes per round (an eighth of --memory-limit {limit}); "
                        "raise --memory-limit")
                if more.num_rows:
                    queue.append([more, 0])
                    pos, sizes = np.concatenate((pos, more_pos)), np.concatenate((sizes, more_sizes))
        except SortpackError as exc:
            err = exc
        comm.check(err)
        left = len(pos)
        if comm.allreduce(int(left > 0), "max") == 0:
            break
        # the longest prefix under the budget, halved until no rank receives more than it
        take = max(1, int(np.searchsorted(np.cumsum(sizes), budget, side="right"))) if left else 0
        while True:
            dest = np.searchsorted(owner_starts, pos[:take], side="right") - 1
            send_bytes = np.bincount(dest, weights=sizes[:take], minlength=comm.size).astype(np.int64)
            recv_bytes = comm.exchange_counts(send_bytes)
            over, can_shrink = comm.allreduce(np.array([int(recv_bytes.sum() > budget), int(take > 1)]), "max")
            if not (over and can_shrink):
                break
            take = max(1, take // 2) if take else 0
        segments = _take_queue(queue, take)
        _send_round(comm, received, segments, pos[:take], sizes[:take], dest)
        pos, sizes = pos[take:], sizes[take:]
        rounds += 1
    received.rounds = rounds


def _take_queue(queue: list[list], take: int) -> list[tuple[pa.Table, int, int]]:
    """Return the next ``take`` queued rows as (table, first row, end row) segments and drop them from the queue."""
    segments = []
    while take > 0:
        table, first = queue[0]
        end = min(table.num_rows, first + take)
        segments.append((table, first, end))
        take -= end - first
        if end == table.num_rows:
            queue.pop(0)
        else:
            queue[0][1] = end
    return segments


def _send_round(comm: Comm, received: _Received, segments: list, pos: np.ndarray, sizes: np.ndarray,
                dest: np.ndarray) -> None:
    """Move one round's rows to their owners: Alltoallv of the rows' bytes, column by column."""
    schema = received.schema
    stores = {f.name: RowStore(f.type) for f in schema}
    for table, a, b in segments:
        for name, store in stores.items():
            store.add(table.column(name), np.arange(a, b))
    order = np.argsort(dest, kind="stable")
    counts = np.bincount(dest, minlength=comm.size)
    starts = np.concatenate(([0], np.cumsum(counts)))
    r = comm.rank
    own = order[starts[r]:starts[r + 1]]  # ascending: the stable sort keeps reading order
    others = np.concatenate((order[:starts[r]], order[starts[r + 1]:]))
    rows_out = counts.copy()
    rows_out[r] = 0
    # a column's bytes go raw (lengths and bytes) when every rank can gather them so, else as IPC
    raw = comm.allreduce(np.array([int(not s.raw) for s in stores.values()] or [0]), "max") == 0
    meta = {"pos": pos[others]}
    payloads = []
    for k, (name, store) in enumerate(stores.items()):
        if raw[k]:
            length, data, valid = store.gather_raw(others)
            meta[f"len{k}"] = length
            meta[f"valid{k}"] = np.ones(len(others), np.uint8) if valid is None else valid.astype(np.uint8)
            byte_counts = np.bincount(dest[others], weights=length, minlength=comm.size).astype(np.int64)
        else:
            data, byte_counts = _ipc_by_destination(store, others, dest[others], comm.size, schema.field(name))
        payloads.append((data, byte_counts))
    got = comm.alltoallv_many(meta, rows_out)
    columns = {}
    for k, (name, (data, byte_counts)) in enumerate(zip(stores, payloads)):
        recv_counts = comm.exchange_counts(byte_counts)
        buf = comm.alltoallv(data, byte_counts, recv_counts)
        del data
        field_ = schema.field(name)
        if raw[k]:
            valid = got[f"valid{k}"].astype(bool)
            columns[name] = from_raw(field_.type, got[f"len{k}"], buf, None if valid.all() else valid)
        else:
            columns[name] = _from_ipc(buf, recv_counts, field_)
    payloads.clear()
    received.add(columns, got["pos"], int(sum(a.nbytes for a in columns.values())))
    if len(own) == 0:
        return
    if 2 * len(own) >= len(dest):  # most rows stay: register them where they are read
        at = 0
        for table, a, b in segments:
            mine = own[(own >= at) & (own < at + b - a)]
            if len(mine):
                received.add({n: table.column(n) for n in stores}, pos[mine], int(sizes[mine].sum()),
                             rows=a + mine - at)
            at += b - a
    else:  # a few rows stay: copy them, so the rows that left do not stay in memory with them
        received.add({n: s.gather(own) for n, s in stores.items()}, pos[own], int(sizes[own].sum()))


def _ipc_by_destination(store: RowStore, rows: np.ndarray, dest: np.ndarray, size: int,
                        field_: pa.Field) -> tuple[np.ndarray, np.ndarray]:
    """Return the rows of a column that cannot go raw as one IPC stream per destination, and each stream's bytes."""
    sink, counts = pa.BufferOutputStream(), np.zeros(size, dtype=np.int64)
    schema = pa.schema([field_])
    for p in range(size):
        mine = rows[dest == p]
        if len(mine) == 0:
            continue
        at = sink.tell()
        with pa.ipc.new_stream(sink, schema) as writer:
            writer.write_table(pa.Table.from_arrays([store.gather(mine)], schema=schema))
        counts[p] = sink.tell() - at
    return np.frombuffer(sink.getvalue(), dtype=np.uint8), counts


def _from_ipc(buf: np.ndarray, counts: np.ndarray, field_: pa.Field) -> pa.Array:
    """Return the rows of the IPC streams received from every rank, in rank order, as one array."""
    parts, at = [], 0
    for c in counts.tolist():
        if c:
            table = pa.ipc.open_stream(pa.py_buffer(buf[at:at + c])).read_all()
            parts.extend(table.column(0).chunks)
            at += c
    return pa.concat_arrays(parts) if parts else pa.array([], field_.type)


def _data_layout(comm: Comm, first_mb: int, mb_offsets: np.ndarray, pos0: int, index_starts: np.ndarray,
                 mb_sizes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Return every data shard's (first row, first micro-batch) plus the end row, and each rank's first shard to write.

    The shards follow the index owners' micro-batches (``data_cuts``), but who writes them
    does not: the index of a small plan is one shard on one rank, so writing data where the
    index is would send every row to that rank. Shards go to ranks in contiguous blocks
    balanced by their samples' summed sizes plus ``ROW_WEIGHT`` per row: the plan is sorted
    by size, so equal row counts would give the last rank the longest rows.
    """
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
    parts = comm.allgather_obj((mine.astype(np.int64), end, weight))
    # the plan's end: the last rank's; trailing micro-batches of no rows join the last shard
    last = max((e for _, e, _ in parts), key=lambda e: (int(e[0, 0]), int(e[0, 1])))
    layout = np.concatenate([m for m, _, _ in parts] + [last])
    return layout.astype(np.int64), balanced_blocks(np.concatenate([w for _, _, w in parts]), comm.size)


def _write_data_shards(comm: Comm, directory: Path, received: _Received, layout: np.ndarray, lo: int,
                       hi: int) -> list[dict]:
    """Write data shards ``[lo, hi)`` of ``layout`` from the received rows; return every shard's entry (every rank)."""
    w0, n = int(layout[lo, 0]), int(layout[hi, 0] - layout[lo, 0])
    all_pos = np.concatenate(received.pos) if received.pos else np.zeros(0, np.int64)
    if len(all_pos) != n or (n and not np.array_equal(np.sort(all_pos), w0 + np.arange(n))):
        raise RuntimeError(f"materialize: rank {comm.rank} received {len(all_pos)} rows for {n} positions")
    where = np.empty(n, dtype=np.int64)
    where[all_pos - w0] = np.arange(n)
    out, err = [], None
    # sha256 of a written shard runs in a thread (hashlib releases the GIL) while the next
    # shard is gathered and written
    hasher = ThreadPoolExecutor(max_workers=1)
    try:
        for k in range(lo, hi):
            (r0, mb0), (r1, mb1) = (int(v) for v in layout[k]), (int(v) for v in layout[k + 1])
            r0, r1 = r0 - w0, r1 - w0
            name = data_shard_name(k)
            try:
                table = received.gather(where[r0:r1])
            except OverflowError as exc:
                raise SortpackError(f"{directory.parent / name}: a stored column holds too many bytes for one "
                                    f"shard ({exc}); store it as large_string/large_binary") from None
            try:
                size = write_data_shard(directory / name, table)
            except (OSError, pa.ArrowException) as exc:
                raise SortpackError(f"{directory.parent / name}: cannot write the data shard "
                                    f"({' '.join(str(exc).split())})") from None
            del table
            out.append({"file": name, "first": w0 + r0, "rows": r1 - r0, "first_microbatch": mb0,
                        "microbatches": mb1 - mb0, "bytes": size,
                        "sha256": hasher.submit(file_sha256, directory / name)})
        for entry in out:
            entry["sha256"] = entry["sha256"].result()
    except SortpackError as exc:
        err, out = exc, []
    finally:
        hasher.shutdown(wait=True)
    comm.check(err)
    return [e for part in comm.allgather_obj(out) for e in part]


def prepare(comm: Comm, opts: StoreOptions, options: dict, popts, tokenizer_path: str | None):
    """Return ``store(out, ids, offsets, first_mb)`` for ``write_index``, checking the options collectively.

    ``options`` are the plan's recorded options (column, size, tokenizer); ``popts`` the
    pack options (``--oversize truncate`` cuts stored ids to the truncated size).
    """
    def check():
        opts.validate()
        if not opts.tokens:
            return None
        if options.get("size") != "tokens":
            raise SortpackError(f"--store-tokens stores the ids of --size tokens; this plan's size is "
                                f"{options.get('size')!r}")
        column = options.get("column")
        if not column:
            raise SortpackError("--store-tokens needs --column (the text column the tokens were counted from)")
        path = opts.tokenizer or tokenizer_path
        if not path:
            raise SortpackError("--store-tokens needs --tokenizer (the tokenizer.json the sizes were counted with)")
        recorded = options.get("tokenizer")
        if recorded and Path(path).name != recorded:
            raise SortpackError(f"--tokenizer {path}: the plan's sizes were counted with {recorded!r}")
        from ..inputs.specs import load_tokenizer
        from ..stages.pack import truncate_length

        tokenizer = load_tokenizer(path, "--store-tokens")
        cut = truncate_length(popts) if popts.oversize == "truncate" else 0
        # the tokenizer travels with whether the counts included the special tokens
        return column, (tokenizer, special), cut

    special = bool(options.get("special_tokens", True))
    tokens = comm.collectively(check)
    caches: list[TokenCache] = []

    def token_cache(out: OutputDir) -> TokenCache | None:
        """Return the ``token_sink`` for ``analyze`` that keeps its ids (None without --store-tokens)."""
        if tokens is None:
            return None
        caches.append(TokenCache(out, comm, special))
        return caches[-1]

    def store(out: OutputDir, files: list[dict], ids: np.ndarray, mb_offsets: np.ndarray, first_mb: int,
              index_starts: np.ndarray, mb_sizes: np.ndarray | None = None) -> dict:
        cache = caches[-1] if caches else None
        if cache is not None:
            cache.share()
        data = materialize(comm, out, files, ids, mb_offsets, first_mb, opts,
                           None if tokens is None else (*tokens, cache), index_starts, mb_sizes)
        if cache is not None:
            comm.barrier()  # every rank has read the ids it needed
            cache.remove()
        if tokens is not None:
            data["tokens"] = {
                "column": TOKENS_COLUMN, "source_column": tokens[0],
                "tokenizer": Path(opts.tokenizer or tokenizer_path).name,
                "special_tokens": special, "truncated_to": tokens[2] or None,
                "note": "the ids the size counted: len(input_ids) == size",
            }
        return data

    store.token_cache = token_cache
    return store
