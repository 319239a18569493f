"""pad_tokens / varlen_tokens: token ids padded or laid out by segments in one pass, compiled and numpy alike."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sortpack import kernels as K
from sortpack.kernels import _loader

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


def _pad_reference(values, offsets, n, rows, width, pad_id):
    ids = np.full((rows, width), pad_id, dtype=np.int64)
    labels = np.full((rows, width), IGNORE, dtype=np.int64)
    lengths = np.zeros(rows, dtype=np.int64)
    for j in range(n):
        seq = values[int(offsets[j]):int(offsets[j + 1])][:width].astype(np.int64)
        ids[j, :len(seq)] = seq
        labels[j, 1:len(seq)] = seq[1:]
        lengths[j] = len(seq)
    return ids, labels, lengths, np.arange(width)[None, :] >= lengths[:, None]


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), max_size=12), extra_rows=st.integers(0, 3), width=st.integers(0, 45),
       wide=st.booleans(), large=st.booleans(), lead=st.integers(0, 5), pad_id=st.integers(-2, 9))
def test_pad_tokens_matches_a_loop(lengths, extra_rows, width, wide, large, lead, pad_id):
    values, offsets = _ragged(lengths, np.int64 if wide else np.int32, np.int64 if large else np.int32, lead)
    n = len(lengths)
    want = _pad_reference(values, offsets, n, n + extra_rows, width, pad_id)
    with pytest.MonkeyPatch.context() as mp:
        for _ in _backends(mp):
            got = K.pad_tokens(values, offsets, n, n + extra_rows, width, pad_id, IGNORE)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_array_equal(g, w)


def _varlen_reference(values, offsets, cu, seg_real, seg_sample, pad_id, pos_start):
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


@settings(max_examples=60, deadline=None)
@given(data=st.data(), wide=st.booleans(), large=st.booleans(), pos_start=st.integers(0, 2))
def test_varlen_tokens_matches_a_loop(data, wide, large, pos_start):
    lengths = data.draw(st.lists(st.integers(0, 30), max_size=10))
    values, offsets = _ragged(lengths, np.int64 if wide else np.int32, np.int64 if large else np.int32,
                              data.draw(st.integers(0, 4)))
    seg_sample, seg_real, seg_len = [], [], []
    for j, n in enumerate(lengths):  # each sample, cut and padded, with padding segments between
        real = data.draw(st.integers(0, n))
        seg_sample.append(j), seg_real.append(real), seg_len.append(real + data.draw(st.integers(0, 3)))
        if data.draw(st.booleans()):
            seg_sample.append(-1), seg_real.append(0), seg_len.append(data.draw(st.integers(1, 4)))
    cu = np.concatenate(([0], np.cumsum(seg_len))).astype(np.int64)
    args = (cu, np.array(seg_real, dtype=np.int64), np.array(seg_sample, dtype=np.int64))
    want = _varlen_reference(values, offsets, *args, 5, pos_start)
    with pytest.MonkeyPatch.context() as mp:
        for _ in _backends(mp):
            got = K.varlen_tokens(values, offsets, *args, 5, IGNORE, pos_start)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype
                np.testing.assert_array_equal(g, w)


def test_offsets_outside_the_values_are_refused_by_both(monkeypatch):
    values = np.arange(10, dtype=np.int32)
    bad = np.array([0, 4, 12], dtype=np.int64)  # the second sample ends past the values
    for _ in _backends(monkeypatch):
        with pytest.raises(ValueError, match="outside"):
            K.pad_tokens(values, bad, 2, 2, 16, 0, IGNORE)
        with pytest.raises(ValueError, match="outside"):
            K.varlen_tokens(values, bad, np.array([0, 4, 12]), np.array([4, 8]), np.array([0, 1]), 0, IGNORE, 0)
        with pytest.raises(ValueError, match="outside"):  # more real tokens than the sample holds
            K.varlen_tokens(values, bad, np.array([0, 6]), np.array([6]), np.array([0]), 0, IGNORE, 0)


def test_other_dtypes_are_refused():
    with pytest.raises(TypeError):
        K.pad_tokens(np.arange(4, dtype=np.uint8), np.array([0, 4]), 1, 1, 4, 0, IGNORE)
