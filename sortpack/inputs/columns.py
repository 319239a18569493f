"""The columns a job will read, checked against every input file's schema before anything is measured.

``run`` and ``run --mixture`` read the text column (a text SPEC, ``--store-tokens``, a source's own
``column``) and the ``--store`` columns; a file without one would otherwise be found only when that
file is read (after analyze for ``--store``). ``input_columns`` lists every file's columns
(each rank opens a share of the files); ``missing_column`` is the pure check.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import SortpackError
from ..partition import even_range
from . import objects
from .discover import expand_inputs
from .formats import file_columns, open_source
from .size_kinds import reads_text as measured_on_text

if TYPE_CHECKING:
    from ..parallel import Comm

def reads_text(size: str, difficulty: str | None, store_tokens: bool = False) -> bool:
    """Return whether a run reads its text column (a text SPEC, or ``--store-tokens``)."""
    return measured_on_text(size, difficulty or size) or store_tokens


def resolve_column(names: list[str]) -> str | None:
    """Return the text column of a file with columns ``names``: the only one, else ``text``, else None."""
    if len(names) == 1:
        return names[0]
    return "text" if "text" in names else None


def input_columns(comm: Comm, groups: list[list[str]], input_format: str = "auto",
                  split: str | None = None) -> list[list[tuple[str, list[str]]]]:
    """Return, per group of inputs, each of its files' (path, column names); the same on every rank (collective)."""
    def expand():
        return [[p for p in expand_inputs(g, input_format, split)] for g in groups] if comm.is_root() else None

    expanded = comm.bcast_obj(comm.collectively(expand))
    flat = [(gi, path, fmt) for gi, files in enumerate(expanded) for path, fmt in files]
    # each rank the contiguous slice that analyze then describes: an object's first requests are then
    # made by the rank that keeps it (``objects.prefetch``)
    lo, hi = even_range(len(flat), rank=comm.rank, size=comm.size)

    def mine_columns() -> list[tuple[int, list[str]]]:
        objects.prefetch([flat[i][1] for i in range(lo, hi)])
        return [(i, file_columns(open_source(*flat[i][1:]))) for i in range(lo, hi)]

    mine = comm.collectively(mine_columns)
    names = dict(pair for part in comm.allgather_obj(mine) for pair in part)
    out: list[list[tuple[str, list[str]]]] = [[] for _ in groups]
    for i, (gi, path, _) in enumerate(flat):
        out[gi].append((path, names[i]))
    return out


def missing_column(files: list[tuple[str, list[str]]], column: str, why: str) -> str | None:
    """Return the one-line message for the first file without ``column`` (None: every file has it).

    A file with no columns at all (an empty JSONL or CSV file) holds no row to read and passes.
    """
    for path, names in files:
        if names and column not in names:
            return f"{path}: no column {column!r} ({why}; its columns: {', '.join(names)})"
    return None


def check_columns(files: list[tuple[str, list[str]]], wanted: list[tuple[str, str]], where: str = "") -> None:
    """Raise a one-line SortpackError (on every rank) for the first ``(column, why)`` a file lacks."""
    for column, why in wanted:
        message = missing_column(files, column, why)
        if message:
            raise SortpackError(f"{where}{message}", collective=True)


def first_columns(files: list[tuple[str, list[str]]]) -> list[str]:
    """Return the columns of the first file that has any (an empty JSONL/CSV file has none)."""
    return next((names for _, names in files if names), [])
