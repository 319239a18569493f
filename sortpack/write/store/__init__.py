"""Store input columns with the index: move them into plan order with a distributed shuffle.

Every rank reads the rows of its own input units (as ``analyze`` splits them), learns
each row's output position from the index owners (one Alltoallv of (sample id, position)),
and sends rows to the rank writing that position with Alltoallv rounds whose bytes stay
under ``--memory-limit`` (``exchange``). The data shards, whose boundaries are fixed global
counts (``format/data_shards.py``), are dealt to ranks in blocks balanced by the plan's
sizes (``layout``), so the bytes never depend on the rank count and every rank writes
(``shard_writer``). A round moves at most an eighth of the limit; received rows wait in
memory up to half of it and spill to memory-mapped Arrow files past that (``spill``).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa

from ...format.data_shards import data_rows_per_shard
from ...parallel import Comm
from ...partition import balanced_blocks
from ...row_store import piece_bytes
from ..output import OutputDir, PlanDir
from .exchange import exchange
from .layout import data_layout
from .options import (
    TOKENS_COLUMN,
    StoreOptions,
    TokenIds,
    default_memory_limit,
    parse_memory,
    parse_store,
    token_ids_options,
)
from .rows import InputRows, RowPositions
from .shard_writer import write_data_shards
from .sources import describe_files, output_schema
from .spill import ReceivedRows
from .token_cache import TokenCache

__all__ = ["Store", "StoreOptions", "materialize", "parse_memory", "parse_store", "prepare"]


def materialize(comm: Comm, out: PlanDir, files: list[dict], ids: np.ndarray, mb_offsets: np.ndarray,
                first_mb: int, opts: StoreOptions, tokens: TokenIds | None, cache: TokenCache | None,
                index_starts: np.ndarray, mb_sizes: np.ndarray | None = None,
                renames: list[dict[str, str] | None] | None = None, ranges: dict[str, np.ndarray] | None = None,
                cut_columns: tuple[str, ...] = (), cut_unit: str = "length") -> dict:
    """Return the manifest's ``data`` object (every rank), after writing this rank's data shards of the plan.

    Parameters
    ----------
    ids, mb_offsets : numpy.ndarray
        The sample ids of this rank's micro-batches ``[first_mb, ...)`` in plan order and
        their local offsets.
    tokens : TokenIds or None
        How ``--store-tokens`` gets its ids; ``cache`` holds them when ``analyze`` kept them.
    mb_sizes : numpy.ndarray or None
        The micro-batches' summed sample sizes (what balances the writers).
    renames : list or None
        Per input file, ``{plan column: input column}`` (a mixture source's own ``column``).
    ranges : dict or None
        ``--oversize split``: ``piece_begin``/``piece_end`` of each sample (as ``ids``); the
        columns in ``cut_columns`` (and the token ids) are stored cut to them, others whole;
        ``cut_unit`` is the size kind the ranges count (``bytes``: a text's UTF-8 bytes).
    """
    directory = out.ensure()
    limit = opts.memory_limit or default_memory_limit(comm)
    # a round's rows live up to three times (read, sent, received): an eighth each; what was
    # received stays until the shards are written: half, spilled past it
    budget = max(1, limit // 8)
    columns = list(opts.columns)
    srcs = describe_files(comm, files)
    schema = output_schema(comm, srcs, files, columns, renames) if columns else pa.schema([])
    if tokens is not None:
        schema = schema.append(pa.field(TOKENS_COLUMN, pa.list_(pa.int32())))

    # Input units split over ranks as analyze splits them; rows known from the fingerprint.
    unit_list = [(i, u) for i, s in enumerate(srcs) for u in range(s.num_units)]
    unit_rows = np.array([s.unit_rows[u] if s.unit_rows is not None else int(files[i]["rows"])
                          for i, u in unit_list for s in [srcs[i]]], dtype=np.int64)
    bounds = balanced_blocks(unit_rows.astype(np.float64), comm.size)
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
    asked = {"id": np.ascontiguousarray(ids[order], dtype=np.int64), "pos": positions[order]}
    if ranges is not None:
        asked.update({"begin": ranges["piece_begin"][order], "end": ranges["piece_end"][order]})
    got = comm.alltoallv_many(asked, np.bincount(to_reader, minlength=comm.size))
    # a mixture plan may use a row more than once, a split plan cut it into pieces: every (row, position) pair
    by_row = np.lexsort((got["pos"], got["id"]))
    uses = RowPositions(got["id"][by_row] - my_first, got["pos"][by_row])
    if ranges is not None:
        uses.begin, uses.end = got["begin"][by_row], got["end"][by_row]
        uses.cut = tuple(c for c in (*cut_columns, *((TOKENS_COLUMN,) if tokens is not None else ())))
        uses.unit = cut_unit
    del got, order, to_reader, by_row
    layout = data_layout(comm, first_mb, mb_offsets, pos0, index_starts, mb_sizes)

    tokenize = tokens is not None and cache is None
    read_columns = sorted(set(columns) | ({tokens.column} if tokens is not None and tokenize else set()))
    reader = InputRows(srcs, files, unit_list[lo:hi], my_first, uses, read_columns, schema, tokens, cache,
                       renames)
    # spill batches of at most a sixteenth of a round: the pages of finished ones are released
    received = ReceivedRows(directory, comm.rank, max(1, limit // 2), schema,
                            min(piece_bytes(), max(1 << 20, budget // 16)))
    t0 = time.perf_counter()
    rounds = exchange(comm, reader, received, layout.owner_starts, budget, limit)
    t1 = time.perf_counter()
    shards = write_data_shards(comm, directory, received, layout)
    # where the time went, max over ranks: the exchange less its reads and spills, and the writes
    seconds = comm.allreduce(np.array([reader.seconds, t1 - t0 - reader.seconds - received.spill_s,
                                       received.spill_s, time.perf_counter() - t1]), "max")
    spills = comm.allreduce(np.array([len(received.spills), received.spill_batches], dtype=np.int64), "sum")
    received.remove()
    return {
        "columns": [f.name for f in schema], "schema": {f.name: str(f.type) for f in schema},
        "rows_per_shard": data_rows_per_shard(), "num_rows": layout.num_rows, "shards": shards,
        # varies with the rank count: moved to the manifest's provenance by write_index
        "_exchange": {"rounds": rounds, "memory_limit": limit, "round_budget": budget,
                      "spills": int(spills[0]), "spill_batches": int(spills[1]),  # over all ranks
                      "seconds": {k: round(float(v), 3) for k, v in zip(("read", "exchange", "spill", "write"),
                                                                          seconds)}},
    }


class Store:
    """The stored columns' writer that ``write_index`` calls, with the token cache ``analyze`` fills."""

    def __init__(self, comm: Comm, opts: StoreOptions, tokens: TokenIds | None, special_tokens: bool,
                 renames: list[dict[str, str] | None] | None = None, cut_columns: tuple[str, ...] = (),
                 cut_unit: str = "length"):
        self.comm, self.opts, self.tokens, self.special_tokens = comm, opts, tokens, special_tokens
        self.renames = renames  # per input file: {plan column: input column} (a mixture's sources)
        self.cut_columns = cut_columns  # --oversize split: stored columns cut to each piece's range
        self.cut_unit = cut_unit  # what the ranges count: "length" (characters, elements) or "bytes"
        self.caches: list[TokenCache] = []
        self.plans = 1  # plans still to store: the token cache is removed after the last

    def also_holdout(self) -> None:
        """Say that a held-out plan is stored too (before the training plan): keep the token cache for both."""
        self.plans += 1

    def token_cache(self, out: OutputDir) -> TokenCache | None:
        """Return the ``token_sink`` for ``analyze`` that keeps its ids (None without --store-tokens)."""
        if self.tokens is None:
            return None
        self.caches.append(TokenCache(out, self.comm, self.special_tokens))
        return self.caches[-1]

    def __call__(self, out: PlanDir, files: list[dict], ids: np.ndarray, mb_offsets: np.ndarray, first_mb: int,
                 index_starts: np.ndarray, mb_sizes: np.ndarray | None = None,
                 ranges: dict[str, np.ndarray] | None = None) -> dict:
        """Return the manifest's ``data`` object after writing the data shards (collective)."""
        cache = self.caches[-1] if self.caches else None
        if cache is not None:
            cache.share()
        data = materialize(self.comm, out, files, ids, mb_offsets, first_mb, self.opts, self.tokens, cache,
                           index_starts, mb_sizes, self.renames, ranges, self.cut_columns, self.cut_unit)
        self.plans -= 1
        if cache is not None and self.plans <= 0:
            self.comm.barrier()  # every rank has read the ids it needed
            cache.remove()
        if self.tokens is not None:
            data["tokens"] = {
                "column": TOKENS_COLUMN, "source_column": self.tokens.column,
                "tokenizer": self.tokens.tokenizer_file,
                "special_tokens": self.special_tokens, "truncated_to": self.tokens.truncate or None,
                "note": "the ids the size counted: len(input_ids) == size",
            }
        if ranges is not None:
            # which stored columns hold a piece's range only (the others hold the whole sample)
            data["pieces"] = {"cut": [c for c in data["columns"] if c in self.cut_columns or
                                      (self.tokens is not None and c == TOKENS_COLUMN)]}
        return data


def prepare(comm: Comm, opts: StoreOptions, options: dict, popts: Any, tokenizer_path: str | None,
            renames: list[dict[str, str] | None] | None = None) -> Store:
    """Return the ``Store`` for ``write_index``, checking the options collectively.

    ``options`` are the plan's recorded options (column, size, tokenizer); ``popts`` the
    pack options (``--oversize truncate`` cuts stored ids to the truncated size); ``renames``
    per input file ``{plan column: input column}`` (a mixture source's own ``column``).
    """
    tokens = comm.collectively(token_ids_options, opts, options, popts, tokenizer_path)
    # a split plan's pieces are ranges of what the size counted: under --size length, the column's
    # characters or elements, under --size bytes its bytes, which a stored copy of that column is cut to
    size = str(options.get("size"))
    cut = (str(options.get("column")),) if size in ("length", "bytes") and options.get("column") else ()
    return Store(comm, opts, tokens, bool(options.get("special_tokens", True)), renames, cut, size)
