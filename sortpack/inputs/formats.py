"""The input formats (Parquet, Arrow IPC file or stream, JSONL, CSV, Megatron): one ``InputFormat`` class each, one
registry.

A format is one class (``input_format.InputFormat``: its name and extensions, how a file is
opened, listed and read, its schema (``--store``), what its fingerprint hashes
(``fingerprints.content_digest``) and how a row is named in a message); the shipped ones are in
``columnar_formats``, ``text_formats`` and ``megatron``. ``READERS`` is the registry every other module asks
(the CLI's ``--input-format`` choices, discovery by extension, the store, the fingerprints):
adding a format is adding its class to ``READERS``, here, beside which it may be written.

A file splits into units of rows: Parquet row groups, Arrow file record batches, or the
whole file where the format does not say its rows without parsing (Arrow streams, JSONL,
CSV). ``open_source`` reads only metadata; ``read_units`` and ``read_unit_rows`` read
rows. Every read is checked (``validate.check_table``) except CSV's, whose reader
validates its own output.

A path may be an ``s3://`` or ``gs://`` URL (``inputs.objects``): Parquet and Arrow IPC
files are then read through a random-access file over the object, so reading a row group
or a record batch fetches only its byte ranges; JSONL and CSV objects are read whole.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SortpackError
from .columnar_formats import ArrowFormat, ParquetFormat
from .input_format import InputFormat, OnUse, cannot_read
from .megatron import MegatronFormat
from .source_file import SourceFile
from .text_formats import CsvFormat, JsonlFormat

if TYPE_CHECKING:
    import pyarrow as pa

    from . import objects
else:  # pyarrow loads when a file is opened (``input_format``)
    pa, objects = OnUse("pyarrow"), OnUse(f"{__package__}.objects")

# the registry: every input format by name, in the order --input-format lists them
READERS: dict[str, InputFormat] = {r.name: r for r in (ParquetFormat(), ArrowFormat(), JsonlFormat(), CsvFormat(),
                                                        MegatronFormat())}


def format_names() -> tuple[str, ...]:
    """Return the names ``--input-format`` takes (besides auto), in the registry's order."""
    return tuple(READERS)


def reader_for(fmt: str) -> InputFormat:
    """Return the reader of input format ``fmt``."""
    try:
        return READERS[fmt]
    except KeyError:
        raise SortpackError(f"unknown input format {fmt!r} (formats: {', '.join(READERS)})") from None


def format_of(path: str, forced: str = "auto") -> str | None:
    """Return the input format of ``path``: ``forced`` unless auto, else by extension (None: unknown)."""
    if forced != "auto":
        return forced
    suffix = Path(path).suffix.lower()
    return next((r.name for r in READERS.values() if suffix in r.extensions), None)


def open_source(path: str, fmt: str) -> SourceFile:
    """Return the SourceFile of one input file of format ``fmt``, reading only its metadata."""
    reader = reader_for(fmt)
    try:
        return reader.open(path, objects.size_of(path))
    except SortpackError:
        raise
    except (pa.ArrowException, OSError) as exc:
        raise SortpackError(cannot_read(SourceFile(path, fmt, 0), exc)) from None


def file_columns(src: SourceFile) -> list[str]:
    """Return the column names of a file (none for an empty jsonl/csv file)."""
    try:
        return reader_for(src.format).columns(src)
    except (pa.ArrowException, OSError) as exc:
        raise SortpackError(cannot_read(src, exc)) from None


def read_units(src: SourceFile, first: int, last: int, columns: list[str] | None,
               text_columns: list[str] | None = None) -> pa.Table:
    """Return units ``[first, last)`` of a file as one table (only ``columns`` when given).

    ``text_columns`` are read as strings where the format guesses types (csv).
    """
    return reader_for(src.format).read_checked(src, first, last, columns, text_columns)


def read_unit_rows(src: SourceFile, unit: int, rows: range, columns: list[str] | None,
                   text_columns: list[str] | None = None) -> pa.Table:
    """Return ``rows`` (``range(lo, hi)``) of one unit (row group or record batch) of a file whose rows are known.

    Ranks that share a unit read their own rows of it: an Arrow batch is sliced in place;
    a Parquet row group is decoded in batches up to ``hi``, keeping only ``[lo, hi)``, so
    memory stays bounded by the range and the batch, not the row group.
    """
    reader = reader_for(src.format)
    try:
        return reader.read_rows(src, unit, rows, columns, text_columns)
    except (pa.ArrowException, OSError) as exc:
        raise SortpackError(reader.read_error(src, exc)) from None
