"""On-disk format of sortpack directories: manifests, schemas, shard files (docs/format.md)."""
from .kinds import FORMATS, KINDS, rows_per_shard
from .manifest import VERSION, content_hash, read_manifest, shard_name, write_manifest
from .schemas import index_schema, kind_schema, metrics_schema, schema_for, sorted_schema
from .shards import open_shard, read_rows, verify_directory

__all__ = [
    "FORMATS", "KINDS", "rows_per_shard",
    "VERSION", "content_hash", "read_manifest", "shard_name", "write_manifest",
    "index_schema", "kind_schema", "metrics_schema", "schema_for", "sorted_schema",
    "open_shard", "read_rows", "verify_directory",
]
