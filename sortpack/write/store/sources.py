"""The plan's input files for storing: described, checked against their fingerprints, and the stored columns' schema."""
from __future__ import annotations

import os

import pyarrow as pa

from ...arrow_types import plain_type
from ...errors import SortpackError, one_line
from ...inputs.fingerprints import check_unchanged
from ...inputs.formats import open_source, reader_for
from ...inputs.objects import is_url
from ...inputs.renames import read_names
from ...inputs.source_file import SourceFile
from ...parallel import Comm
from ...partition import round_robin


def check_fingerprint(src: SourceFile, entry: dict) -> None:
    """Raise when a file differs from its manifest entry (size, mtime, digest, rows: ``check_unchanged``)."""
    check_unchanged(entry, src.bytes, sum(src.unit_rows) if src.unit_rows is not None else None)


def describe_files(comm: Comm, files: list[dict]) -> list[SourceFile]:
    """Return every input file of the plan described (each rank checks its ``round_robin`` share)."""
    mine, err = [], None
    try:
        for i in round_robin(len(files), rank=comm.rank, size=comm.size):
            entry = files[i]
            if not is_url(entry["path"]) and not os.path.isfile(entry["path"]):  # an object: the HEAD says
                raise SortpackError(f"{entry['path']}: input file of the plan is missing")
            src = open_source(entry["path"], entry["format"])
            check_fingerprint(src, entry)
            mine.append((i, src))
    except SortpackError as exc:
        err = exc
    comm.check(err)
    found = dict(pair for part in comm.allgather_obj(mine) for pair in part)
    return [found[i] for i in range(len(files))]


def _file_schema(src: SourceFile, entry: dict, columns: list[str],
                 rename: dict[str, str] | None = None) -> pa.Schema | None:
    """Return one file's schema of the stored columns, by their plan names (None for an empty text file).

    ``rename`` maps a plan column to the input column this file gives it from (a mixture source's ``column``).
    """
    try:
        schema = reader_for(src.format).schema(src, int(entry["rows"]))
        if schema is None:
            return None
    except (pa.ArrowException, OSError) as exc:
        raise SortpackError(f"{src.path}: cannot read as {src.format} ({one_line(exc)})") from None
    names = read_names(columns, rename) or []
    missing = [c for c in names if c not in schema.names]
    if missing:
        raise SortpackError(f"{src.path}: no column {missing[0]!r} to store (columns: {', '.join(schema.names)})")
    return pa.schema([pa.field(c, plain_type(schema.field(n).type)) for c, n in zip(columns, names)])


def output_schema(comm: Comm, srcs: list[SourceFile], files: list[dict], columns: list[str],
                  renames: list[dict[str, str] | None] | None = None) -> pa.Schema:
    """Return the stored columns' schema, unified over every input file in file order (``renames``: per file)."""
    mine: list[tuple[int, pa.Schema | None]] = []
    err = None
    try:
        mine = [(i, _file_schema(srcs[i], files[i], columns, renames[i] if renames else None))
                for i in round_robin(len(srcs), rank=comm.rank, size=comm.size)]
    except SortpackError as exc:
        err = exc
    comm.check(err)
    found = dict(pair for part in comm.allgather_obj(mine) for pair in part)
    schemas = [found[i] for i in range(len(srcs)) if found[i] is not None]
    if not schemas:
        return pa.schema([pa.field(c, pa.null()) for c in columns])
    try:
        unified = pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowException, TypeError) as exc:
        raise SortpackError(f"--store: input files disagree on a column's type ({one_line(exc)})",
                            collective=True) from None
    return pa.schema([unified.field(c) for c in columns])
