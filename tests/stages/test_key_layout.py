"""The 64-bit sort key ``[group | stage | key | id]`` (stages.key_codes.KeyLayout): round trip and order."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sortpack.stages.key_codes import KeyLayout


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


@settings(max_examples=300, deadline=None)
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


@settings(max_examples=300, deadline=None)
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
