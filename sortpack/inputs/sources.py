"""Input discovery and reading: files, directories and globs of Parquet, Arrow IPC/Feather,
JSONL and CSV, split into units (row groups, record batches, whole files)."""
from __future__ import annotations

import glob
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

from ..errors import SortpackError, one_line

FORMATS = ("parquet", "arrow", "jsonl", "csv")
_EXTENSIONS = {
    ".parquet": "parquet", ".pq": "parquet",
    ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
    ".csv": "csv",
}


@dataclass
class SourceFile:
    """One input file: its format, byte size and units (row groups / batches / whole file)."""

    path: str
    format: str
    bytes: int
    # rows per unit, or None where the format does not say without parsing (jsonl, csv)
    unit_rows: list[int] | None = field(default=None)
    # bytes per unit (all columns) where the metadata says: uncompressed page bytes for
    # Parquet (dictionary-encoded values decode to more), batch bytes for Arrow files
    unit_bytes: list[int] | None = field(default=None)
    # rows estimated from the file's head where the format does not say (jsonl, csv): exact
    # for a file shorter than the head; weighs ranks' shares and sizes progress totals in rows
    est_rows: int | None = field(default=None)

    @property
    def num_units(self) -> int:
        """Return the number of units this file splits into."""
        return len(self.unit_rows) if self.unit_rows is not None else 1

    def fingerprint(self, rows: int) -> dict:
        """Return the manifest's record of this file."""
        return {"path": self.path, "format": self.format, "rows": int(rows), "bytes": self.bytes}


def _format_of(path: str, forced: str) -> str | None:
    if forced != "auto":
        return forced
    return _EXTENSIONS.get(Path(path).suffix.lower())


def expand_inputs(inputs: list[str], input_format: str = "auto", split: str | None = None) -> list[tuple[str, str]]:
    """Return (path, format) of every input file, in sample-id order.

    Files keep command-line order; directories expand recursively in sorted path order
    (files of unknown extension skipped); globs expand in sorted order. A Hugging Face
    ``save_to_disk`` directory is its ``data-*.arrow`` files in ``state.json`` order (its JSON
    metadata is no data); a ``DatasetDict`` directory is the dataset of split ``split``.
    """
    if input_format not in ("auto",) + FORMATS:
        raise SortpackError(f"--input-format: unknown format {input_format!r}")
    if not inputs:
        raise SortpackError("no input files given")
    out: list[tuple[str, str]] = []
    used_split = False
    for item in inputs:
        if os.path.isdir(item):
            groups = []  # (sort key, files in order): a Hugging Face dataset keeps its own order
            for root, dirs, files in os.walk(item):
                hf = hf_dataset_files(root, split)
                if hf is not None:
                    used_split |= os.path.isfile(os.path.join(root, HF_DICT))
                    groups.append((root + os.sep, [(p, "arrow") for p in hf]))
                    dirs[:] = []
                    continue
                dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
                for name in files:
                    if name.startswith((".", "_")):
                        continue
                    p = os.path.join(root, name)
                    fmt = _format_of(p, input_format)
                    if fmt is not None:
                        check_input_path(p)
                        groups.append((p, [(p, fmt)]))
            if not groups:
                raise SortpackError(f"{item}: directory holds no parquet, arrow, jsonl or csv files")
            for _, group in sorted(groups, key=lambda g: g[0]):
                out.extend(group)
        elif os.path.lexists(item) and not os.path.isdir(item):
            check_input_path(item)
            fmt = _format_of(item, input_format)
            if fmt is None:
                raise SortpackError(
                    f"{item}: cannot tell the format from the extension (use --input-format)")
            out.append((item, fmt))
        elif glob.has_magic(item):
            matches = sorted(p for p in glob.glob(item, recursive=True) if not os.path.isdir(p))
            if not matches:
                raise SortpackError(f"{item}: no file matches this pattern")
            for p in matches:
                check_input_path(p)
                fmt = _format_of(p, input_format)
                if fmt is None:
                    raise SortpackError(f"{p}: cannot tell the format from the extension (use --input-format)")
                out.append((p, fmt))
        else:
            raise SortpackError(f"{item}: no such file or directory")
    if split is not None and not used_split:
        raise SortpackError(f"--split {split}: no input is a Hugging Face DatasetDict directory "
                            f"(one with {HF_DICT})")
    return [(os.path.abspath(p), f) for p, f in out]


