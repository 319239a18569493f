"""RowStore: rows of a column registered from many arrays, gathered in any order with one copy."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sortpack.row_store import (
    ByteRanges,
    RowStore,
    from_raw,
    from_raw_pieces,
    gather_pieces,
    gather_ranges,
    piece_bytes,
    piece_cuts,
)

TYPES = {
    "string": pa.string(), "large_string": pa.large_string(), "binary": pa.binary(), "int64": pa.int64(),
    "float32": pa.float32(), "list_int32": pa.list_(pa.int32()), "large_list_f64": pa.large_list(pa.float64()),
    "timestamp": pa.timestamp("ms"), "fixed_binary": pa.binary(3), "bool": pa.bool_(),
    "struct": pa.struct([("a", pa.int8())]),
}
RAW = {"string", "large_string", "binary", "int64", "float32", "list_int32", "large_list_f64", "timestamp",
       "fixed_binary"}


def _values(name, t, rng, n):
    k = rng.integers(0, 9, n)
    if name in ("string", "large_string"):
        return pa.array(["é" * int(x) for x in k], t)
    if name == "binary":
        return pa.array([b"xy" * int(x) for x in k], t)
    if name == "fixed_binary":
        return pa.array([bytes([97 + int(x)] * 3) for x in k], t)
    if name.startswith(("list", "large_list")):
        return pa.array([list(range(int(x))) for x in k], t)
    if name == "bool":
        return pa.array([bool(x % 2) for x in k], t)
    if name == "struct":
        return pa.array([{"a": int(x)} for x in k], t)
    return pa.array([int(x) for x in k], pa.int64()).cast(t)


def _array(name, rng, n, nulls):
    t = TYPES[name]
    a = _values(name, t, rng, n)
    if nulls and n:
        mask = pa.array(rng.random(n) < 0.3)
        a = pc.if_else(mask, pa.scalar(None, t), a) if name != "struct" else a
    return a


@pytest.mark.parametrize("name", sorted(TYPES))
@settings(max_examples=25)
@given(seed=st.integers(0, 2**32 - 1), nulls=st.booleans())
def test_gather_equals_take_of_the_concatenation(name, seed, nulls):
    rng = np.random.default_rng(seed)
    store, expected = RowStore(TYPES[name]), []
    for _ in range(rng.integers(1, 5)):
        a = _array(name, rng, int(rng.integers(0, 12)), nulls)
        if len(a) > 2 and rng.random() < 0.5:  # sliced arrays have a non-zero offset
            a = a.slice(1, len(a) - 2)
        if rng.random() < 0.5:
            rows = np.sort(rng.choice(len(a), int(rng.integers(0, len(a) + 1)), replace=False)) if len(a) \
                else np.zeros(0, np.int64)
            store.add(a, rows)
            expected.append(a.take(pa.array(rows, pa.int64())))
        else:
            store.add(pa.chunked_array([a, a], TYPES[name]))
            expected += [a, a]
    reference = pa.concat_arrays(expected)
    order = rng.permutation(len(reference))
    got = store.gather(order)
    got.validate(full=True)
    assert got.equals(reference.take(pa.array(order, pa.int64())))
    assert store.raw == (name in RAW)
    if store.raw:
        length, data, valid = store.gather_raw(order)
        assert from_raw(TYPES[name], length, data, valid).equals(got)


def test_lists_with_null_values_fall_back_to_take():
    a = pa.array([[1, None], [2], None], pa.list_(pa.int32()))
    store = RowStore(a.type)
    store.add(pa.array([[5]], a.type))
    store.add(a)
    assert not store.raw
    assert store.gather([2, 0, 1, 3]).to_pylist() == [[2], [5], [1, None], None]


def test_drop_from_forgets_the_tail_and_releases_its_arrays():
    store = RowStore(pa.string())
    store.add(pa.array(["a", "b"]))
    store.add(pa.array(["c"]))
    store.drop_from(2)
    assert len(store) == 2 and store.arrays[1] is None
    store.add(pa.array(["d", "e"]))
    assert store.gather([3, 0]).to_pylist() == ["e", "a"]
    with pytest.raises(ValueError, match="between adds"):
        store.drop_from(1)


def test_rows_of_a_chunked_array_must_visit_chunks_in_order():
    store = RowStore(pa.int64())
    with pytest.raises(ValueError, match="in order"):
        store.add(pa.chunked_array([[1, 2], [3]]), np.array([2, 0]))


def test_from_raw_refuses_more_values_than_32_bit_offsets_hold():
    with pytest.raises(OverflowError, match="32-bit offsets"):
        from_raw(pa.string(), np.array([2**31], np.int64), np.zeros(0, np.uint8), None)


@given(sizes=st.lists(st.integers(0, 50), max_size=60), limit=st.integers(1, 120))
def test_piece_cuts_are_consecutive_runs_within_the_limit(sizes, limit):
    cuts = piece_cuts(np.array(sizes, np.int64), limit)
    assert cuts[0] == 0 and cuts[-1] == len(sizes) and (np.diff(cuts) > 0).all() or len(sizes) == 0
    for a, b in zip(cuts[:-1], cuts[1:]):
        run = sizes[a:b]
        assert sum(run) <= limit or len(run) == 1  # only a row larger than the limit is over it
        if b < len(sizes):
            assert sum(run) + sizes[b] > limit  # greedy: the next row would not have fit


@pytest.mark.parametrize("name", ["string", "binary", "list_int32", "large_list_f64", "int64", "struct"])
def test_pieces_hold_the_same_rows_as_one_gather(name):
    rng = np.random.default_rng(3)
    store = RowStore(TYPES[name])
    for _ in range(3):
        store.add(_array(name, rng, 40, nulls=True))
    order = rng.permutation(len(store))
    whole = store.gather(order)
    sizes = np.full(len(order), 16, np.int64)
    pieces = gather_pieces(store, order, sizes, 100)
    assert isinstance(pieces, pa.ChunkedArray) and pieces.num_chunks == 20
    assert pieces.combine_chunks().equals(whole)
    if store.raw:
        length, data, valid = store.gather_raw(order)
        got = from_raw_pieces(TYPES[name], length, data, valid, 64)
        got.validate(full=True)
        got = got if isinstance(got, pa.ChunkedArray) else pa.chunked_array([got])
        assert got.equals(pa.chunked_array([whole]))
        if name != "int64":  # offsets: cut into pieces of at most 64 bytes (or one longer row)
            assert got.num_chunks > 1 and all(c.nbytes < 64 + 200 for c in got.chunks)


def test_piece_bytes_has_a_test_hook_read_when_used(monkeypatch):
    assert piece_bytes() == 1 << 30
    monkeypatch.setenv("SORTPACK_TEST_PIECE_BYTES", "4096")
    assert piece_bytes() == 4096


@pytest.mark.parametrize("name", sorted(TYPES))
def test_byte_ranges_gather_rows_of_many_arrays_in_any_order(name):
    rng = np.random.default_rng(4)
    arrays = [_array(name, rng, 30, nulls=False).slice(3, 20) for _ in range(3)]
    views = [ByteRanges.of(a) for a in arrays]
    if name not in RAW:
        assert views == [None] * 3
        return
    piece = rng.integers(0, 3, 50)
    rows = rng.integers(0, 20, 50)
    start = np.empty(50, np.int64)
    length = np.empty(50, np.int64)
    for k, v in enumerate(views):
        start[piece == k], length[piece == k] = v.ranges(rows[piece == k])
    got = gather_ranges(TYPES[name], views, piece, start, length)
    got.validate(full=True)
    assert got.to_pylist() == [arrays[p][r].as_py() for p, r in zip(piece.tolist(), rows.tolist())]
    assert ByteRanges.of(_array(name, rng, 30, nulls=True)) is None  # nulls: RowStore reads validity
