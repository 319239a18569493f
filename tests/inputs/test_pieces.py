"""``inputs.pieces``: byte pieces of a text fall between UTF-8 characters and cover it exactly once."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.inputs.pieces import byte_pieces, cut_array, longest_char

CHARS = st.sampled_from(["a", "b", " ", "é", "ß", "中", "漢", "😀", "🎉"])  # 1, 2, 3 and 4 bytes
TEXTS = st.lists(st.lists(CHARS, max_size=60).map("".join), min_size=1, max_size=8)


@given(texts=TEXTS, cap=st.integers(4, 40), large=st.booleans())
def test_byte_pieces_are_whole_characters_that_fit_and_cover_the_text(texts, cap, large):
    arr = pa.array(texts, pa.large_string() if large else pa.string())
    row, begin, size = byte_pieces(arr, cap)
    assert (size <= cap).all()
    cut = cut_array(arr.take(pa.array(row)), begin, begin + size, "bytes")
    cut.validate(full=True)  # every piece is valid UTF-8
    pieces = cut.to_pylist()
    for i, text in enumerate(texts):
        mine = [p for r, p in zip(row.tolist(), pieces) if r == i]
        assert "".join(mine) == text
        if len(text.encode()) <= cap:
            assert len(mine) == 1
        # greedy: a piece and the next piece's first character do not fit together (so at most 3 bytes short)
        for piece, nxt in zip(mine[:-1], mine[1:]):
            assert len(piece.encode()) + len(nxt[0].encode()) > cap
            assert len(piece.encode()) > cap - 4


def test_binary_pieces_cut_at_any_byte():
    arr = pa.array([bytes(range(10)), b"", b"xy"])
    row, begin, size = byte_pieces(arr, 4)
    assert row.tolist() == [0, 0, 0, 1, 2] and begin.tolist() == [0, 4, 8, 0, 0] and size.tolist() == [4, 4, 2, 0, 2]


def test_a_character_longer_than_a_piece_is_refused_not_cut():
    arr = pa.array(["ab", "x😀y", "abc"])
    with pytest.raises(ValueError):
        byte_pieces(arr, 3)
    assert longest_char(arr) == (1, 4)
    assert byte_pieces(arr, 4)[2].tolist() == [2, 1, 4, 1, 3]  # x | 😀 | y


def test_cut_array_by_bytes_and_by_characters_differ_for_text_only():
    arr = pa.array(["é中x", "abc"])
    assert cut_array(arr, [2, 0], [5, 2], "bytes").to_pylist() == ["中", "ab"]
    assert cut_array(arr, [1, 0], [2, 2]).to_pylist() == ["中", "ab"]
    assert cut_array(pa.array([b"abcd"]), [1], [3], "bytes").to_pylist() == [b"bc"]
