"""The columnar input formats: Parquet (a unit per row group) and Arrow IPC (a unit per record batch of a file, the
whole of a stream), which say their rows from metadata alone.

A path may be an ``s3://`` or ``gs://`` URL (``inputs.objects``): the files are then read
through a random-access file over the object, so reading a row group or a record batch fetches
only its byte ranges, and an Arrow file is described from its footer and batch headers
(``arrow_file_batches``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .input_format import InputFormat, OnUse, check_columns
from .source_file import SourceFile

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from . import objects, validate
else:  # pyarrow loads when a file is opened (``input_format``)
    pa, pq = OnUse("pyarrow"), OnUse("pyarrow.parquet")
    objects, validate = OnUse(f"{__package__}.objects"), OnUse(f"{__package__}.validate")

__all__ = ["ArrowFormat", "ParquetFormat", "arrow_file_batches", "open_arrow_reader"]

PARTIAL_BATCH_ROWS = 1 << 16  # rows decoded at once when a rank reads part of a row group


def _parquet(path: str) -> pq.ParquetFile:
    """Return a ParquetFile over ``path``: memory-mapped when local, ranged reads (coalesced) for a URL."""
    if objects.is_url(path):
        return pq.ParquetFile(objects.open_input(path), pre_buffer=True)
    return pq.ParquetFile(path, memory_map=True)


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
            check_columns(src, pf.schema_arrow.names, columns)
        # one row group at a time, kept as chunks: read_row_groups merges them, a
        # full copy of the column that costs 2-4x the read itself
        parts = [pf.read_row_group(i, columns=columns) for i in range(first, last)]
        return self.checked(parts[0] if len(parts) == 1 else pa.concat_tables(parts), src, first)

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
            check_columns(src, pf.schema_arrow.names, columns)
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
            check_columns(src, self.columns(src), columns)
        reader = open_arrow_reader(src.path)
        if isinstance(reader, pa.ipc.RecordBatchFileReader):
            batches = [reader.get_batch(i) for i in range(first, last)]
            table = pa.Table.from_batches(batches, schema=reader.schema)
        else:
            table = reader.read_all()
        return self.checked(table.select(columns) if columns is not None else table, src, first)
