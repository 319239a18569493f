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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ...errors import SortpackError
from ...format.data_shards import data_rows_per_shard
from ...inputs.size_kinds import size_kind
from ...parallel import Comm
from ..output import OutputDir, PlanDir
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
from .result import SECONDS, ExchangeStats, StoreResult

if TYPE_CHECKING:
    from ...inputs.source_file import SourceFile
    from ...stages.plan_options import PlanOptions
    from ..owned import OwnedMicrobatches
    from .plan import MemoryBudget, ReadPlan, StorePlan, StoreSetup
    from .rows import InputRows, RowPositions
    from .spill import ReceivedRows
    from .token_cache import TokenCache

# The options and results load with the package; what moves and writes the rows (exchange, plan, rows, spill,
# shard_writer, sources, token_cache) loads where a job stores columns: every job parses --store, few use it.
__all__ = ["ExchangeStats", "Store", "StoreOptions", "StoreResult", "materialize", "parse_memory", "parse_store",
           "prepare"]


def materialize(comm: Comm, out: PlanDir, owned: OwnedMicrobatches, plan: StorePlan) -> StoreResult:
    """Return the data shards written and the exchange's figures (every rank), after writing this rank's shards.

    ``owned``: the index's micro-batches this rank writes (their sample ids in plan order, and
    with ``--oversize split`` each sample's range: the columns in ``plan.setup.cut_columns`` and
    the token ids are stored cut to it, others whole); ``plan``: what is stored, from which files.
    """
    from ...row_store import piece_bytes
    from .exchange import exchange
    from .layout import data_layout
    from .plan import file_units, memory_budget, read_plan
    from .rows import InputRows
    from .shard_writer import write_data_shards
    from .sources import describe_files
    from .spill import ReceivedRows

    setup, opts = plan.setup, plan.setup.options
    directory = out.ensure()
    budget = memory_budget(opts.memory_limit or default_memory_limit(comm), piece_bytes())
    srcs = describe_files(comm, plan.files)
    schema = _stored_schema(comm, srcs, plan)
    units, unit_rows = file_units(srcs, plan.files)
    reads = read_plan(units, unit_rows, rank=comm.rank, size=comm.size)
    pos0 = comm.exscan(len(owned.sample_ids))
    cut = None if owned.ranges is None else (*setup.cut_columns, *(_token_columns(setup.tokens)))
    uses = _ask_readers(comm, owned, pos0, reads, cut)
    uses.unit = setup.cut_unit  # what the ranges count: characters and elements, or a text's UTF-8 bytes
    layout = data_layout(comm, owned, pos0, plan.index_starts)
    # ids analyze did not keep are counted again from their text column
    read_columns = sorted(set(opts.columns) | (_source_columns(setup.tokens) if plan.cache is None else set()))
    reader = InputRows(srcs, plan.files, reads.units, reads.first_row, uses, read_columns, schema, setup.tokens,
                       plan.cache, setup.renames)
    received = ReceivedRows(directory, comm.rank, budget.held, schema, budget.spill_batch)
    t0 = time.perf_counter()
    rounds = exchange(comm, reader, received, layout.owner_starts, budget)
    t1 = time.perf_counter()
    shards = write_data_shards(comm, directory, received, layout)
    stats = _exchange_stats(comm, budget, reader, received, _Timing(rounds, t1 - t0, time.perf_counter() - t1))
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
    if tokens.shape is not None:
        return set(tokens.shape.columns())
    return {tokens.column} | ({tokens.labels_column} if tokens.labels_column else set())


def _stored_schema(comm: Comm, srcs: list[SourceFile], plan: StorePlan) -> pa.Schema:
    """Return the data shards' schema: the stored columns unified over the files, then the token ids (collective)."""
    from .sources import output_schema

    columns, setup = list(plan.setup.options.columns), plan.setup
    schema = output_schema(comm, srcs, plan.files, columns, setup.renames) if columns else pa.schema([])
    for name in _token_columns(setup.tokens):
        if name in schema.names:
            raise SortpackError(f"--store {name} and --store-tokens both write {name!r}", collective=True)
        schema = schema.append(pa.field(name, pa.list_(pa.int32())))
    return schema


def _ask_readers(comm: Comm, owned: OwnedMicrobatches, pos0: int, reads: ReadPlan,
                 cut: tuple[str, ...] | None) -> RowPositions:
    """Return every use of this rank's input rows: the plan's owners tell each reader where its rows go (collective)."""
    from .plan import position_requests, row_uses

    asked, counts = position_requests(owned.sample_ids, pos0, reads.reader_starts, owned.ranges, comm.size)
    return row_uses(comm.alltoallv_many(asked, counts), reads.first_row, cut)


