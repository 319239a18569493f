"""pad_tokens / varlen_tokens: token ids padded or laid out by segments in one pass, compiled and numpy alike."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack import kernels as K
from sortpack.kernels import _loader
from sortpack.kernels.tokens import Fill

IGNORE = -100


def _backends(monkeypatch):
    """Yield once with the compiled kernels (when built), once with the numpy fallback."""
    if _loader.backend() == "c":
        yield "c"
    monkeypatch.setattr(_loader, "_clib", None)
    monkeypatch.setattr(_loader, "_warned", True)
    yield "numpy"


def _ragged(lengths, vdtype, odtype, lead=0):
    """Return (values, offsets) of samples of the given lengths, ``lead`` unused values first."""
    offsets = (lead + np.concatenate(([0], np.cumsum(lengths)))).astype(odtype)
    values = np.arange(3, 3 + lead + int(np.sum(lengths)), dtype=vdtype) * 7 % 50021
    return values, offsets


@st.composite
def ragged(draw, longest=40, most=12, lead=5):
    """Draw (lengths, values, offsets): int32 or int64 ids behind int32 or int64 offsets, unused values first."""
    lengths = draw(st.lists(st.integers(0, longest), max_size=most))
    widths = st.sampled_from([np.int32, np.int64])
    return (lengths, *_ragged(lengths, draw(widths), draw(widths), draw(st.integers(0, lead))))


# what a batch kernel is told of each sample beside its tokens: its id's width (None: unknown), real or repeated
MARKS = st.tuples(st.sampled_from([None, np.int32, np.int64]), st.booleans())


def _pad_reference(values, offsets, shape, pad_id):
    n, (rows, width) = len(offsets) - 1, shape
    ids = np.full((rows, width), pad_id, dtype=np.int64)
    labels = np.full((rows, width), IGNORE, dtype=np.int64)
    lengths = np.zeros(rows, dtype=np.int64)
    for j in range(n):
        seq = values[int(offsets[j]):int(offsets[j + 1])][:width].astype(np.int64)
        ids[j, :len(seq)] = seq
        labels[j, 1:len(seq)] = seq[1:]
        lengths[j] = len(seq)
    return ids, labels, lengths, np.arange(width)[None, :] >= lengths[:, None]


@given(sample=ragged(), extra_rows=st.integers(0, 3), width=st.integers(0, 45), pad_id=st.integers(-2, 9))
def test_pad_tokens_matches_a_loop(sample, extra_rows, width, pad_id):
    lengths, values, offsets = sample
    n = len(lengths)
    want = _pad_reference(values, offsets, (n + extra_rows, width), pad_id)
    with pytest.MonkeyPatch.context() as mp:
        for _ in _backends(mp):
            got = K.pad_tokens(values, offsets, n, (n + extra_rows, width), Fill(pad_id, IGNORE))
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_array_equal(g, w)


def _varlen_reference(values, offsets, segments, fill):
    (cu, seg_real, seg_sample), (pad_id, pos_start) = segments, (fill.pad_id, fill.pos_start)
    total = int(cu[-1])
    ids = np.full(total, pad_id, dtype=np.int64)
    labels = np.full(total, IGNORE, dtype=np.int64)
    pos = np.zeros(total, dtype=np.int64)
    seq = np.zeros(total, dtype=np.int32)
    mask = np.zeros(total, dtype=bool)
    for s in range(len(seg_real)):
        a, b = int(cu[s]), int(cu[s + 1])
        pos[a:b] = np.arange(b - a) + pos_start
        seq[a:b] = s
        if seg_sample[s] >= 0:
            j, r = int(seg_sample[s]), int(seg_real[s])
            tok = values[int(offsets[j]):int(offsets[j]) + r].astype(np.int64)
            ids[a:a + r] = tok
            labels[a + 1:a + r] = tok[1:]
            mask[a:a + r] = True
    return ids, labels, pos, seq, mask


@given(data=st.data(), pos_start=st.integers(0, 2))
def test_varlen_tokens_matches_a_loop(data, pos_start):
    lengths, values, offsets = data.draw(ragged(30, 10, 4))
    seg_sample, seg_real, seg_len = [], [], []
    for j, n in enumerate(lengths):  # each sample, cut and padded, with padding segments between
        real = data.draw(st.integers(0, n))
        seg_sample.append(j), seg_real.append(real), seg_len.append(real + data.draw(st.integers(0, 3)))
        if data.draw(st.booleans()):
            seg_sample.append(-1), seg_real.append(0), seg_len.append(data.draw(st.integers(1, 4)))
    cu = np.concatenate(([0], np.cumsum(seg_len))).astype(np.int64)
    args = (cu, np.array(seg_real, dtype=np.int64), np.array(seg_sample, dtype=np.int64))
    fill = Fill(5, IGNORE, pos_start)
    want = _varlen_reference(values, offsets, args, fill)
    with pytest.MonkeyPatch.context() as mp:
        for _ in _backends(mp):
            got = K.varlen_tokens(values, offsets, args, fill)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype
                np.testing.assert_array_equal(g, w)


def test_offsets_outside_the_values_are_refused_by_both(monkeypatch):
    values = np.arange(10, dtype=np.int32)
    bad = np.array([0, 4, 12], dtype=np.int64)  # the second sample ends past the values
    for _ in _backends(monkeypatch):
        with pytest.raises(ValueError, match="outside"):
            K.pad_tokens(values, bad, 2, (2, 16), Fill(0, IGNORE))
        with pytest.raises(ValueError, match="outside"):
            K.varlen_tokens(values, bad, (np.array([0, 4, 12]), np.array([4, 8]), np.array([0, 1])), Fill(0, IGNORE))
        with pytest.raises(ValueError, match="outside"):  # more real tokens than the sample holds
            K.varlen_tokens(values, bad, (np.array([0, 6]), np.array([6]), np.array([0])), Fill(0, IGNORE))


def test_other_dtypes_are_refused():
    with pytest.raises(TypeError):
        K.pad_tokens(np.arange(4, dtype=np.uint8), np.array([0, 4]), 1, (1, 4), Fill(0, IGNORE))


# --- the whole-batch kernels: every output in one call, into buffers the caller allocated -----------------------
need_c = pytest.mark.skipif(_loader.backend() != "c", reason="the compiled kernels are not built")


def _ids_of(n, dtype, known):
    return None if not known else (np.arange(n, dtype=dtype) * 5 + 1)


@need_c
@given(sample=ragged(), extra_rows=st.integers(0, 3), width=st.integers(0, 45), pad_id=st.integers(-2, 9),
       marks=MARKS)
def test_pad_into_writes_pad_tokens_batch_ids_and_flags(sample, extra_rows, width, pad_id, marks):
    from sortpack.kernels.tokens import RowMarks, batch_kernels, token_view

    (lengths, values, offsets), (ids, real) = sample, marks
    n, rows = len(lengths), len(lengths) + extra_rows
    sample_ids = _ids_of(n, ids, ids is not None)
    out = [np.full((rows, width), 77, np.int64), np.full((rows, width), 77, np.int64), np.full(rows, 77, np.int64),
           np.zeros((rows, width), np.bool_), np.full(rows, 77, np.int64), np.ones(rows, np.bool_)]
    batch_kernels().pad_into(token_view(values, offsets), (rows, width), Fill(pad_id, IGNORE),
                             RowMarks(sample_ids, real), tuple(a.ctypes.data for a in out))
    for got, want in zip(out, _pad_reference(values, offsets, (rows, width), pad_id)):
        np.testing.assert_array_equal(got, want)
    want_ids = np.full(rows, -1)
    if sample_ids is not None:
        want_ids[:n] = sample_ids
    np.testing.assert_array_equal(out[4], want_ids)
    assert out[5].tolist() == [real] * n + [False] * extra_rows


@need_c
@given(sample=ragged(30, 10, 4), cap=st.one_of(st.none(), st.integers(0, 35)), pos_start=st.integers(0, 2),
       marks=MARKS)
def test_varlen_into_is_varlen_tokens_of_one_segment_per_sample(sample, cap, pos_start, marks):
    from sortpack.kernels.tokens import RowMarks, batch_kernels, token_view

    (lengths, values, offsets), (ids, real) = sample, marks
    n = len(lengths)
    kept = np.minimum(lengths, cap if cap is not None else 10**9).astype(np.int64) if n else np.zeros(0, np.int64)
    cu = np.concatenate(([0], np.cumsum(kept))).astype(np.int64)
    fill = Fill(0, IGNORE, pos_start)
    want = _varlen_reference(values, offsets, (cu, kept, np.arange(n)), fill)
    room = int(sum(lengths))
    out = [np.full(room, 77, np.int64), np.full(room, 77, np.int64), np.full(room, 77, np.int64),
           np.full(room, 77, np.int32), np.zeros(room, np.bool_), np.full(n + 1, 77, np.int32),
           np.full(n, 77, np.int64), np.full(n, 77, np.int64), np.full(n, 77, np.int64), np.ones(n, np.bool_)]
    sample_ids = _ids_of(n, ids, ids is not None)
    total, longest = batch_kernels().varlen_into(token_view(values, offsets), cap, fill, RowMarks(sample_ids, real),
                                                 tuple(a.ctypes.data for a in out))
    assert (total, longest) == (int(cu[-1]), int(kept.max(initial=0)))
    for got, w in zip(out[:5], want):
        np.testing.assert_array_equal(got[:total], w)
    np.testing.assert_array_equal(out[5], cu.astype(np.int32))
    np.testing.assert_array_equal(out[6], kept)
    np.testing.assert_array_equal(out[7], np.arange(n))
    np.testing.assert_array_equal(out[8], np.full(n, -1) if sample_ids is None else sample_ids)
    assert out[9].tolist() == [real] * n


@need_c
def test_the_batch_kernels_refuse_offsets_outside_the_values():
    from sortpack.kernels.tokens import RowMarks, batch_kernels, token_view

    values = np.arange(10, dtype=np.int32)
    view = token_view(values, np.array([0, 4, 12], dtype=np.int64))  # the second sample ends past the values
    buf = np.zeros(4096, np.int64)
    with pytest.raises(ValueError, match="outside"):
        batch_kernels().pad_into(view, (2, 16), Fill(0, IGNORE), RowMarks(None, True), (buf.ctypes.data,) * 6)
    with pytest.raises(ValueError, match="outside"):
        batch_kernels().varlen_into(view, None, Fill(0, IGNORE), RowMarks(None, True), (buf.ctypes.data,) * 10)
    with pytest.raises(ValueError, match="2 samples, 1 rows"):  # more samples than the rows
        batch_kernels().pad_into(view, (1, 16), Fill(0, IGNORE), RowMarks(None, True), (buf.ctypes.data,) * 6)
