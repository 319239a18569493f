"""On-disk format of sortpack directories: manifests, schemas, shard files (docs/format.md)."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .kinds import FORMATS, KINDS, rows_per_shard
    from .manifest import VERSION, content_hash, read_manifest, shard_name, write_manifest
    from .schemas import index_schema, kind_schema, metrics_schema, schema_for, sorted_schema
    from .shards import open_shard, read_rows, verify_directory

# each public name -> its module, loaded when the name is first used: a job that writes a plan never loads the
# shard reader (``shards``)
_HOMES = {
    **dict.fromkeys(("FORMATS", "KINDS", "rows_per_shard"), "kinds"),
    **dict.fromkeys(("VERSION", "content_hash", "read_manifest", "shard_name", "write_manifest"), "manifest"),
    **dict.fromkeys(("index_schema", "kind_schema", "metrics_schema", "schema_for", "sorted_schema"), "schemas"),
    **dict.fromkeys(("open_shard", "read_rows", "verify_directory"), "shards"),
}

__all__ = [
    "FORMATS", "KINDS", "rows_per_shard",
    "VERSION", "content_hash", "read_manifest", "shard_name", "write_manifest",
    "index_schema", "kind_schema", "metrics_schema", "schema_for", "sorted_schema",
    "open_shard", "read_rows", "verify_directory",
]


def __getattr__(name: str) -> Any:
    """Return the public name ``name`` from its module (PEP 562), loading it on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