@dataclass(frozen=True)
class _Timing:
    """How this rank's exchange went: its rounds, its seconds, and the seconds writing the shards took."""

    rounds: int
    exchange_s: float
    write_s: float


def _exchange_stats(comm: Comm, budget: MemoryBudget, reader: InputRows, received: ReceivedRows,
                    timing: _Timing) -> ExchangeStats:
    """Return how the rows moved: spills summed over ranks, the seconds the slowest rank took (collective)."""
    rounds, exchange_s, write_s = timing.rounds, timing.exchange_s, timing.write_s
    # the exchange less its reads and spills, and the writes
    seconds = comm.allreduce(np.array([reader.seconds, exchange_s - reader.seconds - received.spill_s,
                                       received.spill_s, write_s]), "max")
    spills = comm.allreduce(np.array([len(received.spills), received.spill_batches], dtype=np.int64), "sum")
    return ExchangeStats(rounds=rounds, memory_limit=budget.limit, round_budget=budget.round,
                         spills=int(spills[0]), spill_batches=int(spills[1]),
                         seconds={k: round(float(v), 3) for k, v in zip(SECONDS, seconds)})


class Store:
    """The stored columns' writer that ``write_index`` calls, with the token cache ``analyze`` fills."""

    def __init__(self, comm: Comm, setup: StoreSetup):
        self.comm, self.setup = comm, setup
        self.caches: list[TokenCache] = []
        self.plans = 1  # plans still to store: the token cache is removed after the last

    def also_holdout(self) -> None:
        """Say that a held-out plan is stored too (before the training plan): keep the token cache for both."""
        self.plans += 1

    def token_cache(self, out: OutputDir) -> TokenCache | None:
        """Return the ``keep_tokens`` for ``analyze``: the cache that keeps its ids (None without --store-tokens)."""
        from .token_cache import TokenCache

        if self.setup.tokens is None or self.setup.tokens.tokenizer is None:  # ids read as they are: none to keep
            return None
        self.caches.append(TokenCache(out, self.comm, self.setup.special_tokens))
        return self.caches[-1]

    def __call__(self, out: PlanDir, files: list[dict], owned: OwnedMicrobatches,
                 index_starts: np.ndarray) -> StoreResult:
        """Return what was stored, after writing the data shards of ``owned`` (collective)."""
        from .plan import StorePlan

        cache = self.caches[-1] if self.caches else None
        if cache is not None:
            cache.share()
        stored = materialize(self.comm, out, owned, StorePlan(self.setup, files, index_starts, cache))
        self.plans -= 1
        if cache is not None and self.plans <= 0:
            self.comm.barrier()  # every rank has read the ids it needed
            cache.remove()
        tokens = self.setup.tokens
        if tokens is not None:
            stored.tokens = {
                "column": TOKENS_COLUMN, "source_column": tokens.column,
                "tokenizer": tokens.tokenizer_file or None,
                "special_tokens": self.setup.special_tokens, "truncated_to": tokens.truncate or None,
                "note": "the ids the size counted: len(input_ids) == size",
            }
            if tokens.labels:
                stored.tokens["labels"] = LABELS_COLUMN  # aligned to input_ids, -100 where no target
        if owned.ranges is not None:
            # which stored columns hold a piece's range only (the others hold the whole sample)
            pieces = self.setup.cut_columns + _token_columns(tokens)
            stored.pieces = [c for c in stored.columns if c in pieces]
        return stored


def prepare(comm: Comm, opts: StoreOptions, plan: PlanOptions, tokenizer_path: str | None,
            renames: list[dict[str, str] | None] | None = None) -> Store:
    """Return the ``Store`` for ``write_index``, checking the options collectively.

    ``plan``: what the plan measures (column, size, tokenizer) and how it packs (``--oversize
    truncate`` cuts stored ids to the truncated size); ``renames`` per input file ``{plan
    column: input column}`` (a mixture source's own ``column``).
    """
    from .plan import StoreSetup

    tokens = comm.collectively(token_ids_options, opts, plan, tokenizer_path)
    # a split plan's pieces are ranges of what the size counted: where that is the column's own values
    # (characters, elements, bytes), a stored copy of that column is cut to them
    measured = plan.analyze
    kind = size_kind(measured.size)
    cut: tuple[str, ...] = (measured.column,) if kind is not None and kind.cuts_column and measured.column else ()
    if cut and measured.shape is not None:  # a labels column is cut with the token ids it labels
        cut = (*cut, *(c for c in measured.shape.stored_columns() if c not in cut))
    return Store(comm, StoreSetup(opts, tokens, measured.special_tokens, renames, cut, measured.size))
