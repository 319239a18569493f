"""What each rank reads, asks and keeps in the store shuffle: pure planning, no communicator.

``materialize`` calls these between its collectives; each takes plain data (and ``rank=``,
``size=`` where it deals), so the plan is tested without MPI.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...inputs.source_file import SourceFile
from ...partition import rank_of, reader_blocks
from .options import StoreOptions, TokenIds
from .rows import RowPositions

if TYPE_CHECKING:
    from ..owned import PieceRanges
    from .token_cache import TokenCache


@dataclass(frozen=True)
class StoreSetup:
    """How a job stores its columns (``prepare`` checks it): the options, where stored token ids come from,
    whether their counts include special tokens, per input file ``{plan column: input column}`` (a
    mixture source's own ``column``), and, for ``--oversize split``, the stored columns cut to each
    piece's range and the size kind the ranges count (``bytes``: a text's UTF-8 bytes)."""

    options: StoreOptions
    tokens: TokenIds | None = None
    special_tokens: bool = True
    renames: list[dict[str, str] | None] | None = None
    cut_columns: tuple[str, ...] = ()
    cut_unit: str = "length"


@dataclass(frozen=True)
class StorePlan:
    """What one plan's store reads and how its data shards line up: the job's setup, the input files
    (fingerprint entries), each index shard's first micro-batch (the data shards follow them), and the
    token ids ``analyze`` kept (None: tokenized again where needed)."""

    setup: StoreSetup
    files: list[dict]
    index_starts: np.ndarray
    cache: TokenCache | None = None


@dataclass(frozen=True)
class MemoryBudget:
    """How ``--memory-limit`` is spent per rank.

    A round's rows live up to three times (read, sent, received): an eighth of the limit each
    (``round``). What was received stays until the shards are written: half the limit in memory
    (``held``), spilled past it, in batches of at most a sixteenth of a round (``spill_batch``)
    so the pages of finished ones are released.
    """

    limit: int
    round: int
    held: int
    spill_batch: int


def memory_budget(limit: int, piece: int) -> MemoryBudget:
    """Return how a rank spends ``limit`` bytes (``piece``: the most bytes of one gathered array)."""
    budget = max(1, limit // 8)
    return MemoryBudget(limit, budget, max(1, limit // 2), min(piece, max(1 << 20, budget // 16)))


@dataclass(frozen=True)
class ReadPlan:
    """The input units one rank reads, in global order, and where every rank's rows start."""

    units: list[tuple[int, int]]  # (file, unit)
    reader_starts: np.ndarray  # first global row each rank reads, plus the end
    first_row: int  # this rank's


def file_units(srcs: list[SourceFile], files: list[dict]) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Return every input unit as (file, unit) in global order, and its rows (from the fingerprint)."""
    units = [(i, u) for i, s in enumerate(srcs) for u in range(s.num_units)]
    rows = [int(files[i]["rows"]) if (known := srcs[i].unit_rows) is None else known[u] for i, u in units]
    return units, np.array(rows, dtype=np.int64)


def read_plan(units: list[tuple[int, int]], unit_rows: np.ndarray, *, rank: int, size: int) -> ReadPlan:
    """Return the units rank ``rank`` of ``size`` reads: contiguous blocks of whole units balanced by rows."""
    bounds, starts = reader_blocks(unit_rows, size=size)
    return ReadPlan(units[int(bounds[rank]):int(bounds[rank + 1])], starts, int(starts[rank]))


def position_requests(ids: np.ndarray, pos0: int, reader_starts: np.ndarray,
                      ranges: PieceRanges | None, size: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Return what this rank tells the readers, grouped by reader, and how many go to each.

    ``ids`` are this rank's samples in plan order from output position ``pos0``; each reader
    learns (id, position) for its rows, and with ``--oversize split`` the piece's range.
    """
    positions = pos0 + np.arange(len(ids), dtype=np.int64)
    to_reader = rank_of(ids, reader_starts)
    order = np.argsort(to_reader, kind="stable")
    asked = {"id": np.ascontiguousarray(ids[order], dtype=np.int64), "pos": positions[order]}
    if ranges is not None:
        asked.update({"begin": ranges.begin[order], "end": ranges.end[order]})
    return asked, np.bincount(to_reader, minlength=size)


def row_uses(got: dict[str, np.ndarray], first_row: int, cut: tuple[str, ...] | None) -> RowPositions:
    """Return a reader's requests as every (row, position) pair, by local row then position.

    A mixture plan may use a row more than once, a split plan cut it into pieces; ``cut`` (the
    columns stored cut to a piece, None when the plan has no pieces) goes with the ranges.
    """
    by_row = np.lexsort((got["pos"], got["id"]))
    uses = RowPositions(got["id"][by_row] - first_row, got["pos"][by_row])
    if cut is not None:
        uses.begin, uses.end, uses.cut = got["begin"][by_row], got["end"][by_row], cut
    return uses
