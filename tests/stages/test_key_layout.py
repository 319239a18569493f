"""The 64-bit sort key ``[group | stage | key | id]`` (stages.key_codes.KeyLayout): round trip and order; the
key codes (encode_keys) in a buffer the caller gives."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.parallel import SerialComm
from sortpack.stages import key_codes
from sortpack.stages.key_codes import KeyLayout, encode_keys


@st.composite
def layouts_and_fields(draw):
    """Draw a layout that fits 64 bits and n samples' fields within its widths."""
    group_bits = draw(st.integers(0, 6))
    stage_bits = draw(st.integers(0, 6))
    id_bits = draw(st.integers(0, 30))
    key_bits = draw(st.integers(1, 64 - group_bits - stage_bits - id_bits))
    layout = KeyLayout(key_bits, stage_bits, group_bits, id_bits)
    n = draw(st.integers(0, 40))

    def values(bits):
        return np.array(draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=n, max_size=n)), dtype=np.uint64)

    fields = {"key": values(key_bits)}
    for name, bits in (("stage", stage_bits), ("group", group_bits), ("id", id_bits)):
        if bits:
            fields[name] = values(bits)
    return layout, fields


def pack(layout, fields, in_place=False):
    ids = fields.get("id")
    packer = layout.pack_into if in_place else layout.pack
    return packer(fields["key"].copy(), stage=fields.get("stage"), group=fields.get("group"),
                  ids=None if ids is None else ids.view(np.int64))


@given(layouts_and_fields())
def test_pack_then_unpack_gives_every_field_back(drawn):
    layout, fields = drawn
    codes = pack(layout, fields)
    assert codes.dtype == np.uint64
    out = layout.unpack(codes)
    assert set(out) == set(fields)
    for name, values in fields.items():
        assert out[name].astype(np.uint64).tolist() == values.tolist()
    assert out.get("id", np.zeros(0, np.int64)).dtype == np.int64
    np.testing.assert_array_equal(pack(layout, fields, in_place=True), codes)


@given(layouts_and_fields())
def test_codes_sort_as_the_tuples_group_stage_key_id(drawn):
    layout, fields = drawn
    codes = pack(layout, fields)
    zeros = np.zeros(len(codes), np.uint64)
    tuples = list(zip(*(fields.get(f, zeros).tolist() for f in ("group", "stage", "key", "id"))))
    order = np.argsort(codes, kind="stable")
    assert [tuples[i] for i in order] == sorted(tuples)


def test_the_fields_lie_from_the_top_bit_down():
    layout = KeyLayout(key_bits=8, stage_bits=2, group_bits=3, id_bits=10)
    assert [layout.shift(f) for f in ("id", "key", "stage", "group")] == [0, 10, 18, 20] and layout.bits == 23
    code = layout.pack(np.array([5], np.uint64), stage=np.array([2]), group=np.array([6]), ids=np.array([7]))
    assert int(code[0]) == (6 << 20) | (2 << 18) | (5 << 10) | 7
    assert KeyLayout(60, group_bits=5).fits() is False and KeyLayout(59, group_bits=5).fits() is True


@pytest.mark.parametrize("groups", [[0, 0, 1, 1, 3], [3, 1, 0, 1, 0]])
def test_groups_in_runs_and_out_of_order_pack_alike(groups):
    # runs take one OR per run: the same codes as one OR per sample
    layout = KeyLayout(4, group_bits=2, id_bits=3)
    key = np.array([1, 15, 0, 7, 3], np.uint64)
    ids = np.arange(5, dtype=np.int64)
    got = layout.pack(key, group=np.array(groups), ids=ids)
    want = (np.array(groups, np.uint64) << np.uint64(7)) | (key << np.uint64(3)) | ids.astype(np.uint64)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(layout.pack(key, group=np.array(groups), first_id=0), want)


def test_strip_ids_and_sorted_groups_read_sorted_codes():
    layout = KeyLayout(4, group_bits=2, id_bits=3)
    codes = np.sort(layout.pack(np.array([1, 15, 0, 7], np.uint64), group=np.array([0, 2, 2, 3]),
                                ids=np.array([4, 5, 6, 7])))
    ids, keyed = layout.strip_ids(codes)
    # in group 2, key 0 (id 6) sorts before key 15 (id 5)
    assert ids.tolist() == [4, 6, 5, 7] and keyed == KeyLayout(4, group_bits=2)
    assert keyed.sorted_groups(codes).tolist() == [0, 2, 2, 3]
    assert keyed.field(codes, "key", in_place=True).tolist() == [1, 0, 15, 7]


