"""``stages.split`` under ``--size bytes``: analyze's cuts (``ByteCuts``) and the piece table built from them."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.errors import SortpackError
from sortpack.inputs.pieces import byte_pieces
from sortpack.stages.samples import SampleColumns
from sortpack.stages.split import ByteCuts, byte_piece_table

CHARS = st.sampled_from(["a", " ", "é", "中", "😀"])
TEXTS = st.lists(st.lists(CHARS, max_size=30).map("".join), min_size=1, max_size=12)


def samples_of(texts: list[str]) -> SampleColumns:
    """Return the samples analyze would measure for ``texts`` under --size bytes (no input files)."""
    size = np.array([len(t.encode()) for t in texts], dtype=np.int64)
    return SampleColumns(0, len(texts), np.arange(len(texts), dtype=np.int64), size, size)


@given(texts=TEXTS, cap=st.integers(4, 20), chunk=st.integers(1, 5), read=st.integers(1, 7))
def test_analyzes_cuts_are_the_cuts_of_the_whole_texts(texts, cap, chunk, read):
    """Reads of several chunks each, fed in order, give the pieces byte_pieces gives the whole column."""
    cuts = ByteCuts(cap, "text")
    for lo in range(0, len(texts), read):
        part = texts[lo:lo + read]
        chunks = [pa.array(part[i:i + chunk], pa.string()) for i in range(0, len(part), chunk)]
        table = pa.table({"text": pa.chunked_array(chunks, pa.string())})
        cuts(table, np.array([len(t.encode()) for t in part], dtype=np.int64), "f.parquet")
    samples = samples_of(texts)
    over = samples.size > cap
    # no input files: everything comes from what analyze kept, nothing is read back
    row, begin, size = byte_piece_table(samples, cap, over, "text", cuts)
    want_row, want_begin, want_size = byte_pieces(pa.array(texts), cap)
    assert row.tolist() == want_row.tolist() and begin.tolist() == want_begin.tolist()
    assert size.tolist() == want_size.tolist()


def test_a_character_longer_than_a_piece_is_refused_with_its_sample_id():
    texts = ["ab", "abc", "x😀", "a"]
    cuts = ByteCuts(3, "text")
    cuts(pa.table({"text": texts[:2]}), np.array([2, 3]), "a.parquet")
    cuts(pa.table({"text": texts[2:]}), np.array([5, 1]), "b.parquet")
    samples = samples_of(texts)
    with pytest.raises(SortpackError, match=r"b\.parquet: sample 2 holds a character of 4 bytes"):
        byte_piece_table(samples, 3, samples.size > 3, "text", cuts)
