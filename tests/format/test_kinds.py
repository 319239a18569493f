"""The table of directory kinds and what is derived from it."""
from __future__ import annotations

import pyarrow as pa
import pytest

from sortpack.format import kinds
from sortpack.format.manifest import shard_name
from sortpack.format.schemas import index_schema, kind_schema, schema_for, schema_json


def test_derived_tables_agree_with_the_kind_table():
    assert kinds.FORMATS == {"metrics": "sortpack-metrics", "sorted": "sortpack-sorted", "index": "sortpack-index"}
    assert shard_name("index", 3) == "microbatches-00003.arrow"
    assert shard_name("sorted", 12) == "sorted-00012.arrow"
    for kind in kinds.KINDS.values():
        assert kinds.KIND_OF_FORMAT[kind.format] == kind.name
        # a reader's required columns are in the schema the writer uses
        assert set(kind.columns) <= set(kind_schema(kind.name).names)


def test_schema_for_reads_back_the_kind_and_options():
    assert "row_splits" in schema_for({"format": "sortpack-index", "schema": {"row_splits": "list<int32>"}}).names
    assert "row_splits" not in schema_for({"format": "sortpack-index", "schema": {}}).names
    sch = schema_for({"format": "sortpack-sorted", "schema": {"difficulty": "double"}})
    assert str(sch.field("difficulty").type) == "double" and "stage" in sch.names


def test_schema_for_reads_back_the_sample_id_width():
    for id_type in (pa.int32(), pa.int64()):
        written = schema_json(index_schema(id_type=id_type))
        assert written["sample_ids"] == f"list<item: {id_type}>"
        assert schema_for({"format": "sortpack-index", "schema": written}) == index_schema(id_type=id_type)
    # manifests of indexes written before the width was chosen: int64
    assert str(schema_for({"format": "sortpack-index", "schema": {}}).field("sample_ids").type) == "list<item: int64>"


def test_rows_per_shard_reads_the_test_hook_when_called(monkeypatch):
    monkeypatch.delenv("SORTPACK_TEST_SHARD_ROWS", raising=False)
    assert kinds.rows_per_shard("index") == 1 << 16
    monkeypatch.setenv("SORTPACK_TEST_SHARD_ROWS", "37")
    assert kinds.rows_per_shard("index") == 37 and kinds.rows_per_shard("metrics") == 37
    monkeypatch.delenv("SORTPACK_TEST_SHARD_ROWS")
    assert kinds.rows_per_shard("metrics") == 1 << 20


def _fields(kind):
    return {k: 0 for k in kinds.COMMON_KEYS + kinds.KINDS[kind].keys if k != "format"}


def test_new_manifest_checks_its_keys():
    m = kinds.new_manifest("index", **_fields("index"))
    assert m["format"] == "sortpack-index" and "num_microbatches" in m
    with pytest.raises(ValueError, match="missing.*num_microbatches"):
        kinds.new_manifest("index", **_fields("metrics"))
    with pytest.raises(ValueError, match="unknown.*num_microbatches"):
        kinds.new_manifest("sorted", **_fields("index"))


def test_the_padded_layout_reads_the_same_from_options_and_from_the_manifest():
    from itertools import product

    from sortpack.format.schemas import padded_plan
    from sortpack.stages.pack import PackOptions

    for budget, rows, same, static in product(("padded", "tokens", "quadratic"), (0, 64), (False, True),
                                              (False, True)):
        opts = PackOptions(max_tokens=64, budget=budget, rows=rows, same_shape=same, static_shapes=static)
        assert opts.padded_layout == padded_plan(opts.as_dict())
