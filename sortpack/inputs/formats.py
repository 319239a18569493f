"""The input formats (Parquet, Arrow IPC file or stream, JSONL, CSV): one ``InputFormat`` class each, one registry.

A format is one class: its name and extensions, how a file is opened, listed and read, its
schema (``--store``), what its fingerprint hashes (``fingerprints.content_digest``) and how a
row is named in a message. ``READERS`` is the registry every other module asks (the CLI's
``--input-format`` choices, discovery by extension, the store, the fingerprints): adding a
format is adding its class to ``READERS``.

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

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..errors import SortpackError, one_line
from .megatron import MegatronFormat  # has InputFormat's methods: it cannot import this module
from .source_file import SourceFile


class _OnUse:
    """A module imported on its first attribute use: the CLI reads the format names without loading pyarrow."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    from . import objects, validate
else:  # --help lists the formats: pyarrow loads when a file is opened, not when the names are read
    pa, pcsv, pjson, pq = (_OnUse(m) for m in ("pyarrow", "pyarrow.csv", "pyarrow.json", "pyarrow.parquet"))
    objects, validate = _OnUse(f"{__package__}.objects"), _OnUse(f"{__package__}.validate")

HEAD_BYTES = 1 << 16  # bytes of a jsonl/csv file read to estimate its rows
JSON_BLOCK = 1 << 20  # pyarrow's default block size; a longer line needs a larger block
PARTIAL_BATCH_ROWS = 1 << 16  # rows decoded at once when a rank reads part of a row group


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
        return _cannot_read(src, exc)

    def schema(self, src: SourceFile, rows: int) -> pa.Schema | None:
        """Return the file's Arrow schema (``rows``: its recorded rows; None when the file holds no typed column)."""
        return read_units(src, 0, 1, None).schema

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


def _parquet(path: str) -> pq.ParquetFile:
    """Return a ParquetFile over ``path``: memory-mapped when local, ranged reads (coalesced) for a URL."""
    if objects.is_url(path):
        return pq.ParquetFile(objects.open_input(path), pre_buffer=True)
    return pq.ParquetFile(path, memory_map=True)


def _cannot_read(src: SourceFile, exc: BaseException) -> str:
    if objects.is_url(src.path) and objects.is_request_error(exc):
        return str(objects.object_error(src.path, exc))  # missing, denied or unreachable, not bad data
    return f"{src.path}: cannot read as {src.format} ({one_line(exc)})"


def _check_columns(src: SourceFile, names: list[str], columns: list[str]) -> None:
    missing = [c for c in columns if c not in names]
    if missing:
        raise SortpackError(f"{src.path}: no column {missing[0]!r} (columns: {', '.join(names)})")


def _checked(table: pa.Table, src: SourceFile, first_unit: int) -> pa.Table:
    """Return ``table`` (units from ``first_unit`` on) after ``check_table``."""
    row0 = sum(src.unit_rows[:first_unit]) if src.unit_rows is not None else 0
    validate.check_table(table, src, row0, reader_for(src.format).row_position)
    return table


class ParquetFormat(InputFormat):
    """Parquet: one unit per row group; a rank reads part of a row group in bounded batches."""

    name = "parquet"
    extensions = (".parquet", ".pq")
    footer_magic = b"PAR1"

    def schema(self, src: SourceFile, rows: int) -> pa.Schema:
        """Return the schema from the file's footer."""
        return pq.read_schema(objects.open_input(src.path))

    def open(self, path: str, size: int) -> SourceFile:
        """Return the SourceFile with the rows and uncompressed bytes of every row group."""
        md = _parquet(path).metadata
        groups = [md.row_group(i) for i in range(md.num_row_groups)]
        return SourceFile(path, self.name, size, [g.num_rows for g in groups], [g.total_byte_size for g in groups])

    def columns(self, src: SourceFile) -> list[str]:
        """Return the column names of the file's schema."""
        return _parquet(src.path).schema_arrow.names

    def read(self, src: SourceFile, first: int, last: int, columns: list[str] | None,
             text_columns: list[str] | None) -> pa.Table:
        """Return row groups ``[first, last)``, one chunk per row group."""
        pf = _parquet(src.path)
        if columns is not None:
            _check_columns(src, pf.schema_arrow.names, columns)
        # one row group at a time, kept as chunks: read_row_groups merges them, a
        # full copy of the column that costs 2-4x the read itself
        parts = [pf.read_row_group(i, columns=columns) for i in range(first, last)]
        return _checked(parts[0] if len(parts) == 1 else pa.concat_tables(parts), src, first)

    def read_rows(self, src: SourceFile, unit: int, rows: range, columns: list[str] | None,
                  text_columns: list[str] | None) -> pa.Table:
        """Return ``rows`` (a ``range``, step 1) of row group ``unit``, decoded in batches up to its end.

        Memory stays bounded by the range and the batch, not the row group.
        """
        if src.unit_rows is None:
            return super().read_rows(src, unit, rows, columns, text_columns)
        lo, hi = rows.start, rows.stop
        pf = _parquet(src.path)
        if columns is not None:
            _check_columns(src, pf.schema_arrow.names, columns)
        parts, at = [], 0
        for batch in pf.iter_batches(batch_size=PARTIAL_BATCH_ROWS, row_groups=[unit], columns=columns,
                                     use_threads=False):
            a, b = max(lo, at), min(hi, at + batch.num_rows)
            if b > a:
                parts.append(batch.slice(a - at, b - a))
            at += batch.num_rows
            if at >= hi:
                break
        if not parts:
            return pf.schema_arrow.empty_table() if columns is None else pf.schema_arrow.empty_table().select(columns)
        table = pa.Table.from_batches(parts)
        validate.check_table(table, src, sum(src.unit_rows[:unit]) + lo, self.row_position)
        return table


