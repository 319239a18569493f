"""Which Arrow types count as text, binary and lists: sortpack.arrow_types."""
from __future__ import annotations

import pyarrow as pa
import pytest

from sortpack.arrow_types import (
    is_binary,
    is_list,
    is_offset_binary,
    is_offset_bytes,
    is_offset_list,
    is_text,
    plain_column,
    plain_type,
)

TYPES = {
    "string": pa.string(), "large_string": pa.large_string(), "binary": pa.binary(),
    "large_binary": pa.large_binary(), "fixed_binary": pa.binary(4), "list": pa.list_(pa.int32()),
    "large_list": pa.large_list(pa.int32()), "fixed_list": pa.list_(pa.int32(), 2), "int64": pa.int64(),
}
EXPECTED = {  # name -> the predicates that hold
    "string": {is_text, is_offset_bytes}, "large_string": {is_text, is_offset_bytes},
    "binary": {is_binary, is_offset_binary, is_offset_bytes},
    "large_binary": {is_binary, is_offset_binary, is_offset_bytes},
    "fixed_binary": {is_binary}, "list": {is_list, is_offset_list}, "large_list": {is_list, is_offset_list},
    "fixed_list": {is_list}, "int64": set(),
}
PREDICATES = [is_text, is_binary, is_offset_binary, is_offset_bytes, is_list, is_offset_list]


@pytest.mark.parametrize("name", sorted(TYPES))
def test_each_type_passes_exactly_its_predicates(name):
    assert {p for p in PREDICATES if p(TYPES[name])} == EXPECTED[name]


def test_list_views_are_lists_but_not_offset_lists():
    if not hasattr(pa, "list_view"):
        pytest.skip("this pyarrow has no list views")
    t = pa.list_view(pa.int32())
    assert is_list(t) and not is_offset_list(t)


def test_plain_forms_of_dictionaries_and_views():
    assert plain_type(pa.dictionary(pa.int8(), pa.string())) == pa.string()
    assert plain_type(pa.int32()) == pa.int32()
    col = pa.chunked_array([pa.array(["a", "bb", "a"]).dictionary_encode()])
    assert plain_column(col).type == pa.string() and plain_column(col).to_pylist() == ["a", "bb", "a"]
    plain = pa.chunked_array([pa.array(["x"])])
    assert plain_column(plain) is plain
    if hasattr(pa, "string_view"):
        assert plain_type(pa.string_view()) == pa.large_string()
        view = pa.chunked_array([pa.array(["a", "bb"], pa.string_view())])
        assert plain_column(view).type == pa.large_string()
