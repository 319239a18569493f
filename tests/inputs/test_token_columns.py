"""The column path's pure parts: its run planning, the texts' Arrow buffers, the splice of the texts left out, the
added tokens around each text, and the one-pass search for an added token's text."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from sortpack.inputs.token_columns import holding, plan_runs, splice, string_buffers, surround


@given(st.lists(st.integers(0, 50), max_size=40), st.integers(1, 8), st.integers(1, 200))
def test_runs_tile_the_texts_in_order_within_their_byte_budget(sizes, threads, run_bytes):
    offsets = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
    runs = plan_runs(offsets, threads, run_bytes)
    n = len(sizes)
    if n == 0:
        assert runs in ([], [(0, 0)])
        return
    assert runs[0][0] == 0 and runs[-1][1] == n
    assert all(a < b for a, b in runs) and all(x[1] == y[0] for x, y in zip(runs, runs[1:]))
    for a, b in runs:  # over budget only where a single text is
        assert offsets[b] - offsets[a] <= run_bytes or b - a == 1 or offsets[b - 1] - offsets[a] <= run_bytes
    if threads > 1 and n >= 2 * threads and offsets[-1] >= threads * max(sizes) > 0:
        assert len(runs) >= threads  # every thread has a run where the texts allow it


def test_runs_are_the_same_for_the_same_texts_wherever_they_start():
    offsets = np.array([0, 10, 20, 30, 40])
    assert plan_runs(offsets + 1000, 2) == plan_runs(offsets, 2) == [(0, 2), (2, 4)]


def test_string_buffers_of_slices_and_large_strings():
    texts = ["ab", "", "cdé", "f"]
    for typ in (pa.string(), pa.large_string()):
        col = pa.array(["zz", *texts], typ).slice(1)
        data, offsets = string_buffers(col)
        assert [bytes(data[a:b]).decode() for a, b in zip(offsets[:-1], offsets[1:])] == texts
        assert offsets.dtype == np.int64
    assert string_buffers(pa.array(["a", None])) is None
    assert string_buffers(pa.array([b"a"], pa.binary())) is None


def test_splice_puts_each_texts_ids_back_in_place():
    counts = np.array([2, -1, 1, -1], np.int64)
    ids = np.array([10, 11, 12], np.int32)
    out = splice(ids, counts, np.array([1, 3]), (np.array([20, 21, 22, 30], np.int32), np.array([3, 1])))
    assert out.tolist() == [10, 11, 20, 21, 22, 12, 30] and counts.tolist() == [2, 3, 1, 1]


def test_surround_adds_the_fixed_tokens_around_every_text():
    ids, counts = surround(np.array([5, 6, 7], np.int32), np.array([2, 0, 1]), (1,), (2, 3))
    assert ids.tolist() == [1, 5, 6, 2, 3, 1, 2, 3, 1, 7, 2, 3] and counts.tolist() == [5, 3, 4]


@given(st.lists(st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=5), min_size=1,
                max_size=6, unique=True),
       st.lists(st.text(st.sampled_from(list("<|>[]().*+?^$\\{}ab x")), max_size=12), max_size=8))
def test_texts_holding_an_added_tokens_text_are_found_in_one_pass(added, texts):
    got = holding(pa.array(texts, pa.string()), frozenset(added)).tolist()
    assert got == [int(any(a in t for a in added)) for t in texts]
