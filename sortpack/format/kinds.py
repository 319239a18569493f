"""The three directory kinds in one table: manifest format, shard file name, shard size, manifest keys.

Every other module asks this table instead of keeping its own copy (docs/format.md).
"""
from __future__ import annotations

from typing import NamedTuple

from ..env import env_int


class Kind(NamedTuple):
    """One directory kind.

    Args:
        name: the short name ("metrics", "sorted", "index") used throughout the code.
        format: the manifest's ``format`` string.
        shard_prefix: shard files are ``{shard_prefix}-{index:05d}.arrow``.
        rows_per_shard: rows in every shard but the last of a new directory.
        keys: manifest keys of this kind beyond ``COMMON_KEYS``.
        columns: the shard columns a reader needs (the schema may hold more).
    """

    name: str
    format: str
    shard_prefix: str
    rows_per_shard: int
    keys: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()


# written by every kind; ``content_hash`` is added when the manifest is written
COMMON_KEYS = ("format", "version", "num_rows", "num_samples", "rows_per_shard", "schema", "options", "source",
               "shards", "stats", "provenance")

KINDS = {
    "metrics": Kind("metrics", "sortpack-metrics", "metrics", 1 << 20, columns=("sample_id", "size", "difficulty")),
    "sorted": Kind("sorted", "sortpack-sorted", "sorted", 1 << 20,
                   columns=("sample_id", "size", "difficulty", "stage")),
    "index": Kind("index", "sortpack-index", "microbatches", 1 << 16, keys=("num_microbatches", "samples_per_shard"),
                  columns=("sample_ids", "num_samples", "batch_size", "padded_size", "tokens")),
}

FORMATS = {k.name: k.format for k in KINDS.values()}
SHARD_PREFIX = {k.name: k.shard_prefix for k in KINDS.values()}
KIND_OF_FORMAT = {k.format: k.name for k in KINDS.values()}


def rows_per_shard(kind: str) -> int:
    """Return the rows per shard of a new directory of ``kind``.

    ``SORTPACK_TEST_SHARD_ROWS`` (read here, when used) lets tests exercise many-shard
    layouts on small data.
    """
    return env_int("SORTPACK_TEST_SHARD_ROWS") or KINDS[kind].rows_per_shard


# An index shard also ends where its samples cross a multiple of this count, so the shards,
# and the ranks that write them, follow the samples rather than the micro-batches
# (micro-batches of short samples hold thousands of ids, of long ones a few).
SAMPLES_PER_SHARD = 1 << 20


def samples_per_shard() -> int:
    """Return the sample count at which a new index shard starts (``SORTPACK_TEST_SHARD_SAMPLES`` in tests)."""
    return env_int("SORTPACK_TEST_SHARD_SAMPLES") or SAMPLES_PER_SHARD



def new_manifest(kind: str, **fields) -> dict:
    """Return the manifest body of a new ``kind`` directory, refusing missing or unknown keys."""
    expected = set(COMMON_KEYS) | set(KINDS[kind].keys)
    given = set(fields) | {"format"}
    if given != expected:
        raise ValueError(f"{kind} manifest: missing {sorted(expected - given)}, unknown {sorted(given - expected)}")
    return {"format": KINDS[kind].format, **fields}