def open_arrow_reader(path: str) -> Any:
    """Return a reader of an Arrow IPC file (random access to batches) or, failing that, stream."""
    source = objects.open_input(path)
    try:
        return pa.ipc.open_file(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_stream(source)


def _table_field(buf: bytes, table: int, field: int) -> int | None:
    """Return the position of field ``field`` of the flatbuffer table at ``table``, or None when absent."""
    vtable = table - int.from_bytes(buf[table:table + 4], "little", signed=True)
    vsize = int.from_bytes(buf[vtable:vtable + 2], "little")
    at = 4 + 2 * field
    if at + 2 > vsize:
        return None
    off = int.from_bytes(buf[vtable + at:vtable + at + 2], "little")
    return table + off if off else None


def _deref(buf: bytes, pos: int) -> int:
    """Return where the uoffset stored at ``pos`` points."""
    return pos + int.from_bytes(buf[pos:pos + 4], "little")


def arrow_file_batches(fh: Any, size: int) -> list[tuple[int, int]] | None:
    """Return (rows, body bytes) of every record batch of an Arrow IPC file from its footer and batch headers.

    Reads the footer and each batch's metadata (a few hundred bytes each), never a batch
    body: on an object store, describing a file costs small ranged GETs, not the file.
    None when ``fh`` is no Arrow IPC file (a stream: read whole, as before).
    """
    tail = 10  # int32 footer length + "ARROW1"
    if size < tail + 8:
        return None
    end = fh.read_at(tail, size - tail)
    if not end.endswith(b"ARROW1"):
        return None
    length = int.from_bytes(end[:4], "little", signed=True)
    if length <= 0 or length + tail > size:
        return None
    foot = fh.read_at(length, size - tail - length)
    batches = _table_field(foot, _deref(foot, 0), 3)  # Footer.recordBatches: [Block]
    if batches is None:
        return []
    vec = _deref(foot, batches)
    out = []
    for k in range(int.from_bytes(foot[vec:vec + 4], "little")):
        at = vec + 4 + 24 * k  # Block {offset: long, metaDataLength: int, (pad), bodyLength: long}
        offset = int.from_bytes(foot[at:at + 8], "little", signed=True)
        meta_len = int.from_bytes(foot[at + 8:at + 12], "little", signed=True)
        body = int.from_bytes(foot[at + 16:at + 24], "little", signed=True)
        meta = fh.read_at(meta_len, offset)
        start = 8 if meta[:4] == b"\xff\xff\xff\xff" else 4  # continuation marker, then the length
        msg = meta[start:]
        header = _table_field(msg, _deref(msg, 0), 2)  # Message.header: RecordBatch
        if header is None:
            raise pa.ArrowInvalid(f"record batch {k}: message without a header")
        rows_at = _table_field(msg, _deref(msg, header), 0)  # RecordBatch.length
        out.append((int.from_bytes(msg[rows_at:rows_at + 8], "little", signed=True) if rows_at else 0, body))
    return out


class ArrowFormat(InputFormat):
    """Arrow IPC: a file is one unit per record batch; a stream (no footer) is one unit."""

    name = "arrow"
    extensions = (".arrow", ".feather", ".ipc")
    footer_magic = b"ARROW1"  # a file's; a stream has no footer (its digest hashes its ends)

    def schema(self, src: SourceFile, rows: int) -> pa.Schema:
        """Return the schema from the file's (or stream's) header."""
        return open_arrow_reader(src.path).schema

    def open(self, path: str, size: int) -> SourceFile:
        """Return the SourceFile with every batch's rows and bytes (none for a stream)."""
        if objects.is_url(path):
            with objects.open_input(path) as fh:
                blocks = arrow_file_batches(fh, size)
            if blocks is not None:
                return SourceFile(path, self.name, size, [r for r, _ in blocks], [b for _, b in blocks])
        reader = open_arrow_reader(path)
        if isinstance(reader, pa.ipc.RecordBatchFileReader):
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            return SourceFile(path, self.name, size, [b.num_rows for b in batches], [b.nbytes for b in batches])
        return SourceFile(path, self.name, size, None)

    def columns(self, src: SourceFile) -> list[str]:
        """Return the column names of the file's schema."""
        return open_arrow_reader(src.path).schema.names

    def read(self, src: SourceFile, first: int, last: int, columns: list[str] | None,
             text_columns: list[str] | None) -> pa.Table:
        """Return batches ``[first, last)`` of a file, or the whole stream."""
        if columns is not None:
            _check_columns(src, file_columns(src), columns)
        reader = open_arrow_reader(src.path)
        if isinstance(reader, pa.ipc.RecordBatchFileReader):
            batches = [reader.get_batch(i) for i in range(first, last)]
            table = pa.Table.from_batches(batches, schema=reader.schema)
        else:
            table = reader.read_all()
        return _checked(table.select(columns) if columns is not None else table, src, first)


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
        return read_units(src, 0, 1, None).schema if rows else None

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
            return fn(_input(src.path), read_options=opts)
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
            return _checked(table, src, 0)
        if table.num_rows == 0:
            return pa.table({c: pa.nulls(0) for c in columns})
        # columns are checked after reading: a key may first appear past the block that
        # open_json guesses the schema from
        _check_columns(src, table.column_names, columns)
        return _checked(table.select(columns), src, 0)


class CsvFormat(TextFormat):
    """CSV with a header line; ``text_columns`` are read as strings, not guessed (leading zeros stay)."""

    name = "csv"
    extensions = (".csv",)
    header_rows = 1

    def column_names(self, src: SourceFile) -> list[str]:
        """Return the header's names."""
        return pcsv.open_csv(_input(src.path)).schema.names

    def parse(self, src: SourceFile, columns: list[str] | None, text_columns: list[str] | None) -> pa.Table:
        """Return the file's rows (``text_columns`` as strings)."""
        if columns is not None:
            _check_columns(src, file_columns(src), columns)
        text = {c: pa.string() for c in text_columns or []}
        one_block = src.bytes <= pcsv.ReadOptions().block_size  # as JSON: no thread pool for one block
        return pcsv.read_csv(_input(src.path), read_options=pcsv.ReadOptions(use_threads=not one_block),
                             convert_options=pcsv.ConvertOptions(include_columns=columns, column_types=text))

    def read_error(self, src: SourceFile, exc: Exception) -> str:
        """Return the message for a failed read, naming the first line that is not UTF-8 where that is why."""
        msg = one_line(exc)
        if "utf8" in msg.lower() and not objects.is_url(src.path):
            line = validate.first_non_utf8_line(src.path)
            if line is not None:
                return f"{src.path}: line {line}: not valid UTF-8 text ({msg})"
        return _cannot_read(src, exc)


# the registry: every input format by name, in the order --input-format lists them
READERS: dict[str, InputFormat] = {r.name: r for r in (ParquetFormat(), ArrowFormat(), JsonlFormat(), CsvFormat(),
                                                        cast(InputFormat, MegatronFormat()))}


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
        raise SortpackError(_cannot_read(SourceFile(path, fmt, 0), exc)) from None


def file_columns(src: SourceFile) -> list[str]:
    """Return the column names of a file (none for an empty jsonl/csv file)."""
    try:
        return reader_for(src.format).columns(src)
    except (pa.ArrowException, OSError) as exc:
        raise SortpackError(_cannot_read(src, exc)) from None


def read_units(src: SourceFile, first: int, last: int, columns: list[str] | None,
               text_columns: list[str] | None = None) -> pa.Table:
    """Return units ``[first, last)`` of a file as one table (only ``columns`` when given).

    ``text_columns`` are read as strings where the format guesses types (csv).
    """
    reader = reader_for(src.format)
    try:
        return reader.read(src, first, last, columns, text_columns)
    except (pa.ArrowException, OSError) as exc:
        raise SortpackError(reader.read_error(src, exc)) from None


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
