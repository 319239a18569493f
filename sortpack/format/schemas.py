"""Arrow schemas of the three directory kinds (see docs/format.md)."""
from __future__ import annotations

import pyarrow as pa

from ..env import env_int
from .kinds import KIND_OF_FORMAT


def _with_measures(schema: pa.Schema, measures: tuple[str, ...] | list[str]) -> pa.Schema:
    """Return ``schema`` with one int64 column per measure, in name order (none: ``schema`` itself)."""
    for name in sorted(measures):
        schema = schema.append(pa.field(name, pa.int64()))
    return schema


def metrics_schema(difficulty_type: pa.DataType, measures: tuple[str, ...] | list[str] = ()) -> pa.Schema:
    """Return the schema of a metrics table (``measures``: the per-sample measures' int64 columns)."""
    schema = pa.schema([("sample_id", pa.int64()), ("size", pa.int64()), ("difficulty", difficulty_type)])
    return _with_measures(schema, measures)


def sorted_schema(difficulty_type: pa.DataType, pieces: bool = False,
                  measures: tuple[str, ...] | list[str] = ()) -> pa.Schema:
    """Return the schema of a sorted table (``pieces``: with ``begin``, a ``--oversize split`` piece's start;
    ``measures``: the per-sample measures' int64 columns)."""
    schema = metrics_schema(difficulty_type).append(pa.field("stage", pa.int16()))
    schema = schema.append(pa.field("begin", pa.int64())) if pieces else schema
    return _with_measures(schema, measures)


# the fixed columns of each kind; any other column a manifest's schema names is a measure (int64)
_SAMPLE_COLUMNS = frozenset(("sample_id", "size", "difficulty", "stage", "begin"))
_INDEX_COLUMNS = frozenset(("microbatch", "sample_ids", "num_samples", "batch_size", "max_size", "padded_size",
                            "tokens", "min_key", "max_key", "stage", "row_splits", "source", "piece_begin",
                            "piece_end", "attention"))


def padded_plan(options: dict) -> bool:
    """Return whether an index's recorded pack ``options`` train micro-batches as padded tensors.

    Padded: ``--budget padded``, ``--same-shape``, ``--static-shapes`` (attention
    ``batch_size * padded_size^2``); varlen: ``--rows``, ``--budget tokens|quadratic`` (sum of s^2).
    ``PackOptions.padded_layout`` decides the same from the options (tested equal).
    """
    if options.get("rows"):
        return False
    return (options.get("budget") or "padded") == "padded" or bool(options.get("same_shape")) \
        or bool(options.get("static_shapes"))


def plan_caps(options: dict) -> list[tuple[str, int]]:
    """Return the caps beside the budget an index's recorded pack ``options`` name, (measure, N) each:
    ``max_size2`` on ``size2`` first, then ``caps`` (``PackOptions.cap_list`` decides the same)."""
    caps = [("size2", int(options["max_size2"]))] if options.get("max_size2") else []
    return caps + [(str(name), int(n)) for name, n in options.get("caps") or ()]


def measure_names(names) -> tuple[str, ...]:
    """Return the measure columns among column ``names`` (of any kind), sorted."""
    return tuple(sorted(n for n in names if n not in _SAMPLE_COLUMNS and n not in _INDEX_COLUMNS))


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
                 pieces: bool = False, attention: bool = False, measures: tuple[str, ...] | list[str] = ()
                 ) -> pa.Schema:
    """Return the schema of an index's micro-batch table (``rows``: with ``row_splits``;
    ``id_type``: the sample ids' int32 or int64, default int64; ``source``: a mixture plan's
    per-micro-batch ``source``, the position of its source in the manifest's ``mixture``;
    ``pieces``: ``piece_begin``/``piece_end``, each sample's range in its source sample, present
    only when ``--oversize split`` cut a sample; ``attention``: each micro-batch's attention work,
    absent from indexes written before it was; ``measures``: the per-micro-batch sums of the
    per-sample measures, int64 columns of their names)."""
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
    if attention:
        fields.append(("attention", pa.int64()))
    return _with_measures(pa.schema(fields), measures)


def kind_schema(kind: str, difficulty_type: pa.DataType | None = None, rows: bool = False,
                id_type: pa.DataType | None = None, source: bool = False, pieces: bool = False,
                attention: bool = False, measures: tuple[str, ...] | list[str] = ()) -> pa.Schema:
    """Return the shard schema of a ``kind`` directory (``difficulty_type``, ``rows``, ``id_type``, ``source``,
    ``pieces``, ``attention``, ``measures`` where they apply)."""
    difficulty_type = difficulty_type or pa.int64()
    if kind == "index":
        return index_schema(rows=rows, id_type=id_type, source=source, pieces=pieces, attention=attention,
                            measures=measures)
    if kind == "metrics":
        return metrics_schema(difficulty_type, measures)
    return sorted_schema(difficulty_type, pieces, measures)


def schema_for(manifest: dict) -> pa.Schema:
    """Return the shard schema a manifest describes."""
    kind = manifest.get("_kind") or KIND_OF_FORMAT[manifest["format"]]
    described = manifest.get("schema", {})
    dtype = pa.float64() if described.get("difficulty") == "double" else pa.int64()
    # "list<item: int32>", or int64 past 2^31 input rows
    id_type = pa.int32() if "int32" in str(described.get("sample_ids", "")) else pa.int64()
    pieces = "piece_begin" in described or "begin" in described
    return kind_schema(kind, dtype, rows="row_splits" in described, id_type=id_type, source="source" in described,
                       pieces=pieces, attention="attention" in described, measures=measure_names(described))


def schema_json(schema: pa.Schema) -> dict:
    """Return the manifest's ``schema`` object: column name to Arrow type string."""
    return {f.name: str(f.type) for f in schema}