_NOT_REGULAR = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"))


def check_input_path(path: str) -> None:
    """Raise SortpackError unless ``path`` names a regular file (after symlinks) by a UTF-8 name.

    A FIFO or a device would block or never end when opened; a name that is not UTF-8
    cannot be recorded in the manifest (JSON) nor handed to Arrow.
    """
    raw = os.fsencode(path)
    shown = raw.decode("utf-8", "backslashreplace")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SortpackError(f"{shown}: the file name is not valid UTF-8; rename the file") from None
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise SortpackError(f"{shown}: cannot open ({exc.strerror or one_line(exc)})") from None
    if not stat.S_ISREG(mode):
        what = next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")
        raise SortpackError(f"{shown}: {what}, not a regular file; sortpack reads only regular files")


def check_table(table: pa.Table, src: SourceFile, row0: int = 0) -> None:
    """Raise SortpackError naming the file (and line or row) when a column read from it is malformed.

    Arrow's full validation: offsets in bounds and increasing (a corrupt offset would make
    the compute kernels read outside the buffers) and strings valid UTF-8 (invalid bytes
    pass JSON and Parquet readers and fail only in a tokenizer or at training time).
    ``row0`` is the row of the file at which ``table`` starts.
    """
    for name, col in zip(table.column_names, table.columns):
        at = row0
        for chunk in col.chunks:
            try:
                chunk.validate(full=True)
            except pa.ArrowException as exc:
                raise SortpackError(_invalid(src, name, chunk, at, exc)) from None
            at += len(chunk)


def _invalid(src: SourceFile, name: str, chunk: pa.Array, row0: int, exc: Exception) -> str:
    """Return the one-line message for a chunk that failed validation."""
    t = chunk.type
    text = pa.types.is_string(t) or pa.types.is_large_string(t)
    if text and "utf8" in str(exc).lower():
        values = chunk.view(pa.large_binary() if pa.types.is_large_string(t) else pa.binary()).to_pylist()
        for r, v in enumerate(values):
            try:
                if v is not None:
                    v.decode("utf-8")
            except UnicodeDecodeError:
                where = f"line {_jsonl_line(src.path, row0 + r)}" if src.format == "jsonl" else f"row {row0 + r}"
                return f"{src.path}: {where}: column {name!r} is not valid UTF-8 text"
    return f"{src.path}: corrupt {src.format} data in column {name!r} ({one_line(exc)})"


def _jsonl_line(path: str, row: int) -> int | str:
    """Return the 1-based line of row ``row`` of a JSONL file (blank lines hold no row)."""
    seen = -1
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                seen += 1
                if seen == row:
                    return n
    return f"? (row {row})"


def _first_bad_line(path: str) -> int | None:
    """Return the 1-based number of the first line that is not UTF-8 (None: all are)."""
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return n
    return None


HF_STATE = "state.json"  # datasets.Dataset.save_to_disk: lists the data files in order
HF_DICT = "dataset_dict.json"  # datasets.DatasetDict.save_to_disk: lists the splits


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise SortpackError(f"{path}: unreadable ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise SortpackError(f"{path}: expected a JSON object")
    return data


def hf_dataset_files(directory: str, split: str | None = None) -> list[str] | None:
    """Return the data files of a Hugging Face ``save_to_disk`` directory in row order.

    None when ``directory`` is not one. A ``DatasetDict`` directory gives the files of
    ``split``, and without one (or with an unknown one) raises an error listing the splits.
    """
    dict_json = os.path.join(directory, HF_DICT)
    if os.path.isfile(dict_json):
        splits = _read_json(dict_json).get("splits")
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
            raise SortpackError(f"{dict_json}: no 'splits' list")
        names = ", ".join(splits)
        if split is None:
            raise SortpackError(f"{directory}: a Hugging Face DatasetDict of splits {names}; "
                                f"choose one with --split")
        if split not in splits:
            raise SortpackError(f"--split {split}: {directory} has splits {names}")
        files = hf_dataset_files(os.path.join(directory, split))
        if files is None:
            raise SortpackError(f"{os.path.join(directory, split)}: split {split!r} has no {HF_STATE}")
        return files
    state_json = os.path.join(directory, HF_STATE)
    if not os.path.isfile(state_json):
        return None
    entries = _read_json(state_json).get("_data_files")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "filename" in e for e in entries):
        raise SortpackError(f"{state_json}: no '_data_files' list of file names")
    files = [os.path.join(directory, e["filename"]) for e in entries]
    for p in files:
        if not os.path.isfile(p):
            raise SortpackError(f"{p}: data file listed in {state_json} is missing")
    return files


