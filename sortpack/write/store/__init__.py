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
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ...errors import SortpackError
from ...format.data_shards import data_rows_per_shard
from ...inputs.size_kinds import size_kind
from ...inputs.source_file import SourceFile
from ...parallel import Comm
from ...row_store import piece_bytes
from ..output import OutputDir, PlanDir
from .exchange import exchange
from .layout import data_layout
from .options import (
    LABELS_COLUMN,
    TOKENS_COLUMN,
    StoreOptions,
    TokenIds,
    default_memory_limit,
    parse_memory,
    parse_store,
    token_ids_options,
)
from .plan import MemoryBudget, ReadPlan, file_units, memory_budget, position_requests, read_plan, row_uses
from .result import SECONDS, ExchangeStats, StoreResult
from .rows import InputRows, RowPositions
from .shard_writer import write_data_shards
from .sources import describe_files, output_schema
from .spill import ReceivedRows
from .token_cache import TokenCache

if TYPE_CHECKING:
    from ...stages.pack import PackOptions

__all__ = ["ExchangeStats", "Store", "StoreOptions", "StoreResult", "materialize", "parse_memory", "parse_store",
           "prepare"]


def materialize(comm: Comm, out: PlanDir, files: list[dict], ids: np.ndarray, mb_offsets: np.ndarray,
                first_mb: int, opts: StoreOptions, tokens: TokenIds | None, cache: TokenCache | None,
                index_starts: np.ndarray, mb_sizes: np.ndarray | None = None,
                renames: list[dict[str, str] | None] | None = None, ranges: dict[str, np.ndarray] | None = None,
                cut_columns: tuple[str, ...] = (), cut_unit: str = "length") -> StoreResult:
    """Return the data shards written and the exchange's figures (every rank), after writing this rank's shards.

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
    budget = memory_budget(opts.memory_limit or default_memory_limit(comm), piece_bytes())
    srcs = describe_files(comm, files)
    schema = _stored_schema(comm, srcs, files, list(opts.columns), renames, tokens)
    units, unit_rows = file_units(srcs, files)
    plan = read_plan(units, unit_rows, rank=comm.rank, size=comm.size)
    pos0 = comm.exscan(len(ids))
    cut = None if ranges is None else (*cut_columns, *(_token_columns(tokens)))
    uses = _ask_readers(comm, ids, pos0, plan, ranges, cut)
    uses.unit = cut_unit  # what the ranges count: characters and elements, or a text's UTF-8 bytes
    layout = data_layout(comm, first_mb, mb_offsets, pos0, index_starts, mb_sizes)
    # ids analyze did not keep are counted again from their text column
    read_columns = sorted(set(opts.columns) | (_source_columns(tokens) if cache is None else set()))
    reader = InputRows(srcs, files, plan.units, plan.first_row, uses, read_columns, schema, tokens, cache, renames)
    received = ReceivedRows(directory, comm.rank, budget.held, schema, budget.spill_batch)
    t0 = time.perf_counter()
    rounds = exchange(comm, reader, received, layout.owner_starts, budget.round, budget.limit)
    t1 = time.perf_counter()
    shards = write_data_shards(comm, directory, received, layout)
    stats = _exchange_stats(comm, rounds, budget, reader, received, t1 - t0, time.perf_counter() - t1)
    received.remove()
    return StoreResult(columns=[f.name for f in schema], schema={f.name: str(f.type) for f in schema},
                       rows_per_shard=data_rows_per_shard(), num_rows=layout.num_rows, shards=shards, exchange=stats)


def _token_columns(tokens: TokenIds | None) -> tuple[str, ...]:
    """Return the columns ``--store-tokens`` writes: the ids, and the labels of fine-tuning texts."""
    if tokens is None:
        return ()
    return (TOKENS_COLUMN, LABELS_COLUMN) if tokens.labels else (TOKENS_COLUMN,)


def _source_columns(tokens: TokenIds | None) -> set[str]:
    """Return the input columns the stored token ids are made from (read when analyze kept none)."""
    if tokens is None:
        return set()
    return set(tokens.shape.columns()) if tokens.shape is not None else {tokens.column}


def _stored_schema(comm: Comm, srcs: list[SourceFile], files: list[dict], columns: list[str],
                   renames: list[dict[str, str] | None] | None, tokens: TokenIds | None) -> pa.Schema:
    """Return the data shards' schema: the stored columns unified over the files, then the token ids (collective)."""
    schema = output_schema(comm, srcs, files, columns, renames) if columns else pa.schema([])
    for name in _token_columns(tokens):
        if name in schema.names:
            raise SortpackError(f"--store {name} and --store-tokens both write {name!r}", collective=True)
        schema = schema.append(pa.field(name, pa.list_(pa.int32())))
    return schema