def test_strip_ids_writes_into_memory_the_caller_is_done_with():
    layout = KeyLayout(4, id_bits=3)
    codes = np.sort(layout.pack(np.array([3, 1, 2], np.uint64), first_id=2))
    spare = np.full(5, 99, np.uint64)
    ids, _ = layout.strip_ids(codes, into=spare)
    assert ids.tolist() == [3, 4, 2] and np.shares_memory(ids, spare) and spare[3:].tolist() == [99, 99]
    assert codes.tolist() == [1, 2, 3]
    short = layout.pack(np.array([1, 2], np.uint64), first_id=0)
    ids, _ = layout.strip_ids(short, into=np.zeros(1, np.uint64))  # too short: a new array
    assert ids.tolist() == [0, 1]


def test_ids_packed_in_blocks_are_the_ids(monkeypatch):
    monkeypatch.setattr(key_codes, "_ID_BLOCK", 3)  # several blocks and a short last one
    layout = KeyLayout(8, id_bits=5)
    key = np.arange(10, dtype=np.uint64)
    got = layout.pack(key, first_id=7)
    assert np.array_equal(got, (key << np.uint64(5)) | np.arange(7, 17, dtype=np.uint64))


def _codes_as_before(values: np.ndarray, descending: bool) -> tuple[np.ndarray, int, int]:
    """Return (the uint64 codes, their offset, their bits) as encode_keys made them in whole-array steps."""
    if values.dtype.kind == "f":
        bits = values.astype(np.float64, copy=False).view(np.uint64)
        codes = np.where((bits >> np.uint64(63)).astype(bool), ~bits, bits | np.uint64(1 << 63))
    else:
        codes = values.astype(np.uint64)
    if descending:
        codes = ~codes
    if not len(codes):
        return codes, 2**64 - 1, 0
    lo = int(codes.min())
    return codes - np.uint64(lo), lo, int((codes - np.uint64(lo)).max()).bit_length()


@given(ints=st.lists(st.integers(-2**63, 2**63 - 1), max_size=30),
       floats=st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=30),
       kind=st.sampled_from(["int64", "int32", "float64", "float32"]), descending=st.booleans(),
       extra=st.integers(0, 3))
def test_codes_in_the_callers_buffer_are_the_codes(ints, floats, kind, descending, extra):
    if kind.startswith("int"):
        info = np.iinfo(kind)
        values = np.array([min(max(v, info.min), info.max) for v in ints], dtype=kind)
    else:
        with np.errstate(over="ignore"):
            values = np.array(floats, dtype=kind)
    want, offset, bits = _codes_as_before(values, descending)
    out = np.full(len(values) + extra, 5, np.uint64)
    got, codec = encode_keys(SerialComm(), values, descending, out=out)
    assert np.array_equal(got, want) and (np.shares_memory(got, out) or len(values) == 0)
    assert (codec.offset, codec.bits, codec.descending) == (offset, bits, descending)
    assert np.all(out[len(values):] == 5)
    fresh, same = encode_keys(SerialComm(), values, descending)
    assert np.array_equal(fresh, want) and same == codec
    if len(values) and kind.startswith("int"):
        assert np.array_equal(codec.decode(got.copy()), values.astype(np.int64))


def test_codes_made_in_blocks_are_the_codes(monkeypatch):
    monkeypatch.setattr(key_codes, "_ID_BLOCK", 4)  # several blocks, a short last one
    values = np.array([7, 3, 9, 3, 12, 5, 8, 1, 4, 11], np.int64)
    for descending in (False, True):
        want, offset, bits = _codes_as_before(values, descending)
        got, codec = encode_keys(SerialComm(), values.copy(), descending)
        assert np.array_equal(got, want) and (codec.offset, codec.bits) == (offset, bits)
    layout = KeyLayout(4, stage_bits=2, id_bits=4)
    stage = np.arange(10) % 3
    packed = layout.pack(np.arange(10, dtype=np.uint64) % 16, stage=stage, first_id=3)
    assert np.array_equal(layout.unpack(packed)["id"], np.arange(3, 13))
    assert np.array_equal(layout.unpack(packed)["stage"], stage)
    ids, keyed = layout.strip_ids(packed)  # in blocks too, the ids out and the shift in one sweep
    assert ids.tolist() == list(range(3, 13)) and keyed == KeyLayout(4, stage_bits=2)
    assert np.array_equal(keyed.unpack(packed)["stage"], stage)
