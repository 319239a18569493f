"""On-disk format of sortpack directories: manifests, schemas, shard files (docs/format.md)."""
from .manifest import FORMATS, VERSION, content_hash, read_manifest, shard_name, write_manifest
from .schemas import index_schema, metrics_schema, schema_for, sorted_schema
from .shards import ROWS_PER_SHARD, OutputDir, open_shard, read_rows, verify_directory

__all__ = [
    "FORMATS", "VERSION", "content_hash", "read_manifest", "shard_name", "write_manifest",
    "index_schema", "metrics_schema", "schema_for", "sorted_schema",
    "ROWS_PER_SHARD", "OutputDir", "open_shard", "read_rows", "verify_directory",
]
