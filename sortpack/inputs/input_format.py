"""The base of the input formats: ``InputFormat``, what a format class answers, and the helpers every format uses.

A format is one class (``formats.READERS`` lists them): its name and extensions, how a file is
opened, listed and read, its schema (``--store``), what its fingerprint hashes
(``fingerprints.content_digest``) and how a row is named in a message. The columnar formats
(Parquet, Arrow IPC) are in ``columnar_formats``, the line-based ones (JSONL, CSV) in
``text_formats``.

Importing this module loads no pyarrow (``--help`` lists the formats): pyarrow loads when a
file is opened.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..errors import SortpackError, one_line
from .source_file import SourceFile

__all__ = ["InputFormat", "OnUse", "cannot_read", "check_columns", "input_of"]


class OnUse:
    """A module imported on its first attribute use: the CLI reads the format names without loading pyarrow."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


if TYPE_CHECKING:
    import pyarrow as pa

    from . import objects, validate
else:  # --help lists the formats: pyarrow loads when a file is opened, not when the names are read
    pa = OnUse("pyarrow")
    objects, validate = OnUse(f"{__package__}.objects"), OnUse(f"{__package__}.validate")


class InputFormat:
    """How files of one format are opened, listed, read, fingerprinted and named in messages (one class per format)."""

    name = ""
    extensions: tuple[str, ...] = ()
    # the fingerprint's digest (fingerprints.content_digest): "file" hashes every byte (a text
    # format, parsed whole anyway); "footer" the footer that ends with ``footer_magic``
    digest = "footer"
    footer_magic = b""

    def open(self, path: str, size: int) -> SourceFile:
        """Return the SourceFile of ``path`` (``size`` bytes), reading only metadata."""
        raise NotImplementedError

    def columns(self, src: SourceFile) -> list[str]:
        """Return the column names of a file."""
        raise NotImplementedError

    def read(self, src: SourceFile, first: int, last: int, columns: list[str] | None,
             text_columns: list[str] | None) -> pa.Table:
        """Return units ``[first, last)`` of a file (only ``columns`` when given)."""
        raise NotImplementedError

    def read_rows(self, src: SourceFile, unit: int, rows: range, columns: list[str] | None,
                  text_columns: list[str] | None) -> pa.Table:
        """Return ``rows`` (a ``range``, step 1) of one unit: the whole unit read, then sliced."""
        return self.read(src, unit, unit + 1, columns, text_columns).slice(rows.start, len(rows))

    def read_error(self, src: SourceFile, exc: Exception) -> str:
        """Return the one-line message for a read of ``src`` that raised ``exc``."""
        return cannot_read(src, exc)

    def read_checked(self, src: SourceFile, first: int, last: int, columns: list[str] | None,
                     text_columns: list[str] | None = None) -> pa.Table:
        """Return ``read``'s units, a failed read as one SortpackError line (``read_error``)."""
        try:
            return self.read(src, first, last, columns, text_columns)
        except (pa.ArrowException, OSError) as exc:
            raise SortpackError(self.read_error(src, exc)) from None

    def checked(self, table: pa.Table, src: SourceFile, first_unit: int) -> pa.Table:
        """Return ``table`` (units from ``first_unit`` on) after ``validate.check_table``, rows named as the format
        names them."""
        row0 = sum(src.unit_rows[:first_unit]) if src.unit_rows is not None else 0
        validate.check_table(table, src, row0, self.row_position)
        return table

    def schema(self, src: SourceFile, rows: int) -> pa.Schema | None:
        """Return the file's Arrow schema (``rows``: its recorded rows; None when the file holds no typed column)."""
        return self.read_checked(src, 0, 1, None).schema

    def row_position(self, src: SourceFile, row: int) -> str:
        """Return how a message names row ``row`` of the file (a text format: its line)."""
        return f"row {row}"

    def footer_length(self, fh: Any, size: int) -> int | None:
        """Return the bytes at the end of the file that hold its footer (with its length and magic), or None."""
        tail = 4 + len(self.footer_magic)  # int32 footer length, then the magic
        if not self.footer_magic or size < tail:
            return None
        fh.seek(size - tail)
        end = fh.read(tail)
        if not end.endswith(self.footer_magic):
            return None  # an Arrow stream, or a file this reader would refuse anyway
        length = int.from_bytes(end[:4], "little", signed=True)
        if length <= 0 or length + tail > size:
            return None
        return length + tail


def _input(path: str) -> Any:
    """Return what pyarrow's readers open: a local path as is, a URL as a random-access file."""
    return objects.open_input(path) if objects.is_url(path) else path


def input_of(path: str) -> Any:
    """Return what pyarrow's readers open: a local path as is, a URL as a random-access file."""
    return objects.open_input(path) if objects.is_url(path) else path


def cannot_read(src: SourceFile, exc: BaseException) -> str:
    """Return the one-line message for a read of ``src`` that raised ``exc`` (an object store names the request)."""
    if objects.is_url(src.path) and objects.is_request_error(exc):
        return str(objects.object_error(src.path, exc))  # missing, denied or unreachable, not bad data
    return f"{src.path}: cannot read as {src.format} ({one_line(exc)})"


def check_columns(src: SourceFile, names: list[str], columns: list[str]) -> None:
    """Raise SortpackError (one line) for the first of ``columns`` the file's ``names`` lack."""
    missing = [c for c in columns if c not in names]
    if missing:
        raise SortpackError(f"{src.path}: no column {missing[0]!r} (columns: {', '.join(names)})")
