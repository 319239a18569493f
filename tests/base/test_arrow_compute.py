"""``sortpack.arrow_compute``: each function gives what ``pyarrow.compute``'s function of that name gives (the oracle),
on plain, sliced and chunked arrays with nulls, without that module being imported."""
from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sortpack import arrow_compute as ac

from support import ROOT

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PIECES = ["", "a", " ", "b c", "\u00e9", "\u6771\u4eac", "\U0001f600", "\n\n", "xy", "\u3000", "</s>", "\t z "]
texts = st.lists(st.one_of(st.none(), st.lists(st.sampled_from(PIECES), max_size=4).map("".join)), max_size=12)


def _shapes(values: list) -> list:
    """Return ``values`` as an array, a slice of a longer one and a chunked array of two chunks."""
    whole = pa.array(["pad", *values, "pad"], pa.string())
    half = len(values) // 2
    return [pa.array(values, pa.string()), whole.slice(1, len(values)),
            pa.chunked_array([pa.array(values[:half], pa.string()), pa.array(values[half:], pa.string())])]


def _same(got, want) -> None:
    assert got.type == want.type and got.to_pylist() == want.to_pylist()


@given(values=texts)
def test_the_string_functions_give_pyarrow_compute_s_results(values):
    for arr in _shapes(values):
        for name in ("binary_length", "utf8_length", "is_valid", "is_null", "utf8_split_whitespace"):
            _same(getattr(ac, name)(arr), getattr(pc, name)(arr))
        _same(ac.fill_null(ac.binary_length(arr), 0), pc.fill_null(pc.binary_length(arr), 0))
        _same(ac.fill_null(arr, "-"), pc.fill_null(arr, "-"))
        _same(ac.utf8_trim(arr, " \n"), pc.utf8_trim(arr, characters=" \n"))
        _same(ac.utf8_slice_codeunits(arr, 0, -1), pc.utf8_slice_codeunits(arr, 0, -1))
        for pattern in ("a", "</s>", " "):
            _same(ac.ends_with(arr, pattern), pc.ends_with(arr, pattern))
            _same(ac.match_substring(arr, pattern), pc.match_substring(arr, pattern))
            _same(ac.split_pattern(arr, pattern), pc.split_pattern(arr, pattern))
        _same(ac.match_substring_regex(arr, r"\s+z"), pc.match_substring_regex(arr, r"\s+z"))
        _same(ac.equal(arr, "a"), pc.equal(arr, "a"))
        _same(ac.not_equal(arr, "a"), pc.not_equal(arr, "a"))
        _same(ac.if_else(ac.is_valid(arr), arr, "x"), pc.if_else(pc.is_valid(arr), arr, "x"))
        _same(ac.binary_join_element_wise(arr, arr, "|"), pc.binary_join_element_wise(arr, arr, "|"))
        keys = pa.array(["a", "b c", "\u00e9"])
        _same(ac.is_in(arr, keys), pc.is_in(arr, value_set=keys))
        _same(ac.index_in(arr, keys), pc.index_in(arr, value_set=keys))
        _same(ac.unique(arr), pc.unique(arr))
        _same(ac.cast(arr, pa.large_string()), pc.cast(arr, pa.large_string()))
        mask = pa.array([i % 3 != 1 for i in range(len(values))], pa.bool_())
        _same(ac.filter_where(arr, mask), pc.filter(arr, mask))
        order = pa.array(list(range(len(values)))[::-1], pa.int64())
        _same(ac.take(arr, order), pc.take(arr, order))
        assert ac.any_true(ac.equal(arr, "a")) == bool(pc.any(pc.equal(arr, "a")).as_py())


@given(values=st.lists(st.one_of(st.none(), st.lists(st.sampled_from(PIECES), max_size=5)), max_size=10))
def test_the_list_functions_give_pyarrow_compute_s_results(values):
    lists = pa.array(values, pa.list_(pa.string()))
    for arr in (lists, pa.chunked_array([lists[:len(values) // 2], lists[len(values) // 2:]])):
        _same(ac.list_value_length(arr), pc.list_value_length(arr))
        _same(ac.list_flatten(arr), pc.list_flatten(arr))
        _same(ac.list_slice(arr, 0, 2), pc.list_slice(arr, 0, 2))
        _same(ac.binary_join(arr, "-"), pc.binary_join(arr, "-"))


def test_a_cast_that_loses_data_raises_as_pyarrow_compute_s_does():
    with pytest.raises(pa.ArrowInvalid):
        ac.cast(pa.array([[2**40]], pa.list_(pa.int64())), pa.list_(pa.int32()))


def test_the_functions_run_without_pyarrow_compute_imported():
    # pandas (which imports pyarrow.compute) kept away, as the command line keeps it from pyarrow's first array
    probe = ("import sys; from sortpack.cli.startup import skip_pandas; skip_pandas(['run']); import pyarrow as pa; "
             "from sortpack import arrow_compute as ac; "
             "a = pa.chunked_array([pa.array(['x y', None])]); "
             "assert ac.fill_null(ac.utf8_length(a), 0).to_pylist() == [3, 0]; "
             "assert ac.take(ac.utf8_split_whitespace(a), pa.array([0])).to_pylist() == [['x', 'y']]; "
             "assert 'pyarrow.compute' not in sys.modules, 'pyarrow.compute imported'")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