def _ask_readers(comm: Comm, ids: np.ndarray, pos0: int, plan: ReadPlan, ranges: dict[str, np.ndarray] | None,
                 cut: tuple[str, ...] | None) -> RowPositions:
    """Return every use of this rank's input rows: the plan's owners tell each reader where its rows go (collective)."""
    asked, counts = position_requests(ids, pos0, plan.reader_starts, ranges, comm.size)
    return row_uses(comm.alltoallv_many(asked, counts), plan.first_row, cut)


def _exchange_stats(comm: Comm, rounds: int, budget: MemoryBudget, reader: InputRows, received: ReceivedRows,
                    exchange_s: float, write_s: float) -> ExchangeStats:
    """Return how the rows moved: spills summed over ranks, the seconds the slowest rank took (collective)."""
    # the exchange less its reads and spills, and the writes
    seconds = comm.allreduce(np.array([reader.seconds, exchange_s - reader.seconds - received.spill_s,
                                       received.spill_s, write_s]), "max")
    spills = comm.allreduce(np.array([len(received.spills), received.spill_batches], dtype=np.int64), "sum")
    return ExchangeStats(rounds=rounds, memory_limit=budget.limit, round_budget=budget.round,
                         spills=int(spills[0]), spill_batches=int(spills[1]),
                         seconds={k: round(float(v), 3) for k, v in zip(SECONDS, seconds)})


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
        """Return the ``keep_tokens`` for ``analyze``: the cache that keeps its ids (None without --store-tokens)."""
        if self.tokens is None:
            return None
        self.caches.append(TokenCache(out, self.comm, self.special_tokens))
        return self.caches[-1]

    def __call__(self, out: PlanDir, files: list[dict], ids: np.ndarray, mb_offsets: np.ndarray, first_mb: int,
                 index_starts: np.ndarray, mb_sizes: np.ndarray | None = None,
                 ranges: dict[str, np.ndarray] | None = None) -> StoreResult:
        """Return what was stored, after writing the data shards (collective)."""
        cache = self.caches[-1] if self.caches else None
        if cache is not None:
            cache.share()
        stored = materialize(self.comm, out, files, ids, mb_offsets, first_mb, self.opts, self.tokens, cache,
                             index_starts, mb_sizes, self.renames, ranges, self.cut_columns,
                             self.cut_unit)
        self.plans -= 1
        if cache is not None and self.plans <= 0:
            self.comm.barrier()  # every rank has read the ids it needed
            cache.remove()
        if self.tokens is not None:
            stored.tokens = {
                "column": TOKENS_COLUMN, "source_column": self.tokens.column,
                "tokenizer": self.tokens.tokenizer_file,
                "special_tokens": self.special_tokens, "truncated_to": self.tokens.truncate or None,
                "note": "the ids the size counted: len(input_ids) == size",
            }
            if self.tokens.labels:
                stored.tokens["labels"] = LABELS_COLUMN  # aligned to input_ids, -100 where no target
        if ranges is not None:
            # which stored columns hold a piece's range only (the others hold the whole sample)
            stored.pieces = [c for c in stored.columns if c in self.cut_columns or c in _token_columns(self.tokens)]
        return stored


def prepare(comm: Comm, opts: StoreOptions, options: dict, popts: PackOptions, tokenizer_path: str | None,
            renames: list[dict[str, str] | None] | None = None) -> Store:
    """Return the ``Store`` for ``write_index``, checking the options collectively.

    ``options`` are the plan's recorded options (column, size, tokenizer); ``popts`` the
    pack options (``--oversize truncate`` cuts stored ids to the truncated size); ``renames``
    per input file ``{plan column: input column}`` (a mixture source's own ``column``).
    """
    tokens = comm.collectively(token_ids_options, opts, options, popts, tokenizer_path)
    # a split plan's pieces are ranges of what the size counted: where that is the column's own values
    # (characters, elements, bytes), a stored copy of that column is cut to them
    size = str(options.get("size"))
    kind = size_kind(size)
    cut: tuple[str, ...] = (str(options.get("column")),) if kind is not None and kind.cuts_column \
        and options.get("column") else ()
    labels = (options.get("fine_tune") or {}).get("labels_column")
    if cut and labels:  # a labels column is cut with the token ids it labels
        cut = (*cut, str(labels))
    return Store(comm, opts, tokens, bool(options.get("special_tokens", True)), renames, cut, size)
