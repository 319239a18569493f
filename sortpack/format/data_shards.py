"""Data shards: the stored input columns of an index, one row per sample in plan order.

A data shard is an Arrow IPC file of whole micro-batches. Its boundaries are fixed global
counts: a shard starts at every index shard's first micro-batch and at the first
micro-batch boundary at or after every multiple of ``DATA_ROWS_PER_SHARD`` rows, so the
layout never depends on the rank count (docs/format.md, "Data shards").
"""
from __future__ import annotations

import os

import numpy as np

from ..env import env_int

DATA_ROWS_PER_SHARD = 1 << 16


def data_rows_per_shard() -> int:
    """Return the rows at which a new data shard starts (``SORTPACK_TEST_DATA_ROWS``, read when used, in tests)."""
    return env_int("SORTPACK_TEST_DATA_ROWS") or DATA_ROWS_PER_SHARD

DATA_PREFIX = "data"


def data_shard_name(index: int) -> str:
    """Return the file name of data shard ``index``."""
    return f"{DATA_PREFIX}-{index:05d}.arrow"


def write_data_shard(path, table) -> int:
    """Write ``table`` as a one-batch Arrow IPC file; return its size in bytes.

    Single-chunk columns are written as they are (no concatenating copy), so the bytes
    equal ``format.shards.write_shard``'s for the same rows. The caller hashes the file
    (``format.integrity.file_sha256``), off the writing thread.
    """
    import pyarrow as pa

    arrays = [c.chunk(0) if c.num_chunks == 1 else c.combine_chunks() for c in table.columns]
    if any(c.num_chunks == 0 for c in table.columns):
        arrays = [pa.array([], f.type) if c.num_chunks == 0 else a for c, a, f in zip(table.columns, arrays,
                                                                                        table.schema)]
    batch = pa.RecordBatch.from_arrays(arrays, schema=table.schema)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_batch(batch)
    return os.path.getsize(path)


def data_cuts(first_mb: int, mb_offsets: np.ndarray, first_row: int, index_starts: np.ndarray,
              rows_per_shard: int = 0) -> np.ndarray:
    """Return the local micro-batch boundaries where this rank's data shards start, plus the end.

    The rank holds micro-batches ``[first_mb, first_mb + m)`` starting at global row
    ``first_row``; ``mb_offsets`` (m + 1) are their local row offsets; ``index_starts`` are
    the first micro-batches of the index shards (global, the same on every rank). Shards of
    no rows are left out, so every returned range holds at least one row.
    """
    rows_per_shard = rows_per_shard or data_rows_per_shard()
    m = len(mb_offsets) - 1
    if m <= 0:
        return np.zeros(0, dtype=np.int64)
    gpos = first_row + np.asarray(mb_offsets, dtype=np.int64)
    b = np.arange(1, m, dtype=np.int64)
    # a positive multiple of rows_per_shard lies in (gpos[b-1], gpos[b]]
    crosses = gpos[b] // rows_per_shard > gpos[b - 1] // rows_per_shard
    index_start = np.isin(first_mb + b, np.asarray(index_starts, dtype=np.int64))
    cuts = np.concatenate(([0], b[crosses | index_start], [m])).astype(np.int64)
    # drop shards that hold no rows (micro-batches of no samples)
    keep = np.concatenate((mb_offsets[cuts[1:]] > mb_offsets[cuts[:-1]], [True]))
    cuts = cuts[keep]
    if len(cuts) == 1:
        return np.zeros(0, dtype=np.int64)
    if mb_offsets[cuts[-1]] == mb_offsets[cuts[-2]]:
        cuts = np.delete(cuts, -2)
    return cuts


def describe_data(data: dict) -> dict:
    """Return the inspect summary of a manifest's ``data`` object (columns, shards, bytes)."""
    out = {"columns": ",".join(data["columns"]), "rows": int(data["num_rows"]), "shards": len(data["shards"]),
           "bytes": int(sum(int(e["bytes"]) for e in data["shards"]))}
    if data.get("tokens"):
        out["tokens"] = data["tokens"]["column"]
    return out
