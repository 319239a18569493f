"""copy_runs and write_runs: runs of integers over a few buffers copied (and written) one after another, each
converted to the destination's dtype, their range measured: compiled and numpy alike (sortpack.kernels.runs)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.kernels import _loader
from sortpack.kernels.runs import NO_RANGE, Runs, Sink, copy_runs, type_code, write_runs

DTYPES = [np.dtype(t) for t in ("u1", "u2", "u4", "u8", "i1", "i2", "i4", "i8")]


def _case(seed: int, dtypes: list[np.dtype]) -> tuple[Runs, list[np.ndarray]]:
    """Return random runs over a few buffers of the given dtypes, and each run's values (the reference)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for dt in dtypes:
        info = np.iinfo(dt)
        arrays.append(rng.integers(info.min, info.max, int(rng.integers(0, 60)), dtype=dt, endpoint=True))
    m = int(rng.integers(0, 40))
    piece = rng.integers(0, len(arrays), m)
    starts, counts, expected = np.zeros(m, np.int64), np.zeros(m, np.int64), []
    for i, k in enumerate(piece):
        n = len(arrays[k])
        first = int(rng.integers(0, n + 1))
        counts[i] = rng.integers(0, n - first + 1)
        starts[i] = first * arrays[k].itemsize
        expected.append(arrays[k][first:first + counts[i]])
    runs = Runs(tuple(a.view(np.uint8) for a in arrays), tuple(a.dtype for a in arrays), piece, starts, counts)
    return runs, expected


def _reference(expected: list[np.ndarray], dtype: np.dtype) -> tuple[np.ndarray, list[int]]:
    """Return the values converted as numpy's unsafe cast does, and their (low, high, over)."""
    values = [int(v) for e in expected for v in e.tolist()]
    out = np.concatenate([e.astype(dtype, casting="unsafe") for e in expected]) if expected else np.zeros(0, dtype)
    top = int(np.iinfo(np.int64).max)
    if not values:
        return out, list(NO_RANGE)
    high = max(values)
    return out, [min(min(values), top), min(high, top), int(high > top)]


def _hidden(monkeypatch) -> None:
    monkeypatch.setattr(_loader, "_clib", None)
    monkeypatch.setattr(_loader, "_warned", True)


@given(seed=st.integers(0, 2**32 - 1), sources=st.lists(st.sampled_from(DTYPES), min_size=1, max_size=3),
       dst=st.sampled_from(DTYPES))
def test_copy_is_the_concatenation_cast_compiled_and_fallback(seed, sources, dst):
    runs, expected = _case(seed, sources)
    want, want_range = _reference(expected, dst)
    with pytest.MonkeyPatch.context() as mp:
        for hide in (False, True):
            if hide:
                _hidden(mp)
            out = np.full(len(want) + 2, 7, dtype=dst)
            n, rng = copy_runs(runs, out)
            assert n == len(want) and out[:n].tolist() == want.tolist() and (out[n:] == 7).all()
            assert rng.tolist() == want_range
            assert copy_runs(runs, None)[1].tolist() == want_range  # measured only
            n, rng = copy_runs(runs, out, measure=False)
            assert out[:n].tolist() == want.tolist() and rng.tolist() == list(NO_RANGE)


@given(seed=st.integers(0, 2**32 - 1), sources=st.lists(st.sampled_from(DTYPES), min_size=1, max_size=3),
       dst=st.sampled_from(DTYPES), offset=st.integers(0, 40), scratch=st.integers(1, 70),
       measure=st.booleans())
def test_write_lands_the_values_at_the_offset_compiled_and_fallback(tmp_path_factory, seed, sources, dst, offset,
                                                                    scratch, measure):
    runs, expected = _case(seed, sources)
    want, want_range = _reference(expected, dst)
    path = tmp_path_factory.mktemp("runs") / "out.bin"
    at = offset * dst.itemsize
    with pytest.MonkeyPatch.context() as mp:
        for hide in (False, True):
            if hide:
                _hidden(mp)
            path.write_bytes(b"\xee" * at)
            fd = os.open(path, os.O_WRONLY)
            try:
                buf = np.zeros(max(scratch, dst.itemsize), np.uint8)  # the cut of the writes: any size of a value up
                n, rng = write_runs(runs, Sink(fd, at, dst), buf, measure)
            finally:
                os.close(fd)
            assert n == len(want) and path.read_bytes() == b"\xee" * at + want.tobytes()
            assert rng.tolist() == (want_range if measure else list(NO_RANGE))


def test_a_uint64_above_the_int64_maximum_is_flagged():
    big = np.array([5, 2**64 - 1, 2**63], dtype=np.uint64)
    runs = Runs((big.view(np.uint8),), (big.dtype,), None, np.zeros(1, np.int64), np.array([3]))
    assert copy_runs(runs, None)[1].tolist() == [5, 2**63 - 1, 1]


def test_bad_runs_are_refused(tmp_path):
    a = np.arange(4, dtype=np.int32)
    runs = Runs((a.view(np.uint8),), (a.dtype,), np.array([1]), np.array([0]), np.array([2]))
    with pytest.raises(ValueError, match="piece out of range"):
        copy_runs(runs, np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="no integer dtype"):
        copy_runs(runs._replace(dtypes=(np.dtype(np.float32),), piece=None), np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="out is not"):
        copy_runs(runs._replace(piece=None), np.zeros(1, np.int32))
    with pytest.raises(ValueError, match="differ in length"):
        copy_runs(runs._replace(piece=np.array([0, 0])), np.zeros(2, np.int32))
    fd = os.open(tmp_path / "x", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(ValueError, match="too small"):
            write_runs(runs._replace(piece=None), Sink(fd, 0, np.dtype(np.int32)), np.zeros(3, np.uint8))
    finally:
        os.close(fd)


@pytest.mark.parametrize("hide", [False, True])
def test_a_failed_write_is_an_os_error(tmp_path, monkeypatch, hide):
    if hide:
        _hidden(monkeypatch)
    a = np.arange(4, dtype=np.int32)
    runs = Runs((a.view(np.uint8),), (a.dtype,), None, np.array([0]), np.array([4]))
    (tmp_path / "x").write_bytes(b"")
    fd = os.open(tmp_path / "x", os.O_RDONLY)  # not open for writing: EBADF
    try:
        with pytest.raises(OSError):
            write_runs(runs, Sink(fd, 0, np.dtype(np.int32)), np.zeros(8, np.uint8))
    finally:
        os.close(fd)


def test_type_codes():
    assert [type_code(d) for d in DTYPES] == [1, 2, 4, 8, -1, -2, -4, -8]