def _arrow_reader(path: str):
    source = pa.memory_map(path, "r")
    try:
        return pa.ipc.open_file(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_stream(source)


DESCRIBE_CALLS = [0]  # files whose metadata this process opened (tests check the per-rank share)


def describe(path: str, fmt: str) -> SourceFile:
    """Return the SourceFile for one path, reading only metadata."""
    DESCRIBE_CALLS[0] += 1
    try:
        size = os.path.getsize(path)
        if fmt == "parquet":
            md = pq.ParquetFile(path).metadata
            groups = [md.row_group(i) for i in range(md.num_row_groups)]
            return SourceFile(path, fmt, size, [g.num_rows for g in groups], [g.total_byte_size for g in groups])
        if fmt == "arrow":
            reader = _arrow_reader(path)
            if isinstance(reader, pa.ipc.RecordBatchFileReader):
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
                return SourceFile(path, fmt, size, [b.num_rows for b in batches], [b.nbytes for b in batches])
            return SourceFile(path, fmt, size, None)
        return SourceFile(path, fmt, size, None, est_rows=_estimate_rows(path, fmt, size))
    except (pa.ArrowException, OSError) as exc:
        raise SortpackError(f"{path}: cannot read as {fmt} ({one_line(exc)})") from None


HEAD_BYTES = 1 << 16  # bytes of a jsonl/csv file read to estimate its rows


def _estimate_rows(path: str, fmt: str, size: int) -> int:
    """Return the rows of a jsonl/csv file estimated from its first HEAD_BYTES (exact for a shorter file)."""
    if size == 0:
        return 0
    with open(path, "rb") as fh:
        head = fh.read(HEAD_BYTES)
    lines = head.split(b"\n")
    complete = lines if len(head) >= size else lines[:-1]  # the last piece of a cut head is partial
    rows = sum(1 for line in complete if line.strip()) - (1 if fmt == "csv" else 0)
    if len(head) >= size:
        return max(rows, 0)
    used = len(head) - len(lines[-1])
    return max(1, round(max(rows, 1) * size / max(used, 1)))


def read_units(src: SourceFile, first: int, last: int, columns: list[str] | None,
               text_columns: list[str] | None = None) -> pa.Table:
    """Return units ``[first, last)`` of a file as one table (only ``columns`` when given).

    ``text_columns`` are read as strings where the format guesses types (csv).
    """
    if src.format in ("jsonl", "csv") and src.bytes == 0:
        # an empty shard (common among jsonl/csv part files) holds no rows, not an error
        return pa.table({c: pa.nulls(0) for c in columns or []})
    if columns is not None and src.format not in ("jsonl", "parquet"):
        # jsonl is checked after reading: a key may first appear past the block that
        # open_json guesses the schema from; parquet is checked on the file opened below
        _check_columns(src, file_columns(src), columns)
    try:
        if src.format == "parquet":
            pf = pq.ParquetFile(src.path, memory_map=True)
            if columns is not None:
                _check_columns(src, pf.schema_arrow.names, columns)
            # one row group at a time, kept as chunks: read_row_groups merges them, a
            # full copy of the column that costs 2-4x the read itself
            parts = [pf.read_row_group(i, columns=columns) for i in range(first, last)]
            return _checked(parts[0] if len(parts) == 1 else pa.concat_tables(parts), src, first)
        if src.format == "arrow":
            reader = _arrow_reader(src.path)
            if isinstance(reader, pa.ipc.RecordBatchFileReader):
                batches = [reader.get_batch(i) for i in range(first, last)]
                table = pa.Table.from_batches(batches, schema=reader.schema)
            else:
                table = reader.read_all()
            return _checked(table.select(columns) if columns is not None else table, src, first)
        if src.format == "jsonl":
            # read_json widens a column's type across blocks (int then float); the dataset
            # API fixes the type from the first block and fails on a later one
            table = _json_call(pjson.read_json, src)
            if columns is None:
                return _checked(table, src, 0)
            if table.num_rows == 0:
                return pa.table({c: pa.nulls(0) for c in columns})
            _check_columns(src, table.column_names, columns)
            return _checked(table.select(columns), src, 0)
        text = {c: pa.string() for c in text_columns or []}
        return pcsv.read_csv(src.path, convert_options=pcsv.ConvertOptions(include_columns=columns,
                                                                            column_types=text))
    except (pa.ArrowException, OSError) as exc:
        msg = one_line(exc)
        if src.format == "csv" and "utf8" in msg.lower():
            line = _first_bad_line(src.path)
            if line is not None:
                raise SortpackError(f"{src.path}: line {line}: not valid UTF-8 text ({msg})") from None
        raise SortpackError(f"{src.path}: cannot read as {src.format} ({msg})") from None


def _checked(table: pa.Table, src: SourceFile, first_unit: int) -> pa.Table:
    """Return ``table`` (units from ``first_unit`` on) after ``check_table``."""
    row0 = sum(src.unit_rows[:first_unit]) if src.unit_rows is not None else 0
    check_table(table, src, row0)
    return table


JSON_BLOCK = 1 << 20  # pyarrow's default block size; a longer line needs a larger block


def _json_call(fn, src: SourceFile):
    """Return ``fn(path, read_options)`` with a block size that holds the file's longest line.

    pyarrow's JSON reader fails on a line longer than its block ("straddling object"):
    retry with a block 8x larger, up to the whole file.
    """
    block = JSON_BLOCK
    while True:
        try:
            return fn(src.path, read_options=pjson.ReadOptions(block_size=block))
        except pa.ArrowInvalid as exc:
            if "straddl" not in str(exc) or block > src.bytes:
                raise
            block = min(block * 8, src.bytes + 1, 2**31 - 1)


PARTIAL_BATCH_ROWS = 1 << 16  # rows decoded at once when a rank reads part of a row group


def read_unit_rows(src: SourceFile, unit: int, lo: int, hi: int, columns: list[str] | None,
                   text_columns: list[str] | None = None) -> pa.Table:
    """Return rows ``[lo, hi)`` of one unit (row group or record batch) of a file whose rows are known.

    Ranks that share a unit read their own rows of it: an Arrow batch is sliced in place;
    a Parquet row group is decoded in batches up to ``hi``, keeping only ``[lo, hi)``, so
    memory stays bounded by the range and the batch, not the row group.
    """
    if src.format != "parquet" or src.unit_rows is None:
        return read_units(src, unit, unit + 1, columns, text_columns).slice(lo, hi - lo)
    try:
        pf = pq.ParquetFile(src.path, memory_map=True)
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
        check_table(table, src, sum(src.unit_rows[:unit]) + lo)
        return table
    except (pa.ArrowException, OSError) as exc:
        msg = " ".join(str(exc).split())
        raise SortpackError(f"{src.path}: cannot read as {src.format} ({msg})") from None


def _check_columns(src: SourceFile, names: list[str], columns: list[str]) -> None:
    missing = [c for c in columns if c not in names]
    if missing:
        raise SortpackError(f"{src.path}: no column {missing[0]!r} (columns: {', '.join(names)})")


def file_columns(src: SourceFile) -> list[str]:
    """Return the column names of a file (none for an empty jsonl/csv file)."""
    try:
        return _file_columns(src)
    except (pa.ArrowException, OSError) as exc:
        raise SortpackError(f"{src.path}: cannot read as {src.format} ({one_line(exc)})") from None


def _file_columns(src: SourceFile) -> list[str]:
    if src.format == "parquet":
        return pq.ParquetFile(src.path).schema_arrow.names
    if src.format == "arrow":
        return _arrow_reader(src.path).schema.names
    if src.bytes == 0:
        return []
    # the first block is enough for the names; types are left to read_units
    if src.format == "jsonl":
        return _json_call(pjson.open_json, src).schema.names
    return pcsv.open_csv(src.path).schema.names
