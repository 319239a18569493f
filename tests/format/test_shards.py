"""Shard files: their hash and the checks of verify_directory."""
from __future__ import annotations

import hashlib

import pyarrow as pa

from sortpack.format.integrity import file_sha256
from sortpack.write.shards import write_shard


def test_write_shard_records_the_file_hash(tmp_path):
    path = tmp_path / "s.arrow"
    meta = write_shard(path, pa.table({"a": pa.array(range(1000), pa.int64())}))
    data = path.read_bytes()
    assert meta == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert file_sha256(path) == meta["sha256"]


def test_file_sha256_spans_chunks(tmp_path):
    path = tmp_path / "big"
    data = bytes(range(256)) * (1 << 15) + b"tail"  # more than one 4 MiB chunk
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
