"""Full Arrow validation of what an input file gave, reported with the file and its line or row."""
from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from ..arrow_types import is_text
from ..errors import SortpackError, one_line
from .source_file import SourceFile


def check_table(table: pa.Table, src: SourceFile, row0: int = 0,
                position: Callable[[SourceFile, int], str] | None = None) -> None:
    """Raise SortpackError naming the file (and line or row) when a column read from it is malformed.

    Arrow's full validation: offsets in bounds and increasing (a corrupt offset would make
    the compute kernels read outside the buffers) and strings valid UTF-8 (invalid bytes
    pass JSON and Parquet readers and fail only in a tokenizer or at training time).

    Parameters
    ----------
    table : pa.Table
        What was read from ``src``.
    src : SourceFile
        The file it came from (named in the message).
    row0 : int
        The row of the file at which ``table`` starts.
    position : callable, optional
        How the file's format names a row in a message (``InputFormat.row_position``: a
        JSONL file's line); by default ``row N``.
    """
    name_row = position or _row
    for name, col in zip(table.column_names, table.columns):
        at = row0
        for chunk in col.chunks:
            try:
                chunk.validate(full=True)
            except pa.ArrowException as exc:
                bad = _first_bad_utf8(chunk, exc)
                if bad is not None:
                    raise SortpackError(f"{src.path}: {name_row(src, at + bad)}: column {name!r} is not valid "
                                        "UTF-8 text") from None
                raise SortpackError(f"{src.path}: corrupt {src.format} data in column {name!r} "
                                    f"({one_line(exc)})") from None
            at += len(chunk)


def _row(src: SourceFile, row: int) -> str:
    """Return how a message names row ``row`` of a file whose format says nothing finer."""
    return f"row {row}"


def _first_bad_utf8(chunk: pa.Array, exc: Exception) -> int | None:
    """Return the first row of a text chunk that is not UTF-8 when that is why it failed validation, else None."""
    t = chunk.type
    if is_text(t) and "utf8" in str(exc).lower():
        values = chunk.view(pa.large_binary() if pa.types.is_large_string(t) else pa.binary()).to_pylist()
        for r, v in enumerate(values):
            try:
                if v is not None:
                    v.decode("utf-8")
            except UnicodeDecodeError:
                return r
    return None


def jsonl_line(path: str, row: int) -> int | str:
    """Return the 1-based line of row ``row`` of a JSONL file (blank lines hold no row)."""
    seen = -1
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                seen += 1
                if seen == row:
                    return n
    return f"? (row {row})"


def first_non_utf8_line(path: str) -> int | None:
    """Return the 1-based number of the first line that is not UTF-8 (None: all are)."""
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return n
    return None
