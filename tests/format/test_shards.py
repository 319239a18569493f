"""Shard files: their hash and the checks of verify_directory."""
from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest

from sortpack.errors import SortpackError
from sortpack.format.integrity import file_sha256, shard_firsts
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


@pytest.mark.parametrize("firsts, rows, total", [
    ([0, 4], [3, 2], 5),  # a gap
    ([0, 2], [3, 3], 5),  # an overlap
    ([1, 4], [3, 2], 5),  # consecutive, but not from row 0
    ([0, 3], [3, 2], 6),  # short of the total
    ([], [], 1),  # no shard for a row
])
def test_shard_firsts_refuses_shards_that_do_not_tile(tmp_path, firsts, rows, total):
    entries = [{"file": f"s{k}", "first": f, "rows": r, "bytes": 0} for k, (f, r) in enumerate(zip(firsts, rows))]
    with pytest.raises(SortpackError, match=f"manifest shards do not tile its {total} rows"):
        shard_firsts(tmp_path, entries, total, "rows")


def test_shard_firsts_then_checks_every_file_size(tmp_path):
    (tmp_path / "s0").write_bytes(b"x")
    (tmp_path / "s1").write_bytes(b"xy")
    entries = [{"file": "s0", "first": 0, "rows": 3, "bytes": 1}, {"file": "s1", "first": 3, "rows": 2, "bytes": 2}]
    assert shard_firsts(tmp_path, entries, 5, "rows") == [0, 3]
    assert shard_firsts(tmp_path, [], 0, "rows") == []
    entries[1]["bytes"] = 3
    with pytest.raises(SortpackError, match="s1: 2 bytes, the manifest says 3 bytes"):
        shard_firsts(tmp_path, entries, 5, "rows")
