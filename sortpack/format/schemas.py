"""Arrow schemas of the three directory kinds (see docs/format.md)."""
from __future__ import annotations

import pyarrow as pa

from ..env import env_int
from .kinds import KIND_OF_FORMAT


def metrics_schema(difficulty_type: pa.DataType) -> pa.Schema:
    """Return the schema of a metrics table."""
    return pa.schema([("sample_id", pa.int64()), ("size", pa.int64()), ("difficulty", difficulty_type)])


def sorted_schema(difficulty_type: pa.DataType, pieces: bool = False) -> pa.Schema:
    """Return the schema of a sorted table (``pieces``: with ``begin``, a ``--oversize split`` piece's start)."""
    schema = metrics_schema(difficulty_type).append(pa.field("stage", pa.int16()))
    return schema.append(pa.field("begin", pa.int64())) if pieces else schema


# the largest input row count whose sample ids (0 .. rows - 1) all fit an int32
INT32_ID_ROWS = 2**31


def sample_id_type(source_rows: int) -> pa.DataType:
    """Return the Arrow type of an index's sample ids: int32 when every id fits, else int64.

    Sample ids are input row numbers, so the bound is the input's row count (known to every
    rank, independent of what ``--oversize skip`` drops). ``SORTPACK_TEST_ID_BITS=64`` (read
    here, when used) lets tests write the int64 form on small data.
    """
    if env_int("SORTPACK_TEST_ID_BITS") == 64:
        return pa.int64()
    return pa.int32() if int(source_rows) <= INT32_ID_ROWS else pa.int64()


def index_schema(rows: bool = False, id_type: pa.DataType | None = None, source: bool = False,
                 pieces: bool = False) -> pa.Schema:
    """Return the schema of an index's micro-batch table (``rows``: with ``row_splits``;
    ``id_type``: the sample ids' int32 or int64, default int64; ``source``: a mixture plan's
    per-micro-batch ``source``, the position of its source in the manifest's ``mixture``;
    ``pieces``: ``piece_begin``/``piece_end``, each sample's range in its source sample, present
    only when ``--oversize split`` cut a sample)."""
    fields = [
        ("microbatch", pa.int64()),
        ("sample_ids", pa.list_(id_type or pa.int64())),
        ("num_samples", pa.int32()),
        ("batch_size", pa.int32()),
        ("max_size", pa.int64()),
        ("padded_size", pa.int64()),
        ("tokens", pa.int64()),
        ("min_key", pa.float64()),
        ("max_key", pa.float64()),
        ("stage", pa.int16()),
    ]
    if rows:
        fields.append(("row_splits", pa.list_(pa.int32())))
    if source:
        fields.append(("source", pa.int16()))
    if pieces:
        fields += [("piece_begin", pa.list_(pa.int64())), ("piece_end", pa.list_(pa.int64()))]
    return pa.schema(fields)


def kind_schema(kind: str, difficulty_type: pa.DataType | None = None, rows: bool = False,
                id_type: pa.DataType | None = None, source: bool = False, pieces: bool = False) -> pa.Schema:
    """Return the shard schema of a ``kind`` directory (``difficulty_type``, ``rows``, ``id_type``, ``source``,
    ``pieces`` where they apply)."""
    difficulty_type = difficulty_type or pa.int64()
    if kind == "index":
        return index_schema(rows=rows, id_type=id_type, source=source, pieces=pieces)
    return metrics_schema(difficulty_type) if kind == "metrics" else sorted_schema(difficulty_type, pieces)


def schema_for(manifest: dict) -> pa.Schema:
    """Return the shard schema a manifest describes."""
    kind = manifest.get("_kind") or KIND_OF_FORMAT[manifest["format"]]
    described = manifest.get("schema", {})
    dtype = pa.float64() if described.get("difficulty") == "double" else pa.int64()
    # "list<item: int32>", or int64 past 2^31 input rows
    id_type = pa.int32() if "int32" in str(described.get("sample_ids", "")) else pa.int64()
    pieces = "piece_begin" in described or "begin" in described
    return kind_schema(kind, dtype, rows="row_splits" in described, id_type=id_type, source="source" in described,
                       pieces=pieces)


def schema_json(schema: pa.Schema) -> dict:
    """Return the manifest's ``schema`` object: column name to Arrow type string."""
    return {f.name: str(f.type) for f in schema}
