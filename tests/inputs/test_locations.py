"""split_locations / with_locations: paths, mtimes and ETags move to the provenance and back."""
from __future__ import annotations

from sortpack.inputs.locations import split_locations, with_locations


def test_locations_round_trip_through_the_provenance():
    files = [{"path": "s3://b/x.parquet", "format": "parquet", "rows": 3, "bytes": 10, "mtime_ns": 5, "etag": "e1"},
             {"path": "/d/y.jsonl", "format": "jsonl", "rows": 2, "bytes": 7, "mtime_ns": 6}]
    entries, prov = split_locations(files)
    assert entries == [{"format": "parquet", "rows": 3, "bytes": 10}, {"format": "jsonl", "rows": 2, "bytes": 7}]
    assert prov == {"source_paths": ["s3://b/x.parquet", "/d/y.jsonl"], "source_mtime_ns": [5, 6],
                    "source_etags": ["e1", None]}
    assert with_locations({"source": {"files": entries}, "provenance": prov}) == files
    # local files only: no ETag list
    assert "source_etags" not in split_locations(files[1:])[1]


def test_a_manifest_written_before_keeps_its_paths_in_the_entries():
    old = {"source": {"files": [{"path": "/d/x.parquet", "format": "parquet", "rows": 1, "bytes": 4}]},
           "provenance": {"source_mtime_ns": [9]}}
    assert with_locations(old) == [{"path": "/d/x.parquet", "format": "parquet", "rows": 1, "bytes": 4,
                                    "mtime_ns": 9}]
