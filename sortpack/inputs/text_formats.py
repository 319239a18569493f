"""The line-based input formats: ``TextFormat`` (one unit, the whole file; rows estimated from its head) and its
two, JSON lines and CSV. A new line-based format is a ``TextFormat`` with ``column_names`` and ``parse``."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import one_line
from .input_format import InputFormat, OnUse, cannot_read, check_columns, input_of
from .source_file import SourceFile

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson

    from . import objects, validate
else:  # pyarrow loads when a file is opened (``input_format``)
    pa, pcsv, pjson = OnUse("pyarrow"), OnUse("pyarrow.csv"), OnUse("pyarrow.json")
    objects, validate = OnUse(f"{__package__}.objects"), OnUse(f"{__package__}.validate")

__all__ = ["CsvFormat", "JsonlFormat", "TextFormat", "estimate_rows"]

HEAD_BYTES = 1 << 16  # bytes of a jsonl/csv file read to estimate its rows
JSON_BLOCK = 1 << 20  # pyarrow's default block size; a longer line needs a larger block


def estimate_rows(path: str, size: int, header_rows: int = 0) -> int:
    """Return the rows of a text file estimated from its first HEAD_BYTES (exact for a shorter file).

    Parameters
    ----------
    path, size : str, int
        The file and its bytes.
    header_rows : int
        Non-blank lines at the top that hold no row (1 for CSV's header).
    """
    if size == 0:
        return 0
    head = objects.read_head(path, HEAD_BYTES)
    lines = head.split(b"\n")
    complete = lines if len(head) >= size else lines[:-1]  # the last piece of a cut head is partial
    rows = sum(1 for line in complete if line.strip()) - header_rows
    if len(head) >= size:
        return max(rows, 0)
    used = len(head) - len(lines[-1])
    return max(1, round(max(rows, 1) * size / max(used, 1)))


class TextFormat(InputFormat):
    """A line-based format: one unit (the whole file), rows estimated from its head, empty file = no rows.

    A subclass says how the file's column names are read (``column_names``) and how it parses
    (``parse``); the rest (rows, schema, the whole-file digest, empty files) is here.
    """

    header_rows = 0
    digest = "file"

    def schema(self, src: SourceFile, rows: int) -> pa.Schema | None:
        """Return the schema of the parsed file (None without rows: an empty file types no column)."""
        return self.read_checked(src, 0, 1, None).schema if rows else None

    def open(self, path: str, size: int) -> SourceFile:
        """Return the SourceFile with the rows estimated from the file's head."""
        return SourceFile(path, self.name, size, None, est_rows=estimate_rows(path, size, self.header_rows))

    def columns(self, src: SourceFile) -> list[str]:
        """Return the column names (none for an empty file)."""
        # the first block is enough for the names; types are left to read
        return self.column_names(src) if src.bytes else []

    def column_names(self, src: SourceFile) -> list[str]:
        """Return the column names of a non-empty file (its first block is enough)."""
        raise NotImplementedError

    def read(self, src: SourceFile, first: int, last: int, columns: list[str] | None,
             text_columns: list[str] | None) -> pa.Table:
        """Return the whole file (an empty file: no rows, ``columns`` all null)."""
        if src.bytes == 0:
            # an empty shard (common among jsonl/csv part files) holds no rows, not an error
            return pa.table({c: pa.nulls(0) for c in columns or []})
        return self.parse(src, columns, text_columns)

    def parse(self, src: SourceFile, columns: list[str] | None, text_columns: list[str] | None) -> pa.Table:
        """Return the rows of a non-empty file (only ``columns`` when given; ``text_columns`` as strings)."""
        raise NotImplementedError


def _json_call(fn: Callable[..., Any], src: SourceFile) -> Any:
    """Return ``fn(path, read_options)`` with a block size that holds the file's longest line.

    pyarrow's JSON reader fails on a line longer than its block ("straddling object"):
    retry with a block 8x larger, up to the whole file.
    """
    block = JSON_BLOCK
    while True:
        # pyarrow parses blocks in parallel: a file of one block gains nothing from its thread
        # pool and pays a hand-off per file (milliseconds each on loaded cores, per tiny object)
        opts = pjson.ReadOptions(block_size=block, use_threads=src.bytes > block)
        try:
            return fn(input_of(src.path), read_options=opts)
        except pa.ArrowInvalid as exc:
            if "straddl" not in str(exc) or block > src.bytes:
                raise
            block = min(block * 8, src.bytes + 1, 2**31 - 1)


class JsonlFormat(TextFormat):
    """JSON lines: one object per line; a column's type widens across blocks (int then float)."""

    name = "jsonl"
    extensions = (".jsonl", ".ndjson", ".json")

    def row_position(self, src: SourceFile, row: int) -> str:
        """Return the line of row ``row`` (blank lines hold no row)."""
        return f"line {validate.jsonl_line(src.path, row)}"

    def column_names(self, src: SourceFile) -> list[str]:
        """Return the keys of the objects in the first block."""
        return _json_call(pjson.open_json, src).schema.names

    def parse(self, src: SourceFile, columns: list[str] | None, text_columns: list[str] | None) -> pa.Table:
        """Return the file's rows, each column's type widened over all blocks."""
        # read_json widens a column's type across blocks (int then float); the dataset
        # API fixes the type from the first block and fails on a later one
        table = _json_call(pjson.read_json, src)
        if columns is None:
            return self.checked(table, src, 0)
        if table.num_rows == 0:
            return pa.table({c: pa.nulls(0) for c in columns})
        # columns are checked after reading: a key may first appear past the block that
        # open_json guesses the schema from
        check_columns(src, table.column_names, columns)
        return self.checked(table.select(columns), src, 0)


class CsvFormat(TextFormat):
    """CSV with a header line; ``text_columns`` are read as strings, not guessed (leading zeros stay)."""

    name = "csv"
    extensions = (".csv",)
    header_rows = 1

    def column_names(self, src: SourceFile) -> list[str]:
        """Return the header's names."""
        return pcsv.open_csv(input_of(src.path)).schema.names

    def parse(self, src: SourceFile, columns: list[str] | None, text_columns: list[str] | None) -> pa.Table:
        """Return the file's rows (``text_columns`` as strings)."""
        if columns is not None:
            check_columns(src, self.columns(src), columns)
        text = {c: pa.string() for c in text_columns or []}
        one_block = src.bytes <= pcsv.ReadOptions().block_size  # as JSON: no thread pool for one block
        return pcsv.read_csv(input_of(src.path), read_options=pcsv.ReadOptions(use_threads=not one_block),
                             convert_options=pcsv.ConvertOptions(include_columns=columns, column_types=text))

    def read_error(self, src: SourceFile, exc: Exception) -> str:
        """Return the message for a failed read, naming the first line that is not UTF-8 where that is why."""
        msg = one_line(exc)
        if "utf8" in msg.lower() and not objects.is_url(src.path):
            line = validate.first_non_utf8_line(src.path)
            if line is not None:
                return f"{src.path}: line {line}: not valid UTF-8 text ({msg})"
        return cannot_read(src, exc)
